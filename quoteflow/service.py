"""Admission, the request deadline, the fan-out to every supplier, and the ranking.

No aiohttp here: suppliers are reached through ``SupplierGateway``, so this
module reads as the policy it is. The budget bill of one request:

    admitted ──┬── atlas:  [slot wait, attempt] ─────────────────────── quote
               ├── boreal: [slot wait, attempt 1] backoff [slot wait, attempt 2]
               └── cedar:  [slot wait, attempt] ─────────────────────── quote
               └──────────────── one deadline: admitted + budget ────────┘

Everything a supplier does — waiting for an outbound slot, both attempts and
the backoff between them — runs under that single deadline. Whatever has
finished when it comes is kept; every supplier still working is ``timeout``.

Before the fan-out each supplier's circuit breaker (``breaker.py``) is asked;
a supplier whose circuit is open is not called at all (``circuit_open``), and
every call's outcome is reported back to its breaker afterwards. With the
quote cache on, a stale quote may then stand in for a failure (``cache.py``).

Which suppliers are asked, and their breakers, come from the catalogue as a
``Lineup`` handed in by the app. A reload hands in a new one (``use``); each
request reads it once when it starts and keeps it to the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Final, Protocol

import attrs

from quoteflow.basket import Line, solve
from quoteflow.breaker import Breakers, Permit, Verdict, verdict, worst
from quoteflow.errors import CapacityExhausted
from quoteflow.models import (
    AUTH_FAILED,
    CIRCUIT_OPEN,
    STOPPED_CIRCUIT_OPEN,
    STOPPED_DEADLINE,
    STOPPED_NO_TOKEN,
    TIMEOUT,
    Basket,
    CartLine,
    CartReport,
    CartRequest,
    CartResult,
    Failure,
    QuoteReport,
    QuoteRequest,
    QuoteResult,
    RankedQuote,
    SupplierQuote,
    SupplierTrace,
)
from quoteflow.money import DEFAULT_CURRENCY
from quoteflow.offers import Pricing


class SupplierGateway(Protocol):
    """How the service asks one supplier; ``supplier.SupplierClient`` is the real one."""

    async def quote(
        self,
        trace: SupplierTrace,
        request: QuoteRequest,
        request_id: str,
        deadline: float,
    ) -> SupplierQuote | Failure:
        """Ask ``trace.supplier``, recording each attempt in ``trace``.

        ``deadline`` is a ``time.monotonic()`` value; the caller enforces it.
        """
        ...


class BatchGateway(Protocol):
    """How the service asks batch suppliers for many lines per call (``SupplierClient``)."""

    def chunks(self, supplier: str, lines: tuple[CartLine, ...]) -> list[tuple[CartLine, ...]]:
        """``lines`` as the calls ``supplier`` is asked in; empty: it takes no batch.

        A supplier that takes no batch is asked each line as a single quote.
        """
        ...

    async def batch(
        self,
        trace: SupplierTrace,
        lines: tuple[CartLine, ...],
        scenario: str,
        request_id: str,
        deadline: float,
    ) -> dict[str, SupplierQuote | Failure]:
        """Ask ``trace.supplier`` for ``lines`` in one call: an outcome for every line's SKU."""
        ...


class Solver(Protocol):
    """The basket: the cheapest split of a cart's quoted lines (``basket.solve``)."""

    def __call__(
        self, lines: tuple[QuoteResult, ...], suppliers: tuple[str, ...], time_limit: float
    ) -> Basket:
        """The cheapest basket, proven optimal unless ``time_limit`` seconds run out first."""
        ...


class StaleQuotes(Protocol):
    """Quotes that may stand in for a failing supplier; ``cache.QuoteCache`` is the real one."""

    def cover(
        self,
        request: QuoteRequest,
        traces: tuple[SupplierTrace, ...],
        outcomes: dict[str, SupplierQuote | Failure],
    ) -> None:
        """Replace each failure in ``outcomes`` that a stale quote may stand in for.

        A supplier missing from ``outcomes`` timed out. Called once the
        breakers have judged the real outcomes.
        """
        ...


@attrs.frozen
class Lineup:
    """The suppliers one catalogue names, in the order failures are listed, and their breakers."""

    suppliers: tuple[str, ...]
    breakers: Breakers | None = None
    """None: every supplier is asked on every request (no supplier has a breaker)."""
    currencies: dict[str, str] = attrs.Factory(dict)
    """Each supplier's own currency (its catalogue ``currency``), for quotes naming none;
    a supplier not listed quotes in the service's ``--currency``."""


class QuoteService:
    """One per process: every request shares its admission counter and gateway."""

    def __init__(
        self,
        gateway: SupplierGateway,
        lineup: Lineup,
        *,
        budget: float,
        inbound_limit: int,
        answer_reserve: float = 0.0,
        stale_quotes: StaleQuotes | None = None,
        circuit_open: Callable[[str], None] | None = None,
        carts: CartSettings | None = None,
        pricing: Pricing | None = None,
    ) -> None:
        self._gateway = gateway
        self.lineup = lineup
        """Who is asked; replaced whole by ``use``, read once by each request."""
        self._stale_quotes = stale_quotes
        """None: a failure is always the answer (the quote cache is off)."""
        self._circuit_open = circuit_open
        """Told of each supplier not asked because its circuit is open (tracing)."""
        self._budget = budget
        self._inbound_limit = inbound_limit
        self._answer_reserve = answer_reserve
        self.in_flight = 0
        """Requests admitted and not yet answered."""
        self._carts = carts
        """None: carts are not served (a service built for single quotes only)."""
        self.carts_in_flight = 0
        """Carts admitted and not yet answered: seats of their own, apart from ``in_flight``."""
        if pricing is None:
            pricing = Pricing(DEFAULT_CURRENCY, {})
        self._pricing = attrs.evolve(pricing, native=dict(lineup.currencies))
        """How quotes are priced in the default currency; replaced with the lineup."""

    @property
    def currency(self) -> str:
        """The answers' currency when a request names none (``--currency``)."""
        return self._pricing.currency

    def use(self, lineup: Lineup) -> None:
        """Ask ``lineup``'s suppliers from the next request on; requests in flight keep theirs."""
        self.lineup = lineup
        self._pricing = attrs.evolve(self._pricing, native=dict(lineup.currencies))

    def answers_in(self, currency: str) -> bool:
        """A request may ask for its answer in ``currency``: the default, or one the rates know."""
        pricing = self._pricing
        return currency == pricing.currency or (
            pricing.rates is not None and pricing.rates.knows(currency)
        )

    def _pricing_for(self, currency: str | None) -> Pricing:
        pricing = self._pricing
        if currency is None or currency == pricing.currency:
            return pricing
        return attrs.evolve(pricing, currency=currency)

    def ensure_capacity(self) -> None:
        """Refuse at once, taking nothing, when every inbound slot is taken."""
        if self.in_flight >= self._inbound_limit:
            raise CapacityExhausted

    @contextlib.contextmanager
    def admitted(self) -> Iterator[float]:
        """Take an inbound slot for the ``with`` block, or refuse at once.

        Yields the admission time, from which the request's deadline runs.
        Raises ``CapacityExhausted`` when every inbound slot is taken.
        """
        # Check and take the slot with no await in between: no other request
        # can slip in, and a refused request never holds one.
        if self.in_flight >= self._inbound_limit:
            raise CapacityExhausted
        self.in_flight += 1
        try:
            yield time.monotonic()
        finally:
            self.in_flight -= 1

    async def quote(
        self,
        request: QuoteRequest,
        request_id: str,
        admitted_at: float,
        caller: str | None = None,
    ) -> QuoteReport:
        """Every supplier's answer to ``request``, within the budget from ``admitted_at``.

        ``caller``: the name of who asked, carried into the bill and the log.
        """
        # The fan-out stops a little before the budget ends, so that ranking,
        # encoding and sending the answer fit inside it too.
        deadline = admitted_at + self._budget - self._answer_reserve
        lineup = self.lineup
        pricing = self._pricing_for(request.currency)
        breakers = lineup.breakers
        traces = tuple(SupplierTrace(supplier) for supplier in lineup.suppliers)
        outcomes: dict[str, SupplierQuote | Failure] = {}
        asked: list[tuple[SupplierTrace, Permit, asyncio.Task[SupplierQuote | Failure]]] = []
        judged = False

        # The deadline wraps each supplier's whole call, never one attempt: a
        # retry cannot win itself a fresh timer, and no inner handler can
        # swallow it. Its timer cancels the supplier tasks itself rather than
        # this task (as asyncio.timeout would, whose task group would then
        # cancel them): one loop turn less between the deadline and the
        # answer, which under load is what makes a cut-off answer late.
        # Times here are time.monotonic(): uvloop's loop.time() only has
        # millisecond steps, too coarse for the bill; the timer is set from it.
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        try:
            try:
                async with asyncio.TaskGroup() as group:
                    for trace in traces:
                        permit = _permit(breakers, trace.supplier)
                        if permit is Permit.REFUSED:
                            # Not asked at all: the answer waits only for the others.
                            trace.stopped = STOPPED_CIRCUIT_OPEN
                            outcomes[trace.supplier] = Failure(trace.supplier, CIRCUIT_OPEN)
                            if self._circuit_open is not None:
                                self._circuit_open(trace.supplier)
                            continue
                        if permit is Permit.PROBE:
                            trace.probe = True
                        gateway_call = self._gateway.quote(trace, request, request_id, deadline)
                        asked.append((trace, permit, group.create_task(gateway_call)))
                    if asked:
                        when = loop.time() + deadline - time.monotonic()
                        timer = loop.call_at(when, _cut_off, asked)
            finally:
                if timer is not None:
                    timer.cancel()
            # A supplier call either finished or was cancelled by the deadline: a
            # bug in one would have left the TaskGroup as an exception, not here.
            for trace, permit, task in asked:
                if task.cancelled():
                    if trace.stopped == STOPPED_NO_TOKEN:
                        # It waited for its OAuth2 token and sent nothing: the
                        # token endpoint's failure, not a supplier's timeout.
                        no_token = Failure(trace.supplier, AUTH_FAILED)
                        outcomes[trace.supplier] = no_token
                        _judge(breakers, trace, permit, no_token)
                        continue
                    trace.stopped = STOPPED_DEADLINE
                    _judge(breakers, trace, permit, None)
                else:
                    outcomes[trace.supplier] = outcome = task.result()
                    _judge(breakers, trace, permit, outcome)
            judged = True
            if self._stale_quotes is not None:
                # After judging: the breaker learns what the supplier did, not what stood in.
                self._stale_quotes.cover(request, traces, outcomes)
        finally:
            if not judged and breakers is not None:
                # The caller left, or a bug: nothing learned, but a probe must
                # not stay taken for good.
                for trace, permit, _ in asked:
                    _judge(breakers, trace, permit, None, Verdict.UNKNOWN)
        elapsed_ms = (time.monotonic() - admitted_at) * 1000
        result = _rank(request, request_id, lineup.suppliers, outcomes, elapsed_ms, pricing)
        return QuoteReport(
            result=result,
            budget=self._budget,
            admitted_at=admitted_at,
            deadline=deadline,
            traces=traces,
            caller=caller,
        )

    # -- carts ---------------------------------------------------------------

    def ensure_cart_capacity(self) -> None:
        """Refuse a cart at once, taking nothing, when every cart seat is taken."""
        assert self._carts is not None
        if self.carts_in_flight >= self._carts.limit:
            raise CapacityExhausted

    @contextlib.contextmanager
    def cart_admitted(self) -> Iterator[float]:
        """Take a cart seat for the ``with`` block, or refuse at once (``CapacityExhausted``)."""
        assert self._carts is not None
        if self.carts_in_flight >= self._carts.limit:
            raise CapacityExhausted
        self.carts_in_flight += 1
        try:
            yield time.monotonic()
        finally:
            self.carts_in_flight -= 1

    async def cart(
        self,
        cart: CartRequest,
        request_id: str,
        admitted_at: float,
        caller: str | None = None,
    ) -> CartReport:
        """Every line's quotes from every supplier, and the cheapest basket, within the cart budget.

        The cart's bill, like a single quote's, under one deadline::

            admitted ─┬─ atlas (batch): [chunk 1: slot, attempt] [chunk 2: slot, attempt]
                      ├─ boreal:        [line 1] [line 2] ... each a single quote's call
                      └─ cedar: ...                               solve ─┐ answer
                      └──── calls end: admitted + cart budget - solve reserve ───┘

        A batch supplier is asked in chunks of its ``max_items``, all at once;
        any other supplier each line as a single quote is. Every call waits for
        its slot behind single quotes' calls (``slots.py``). What has finished
        by the deadline is kept line by line; a line still being asked is
        ``timeout`` for that supplier. Each supplier's breaker is asked once
        per cart and told once, the worst outcome of its calls: one cart
        cannot open a circuit by itself.
        """
        carts = self._carts
        assert carts is not None
        budget = carts.budget
        deadline = admitted_at + budget - self._answer_reserve - carts.solve_reserve
        lineup = self.lineup
        pricing = self._pricing_for(cart.currency)
        breakers = lineup.breakers
        outcomes: dict[tuple[str, str], SupplierQuote | Failure] = {}
        traces: list[SupplierTrace] = []
        asked: list[_CartCall] = []
        permits: dict[str, Permit] = {}
        judged = False
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        try:
            try:
                async with asyncio.TaskGroup() as group:
                    # Every SKU of every line, alternates too: asked as lines of their own.
                    every = cart.asked()
                    for supplier in lineup.suppliers:
                        permit = permits[supplier] = _permit(breakers, supplier)
                        if permit is Permit.REFUSED:
                            for line in every:
                                outcomes[supplier, line.sku] = Failure(supplier, CIRCUIT_OPEN)
                            if self._circuit_open is not None:
                                self._circuit_open(supplier)
                            continue
                        chunks = carts.batches.chunks(supplier, every)
                        calls = chunks or [(line,) for line in every]
                        if permit is Permit.PROBE:
                            # Half-open: one call probes it, as a single quote's
                            # would; the cart's other lines wait for its verdict
                            # no more than other requests do.
                            for line in (line for lines in calls[1:] for line in lines):
                                outcomes[supplier, line.sku] = Failure(supplier, CIRCUIT_OPEN)
                            calls = calls[:1]
                        for lines in calls:
                            trace = SupplierTrace(supplier, lines=tuple(ln.sku for ln in lines))
                            trace.probe = permit is Permit.PROBE
                            traces.append(trace)
                            if chunks:
                                work = carts.batches.batch(
                                    trace, lines, cart.scenario, request_id, deadline
                                )
                            else:
                                work = self._line(trace, cart, lines[0], request_id, deadline)
                            asked.append(_CartCall(trace, lines, group.create_task(work)))
                    if asked:
                        when = loop.time() + deadline - time.monotonic()
                        timer = loop.call_at(when, _cut_off_cart, asked)
            finally:
                if timer is not None:
                    timer.cancel()
            verdicts: dict[str, list[Verdict]] = {}
            for call in asked:
                supplier = call.trace.supplier
                if call.task.cancelled():
                    code = AUTH_FAILED if call.trace.stopped == STOPPED_NO_TOKEN else TIMEOUT
                    if code == TIMEOUT:
                        call.trace.stopped = STOPPED_DEADLINE
                    failure = Failure(supplier, code)
                    for line in call.lines:
                        outcomes[supplier, line.sku] = failure
                    verdicts.setdefault(supplier, []).append(
                        verdict(None if code == TIMEOUT else failure, call.trace.attempts)
                    )
                    continue
                answered = call.task.result()
                for line in call.lines:
                    outcome = answered.get(line.sku, Failure(supplier, TIMEOUT))
                    outcomes[supplier, line.sku] = outcome
                verdicts.setdefault(supplier, []).append(_call_verdict(call, answered))
            if breakers is not None:
                for supplier, seen in verdicts.items():
                    breaker = breakers.get(supplier)
                    if breaker is not None:
                        breaker.record(permits[supplier], worst(seen))
            judged = True
        finally:
            if not judged and breakers is not None:
                for supplier, permit in permits.items():
                    breaker = breakers.get(supplier)
                    if breaker is not None and permit is not Permit.REFUSED:
                        breaker.record(permit, Verdict.UNKNOWN)
        elapsed_ms = (time.monotonic() - admitted_at) * 1000
        ranked = tuple(
            _rank_line(cart, line, request_id, lineup.suppliers, outcomes, elapsed_ms, pricing)
            for line in cart.lines
        )
        solve_started = time.monotonic()
        time_limit = max(0.0, admitted_at + budget - self._answer_reserve - solve_started)
        basket = await carts.solve(ranked, lineup.suppliers, time_limit)
        solved = time.monotonic()
        result = CartResult(
            lines=ranked,
            basket=basket,
            elapsed_ms=(solved - admitted_at) * 1000,
            request_id=request_id,
            currency=pricing.currency,
            asked=cart.lines,
        )
        return CartReport(
            result=result,
            budget=budget,
            admitted_at=admitted_at,
            deadline=deadline,
            traces=tuple(traces),
            suppliers=lineup.suppliers,
            solve_ms=(solved - solve_started) * 1000,
            caller=caller,
        )

    async def _line(
        self,
        trace: SupplierTrace,
        cart: CartRequest,
        line: CartLine,
        request_id: str,
        deadline: float,
    ) -> dict[str, SupplierQuote | Failure]:
        """One line asked of a supplier that takes no batch: a single quote's call."""
        outcome = await self._gateway.quote(trace, cart.line_request(line), request_id, deadline)
        return {line.sku: outcome}


INLINE_SOLVE: Final = 400
"""Offers (lines × suppliers quoting them) up to which the basket is solved on the loop.

Such a solve takes well under a millisecond (``python -m bench.basket``);
a larger one runs in a thread, so single quotes never wait on it."""


async def solve_basket(
    lines: tuple[QuoteResult, ...], suppliers: tuple[str, ...], time_limit: float
) -> Basket:
    """The cheapest basket of the lines' usable quotes, within ``time_limit`` seconds."""
    wanted = tuple(
        Line.of_quotes(line.sku, line.quantity, line.quotes, line.alternates) for line in lines
    )
    offers = sum(len(line.offers) for line in wanted)
    if offers <= INLINE_SOLVE:
        return solve(wanted, suppliers, time_limit=time_limit)
    return await asyncio.to_thread(solve, wanted, suppliers, time_limit=time_limit)


@attrs.frozen(kw_only=True)
class CartSettings:
    """What the service needs to serve carts."""

    budget: float
    limit: int
    batches: BatchGateway
    solve: Callable[[tuple[QuoteResult, ...], tuple[str, ...], float], Awaitable[Basket]] = (
        solve_basket
    )
    """The basket for the lines' quotes, the supplier order and the seconds it may take."""
    solve_reserve: float = 0.05
    """Seconds of the cart budget kept for the basket: supplier calls end that much earlier."""


@attrs.frozen
class _CartCall:
    trace: SupplierTrace
    lines: tuple[CartLine, ...]
    task: asyncio.Task[dict[str, SupplierQuote | Failure]]


def _call_verdict(call: _CartCall, result: dict[str, SupplierQuote | Failure]) -> Verdict:
    """What one of a cart's calls says of its supplier: a quote for any line is an answer."""
    quoted = next((out for out in result.values() if isinstance(out, SupplierQuote)), None)
    return verdict(quoted or result.get(call.lines[0].sku), call.trace.attempts)


def _cut_off_cart(asked: list[_CartCall]) -> None:
    """The cart's deadline: every supplier call still running ends now, as ``timeout``."""
    for call in asked:
        if not call.task.cancelling():
            call.task.cancel()


def _rank_line(
    cart: CartRequest,
    line: CartLine,
    request_id: str,
    suppliers: tuple[str, ...],
    outcomes: dict[tuple[str, str], SupplierQuote | Failure],
    elapsed_ms: float,
    pricing: Pricing,
) -> QuoteResult:
    """One line ranked as a single quote is; with alternates, over all its SKUs.

    A line with alternates has one list of quotes, cheapest first, its own
    SKU before an alternate at the same total, then the supplier's name; its
    failures go SKU by SKU, each naming its SKU.
    """
    ranked = []
    for sku in line.skus:
        line_outcomes: dict[str, SupplierQuote | Failure] = {}
        for supplier in suppliers:
            outcome = outcomes.get((supplier, sku))
            if outcome is not None:
                line_outcomes[supplier] = outcome
        request = QuoteRequest(sku=sku, quantity=line.quantity, scenario=cart.scenario)
        ranked.append(_rank(request, request_id, suppliers, line_outcomes, elapsed_ms, pricing))
    if not line.alternates:
        return ranked[0]
    rank = {sku: at for at, sku in enumerate(line.skus)}
    quotes = sorted(
        (quote for result in ranked for quote in result.quotes),
        key=lambda quote: (quote.total_cents, rank.get(quote.sku, len(rank)), quote.supplier),
    )
    failures = tuple(
        attrs.evolve(failure, sku=result.sku) for result in ranked for failure in result.failures
    )
    return attrs.evolve(
        ranked[0], quotes=tuple(quotes), failures=failures, alternates=line.alternates
    )


def _cut_off(
    asked: list[tuple[SupplierTrace, Permit, asyncio.Task[SupplierQuote | Failure]]],
) -> None:
    """The deadline: every supplier call still running ends now, as ``timeout``."""
    for _, _, task in asked:
        # One already cancelled (its task group aborting: the caller left) is
        # ending already; a second cancellation would only cut its wind-up.
        if not task.cancelling():
            task.cancel()  # one already done ignores it


def _permit(breakers: Breakers | None, supplier: str) -> Permit:
    if breakers is None:
        return Permit.CALL
    breaker = breakers.get(supplier)
    return Permit.CALL if breaker is None else breaker.permit()


def _judge(
    breakers: Breakers | None,
    trace: SupplierTrace,
    permit: Permit,
    outcome: SupplierQuote | Failure | None,
    judged: Verdict | None = None,
) -> None:
    if breakers is not None:
        breaker = breakers.get(trace.supplier)
        if breaker is not None:
            judged = verdict(outcome, trace.attempts) if judged is None else judged
            breaker.record(permit, judged)


def _rank(
    request: QuoteRequest,
    request_id: str,
    suppliers: tuple[str, ...],
    outcomes: dict[str, SupplierQuote | Failure],
    elapsed_ms: float,
    pricing: Pricing,
) -> QuoteResult:
    """Usable quotes cheapest first, in the answer's currency; a failure for each other one."""
    quotes: list[RankedQuote] = []
    failures: list[Failure] = []
    need = request.quantity
    for supplier in suppliers:
        outcome = outcomes.get(supplier)
        if isinstance(outcome, SupplierQuote):
            priced = pricing.price(outcome, need)
            # No legal buy (too little stock) is a valid answer, not a failure: left out.
            if isinstance(priced, RankedQuote):
                quotes.append(priced)
            elif priced is not None:
                failures.append(priced)  # no_rate, or an amount past 2**53 - 1
        else:
            failures.append(outcome or Failure(supplier, TIMEOUT))
    quotes.sort(key=lambda quote: (quote.total_cents, quote.supplier))
    return QuoteResult(
        sku=request.sku,
        quantity=request.quantity,
        quotes=tuple(quotes),
        failures=tuple(failures),
        elapsed_ms=elapsed_ms,
        request_id=request_id,
        currency=pricing.currency,
    )
