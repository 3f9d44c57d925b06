"""One supplier call: at most two HTTP attempts under the request's deadline.

The rooms of a supplier call: this module's ``SupplierClient`` runs the attempt
loop (``_ask``: the retry decision, ``_plan_retry``; one attempt's waits for a
turn, a token and a slot, ``_attempt``); ``hedging.py`` decides and runs a
hedged race; ``wire.py`` sends one attempt and classifies its answer (the only
place that catches aiohttp errors); ``calls.py`` holds each supplier's state
and what its attempts teach; ``batch_calls.py`` asks a batch supplier for many
lines in one call. Each attempt ends in one of three ways, and the loop reads
only that:

    quote                     done
    failure, retryable        503, or one of TRANSIENT_ERRORS: try once more,
                              if ``_plan_retry`` finds it worth sending (the
                              supplier's Retry-After, the time left, the
                              supplier's retry budget: see ``retry.py``);
                              a 401 of a supplier with an OAuth2 client: once
                              more with a fresh token, on the same terms
    failure, final            any other status, invalid data: stop
    not sent                  no slot came while it could still finish
                              (``slots.py``), no OAuth2 token came
                              (``tokens.py``: ``auth_failed``), or the supplier
                              is paused after its 429 (``pauses.py``:
                              ``rate_limited``): answer now

Any other exception is a bug in QuoteFlow and propagates untouched.

The deadline itself is enforced by the caller (``service.py``) *around* this
loop, which is why nothing here catches a bare ``TimeoutError``: the deadline's
cancellation must reach the caller, never be mistaken for a socket timeout.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from typing import Protocol

import aiohttp
import attrs
from aiohttp import hdrs
from yarl import URL

from quoteflow.batch_calls import ask_batch, chunks
from quoteflow.calls import (
    NO_SLOT_IN_TIME,
    NO_TOKEN,
    NO_TURN,
    PAUSED,
    Answer,
    AttemptResult,
    Call,
    SupplierState,
    record,
    session_timeout,
)
from quoteflow.catalogue import Catalogue, Supplier
from quoteflow.config import Settings
from quoteflow.hedging import Hedging, Race
from quoteflow.models import (
    OK,
    STOPPED_ATTEMPTS_EXHAUSTED,
    STOPPED_NO_TIME,
    STOPPED_NOT_RETRYABLE,
    STOPPED_RETRY_AFTER,
    STOPPED_RETRY_BUDGET,
    STOPPED_SUCCESS,
    Asked,
    CartLine,
    Failure,
    MovingDeadline,
    QuoteRequest,
    SupplierQuote,
    SupplierTrace,
)
from quoteflow.pauses import Pauses
from quoteflow.rates import LocalRates, RateMeter, Turns
from quoteflow.retry import (
    HedgeBudget,
    HedgeLimiter,
    RetryBudget,
    RetryLimiter,
)
from quoteflow.slots import OutboundLimiter, OutboundSlots
from quoteflow.tokens import TokenKeeper
from quoteflow.waits import token, turn
from quoteflow.wire import Wire

log = logging.getLogger("quoteflow")

__all__ = ["AttemptListener", "SupplierClient", "session_timeout"]


class AttemptListener(Protocol):
    """Told of each attempt as it is about to be sent (tracing: ``spans.Tracing``)."""

    def sending(self, attempt: int, url: URL, headers: dict[str, str], method: str) -> None:
        """Attempt number ``attempt`` goes to ``url``; ``headers`` may gain headers of its own.

        ``url`` is the one that may be shown: each secret of the catalogue's in it is ``***``.
        """
        ...


class SupplierClient:
    """Asks suppliers for quotes through one shared session and outbound limit.

    Each supplier may hold at most its share of the outbound slots, so one
    that hangs can never take the capacity the healthy ones need.

    ``slots`` and ``retry_budgets`` (one per supplier) are injected by the
    composition root: in-memory for one process, Redis-backed in fleet mode.
    Left out, they are this process's own ``OutboundSlots`` and ``RetryBudget`` objects.
    ``attempts`` is told of every attempt before it is sent (tracing), if given.
    """

    def __init__(
        self,
        session: aiohttp.ClientSession,
        settings: Settings,
        catalogue: Catalogue,
        *,
        slots: OutboundLimiter | None = None,
        retry_budgets: Mapping[str, RetryLimiter] | None = None,
        hedge_budgets: Mapping[str, HedgeLimiter] | None = None,
        attempts: AttemptListener | None = None,
        keep_cache_control: bool = False,
        pauses: Pauses | None = None,
        rates: RateMeter | None = None,
    ) -> None:
        self._session = session
        self.pauses = pauses or Pauses(settings.pause_max)
        """Suppliers paused after a 429 with ``Retry-After`` (shared by the fleet's workers)."""
        self._turns = Turns(rates or LocalRates())
        """Each supplier's outbound rate (``rates.py``): this process's, or the fleet's."""
        self._turn_slack = 0.0 if rates is None else settings.redis_timeout
        """Time a turn must leave beyond the attempt's own: in the fleet, a sync's, to lease
        a slot. A turn won with only the attempt's time left found the supplier's slots
        lapsed after the wait, and was spent for nothing."""
        self.token_fetches = {}
        self._retired: set[TokenKeeper] = set()
        """Keepers a reload replaced: a fetch of theirs may still run until shutdown."""
        self._listener = attempts
        self._settings = settings
        if slots is None:
            slots = OutboundSlots.of(settings, catalogue.shares())
        self._slots = slots
        self._wire = Wire(
            session,
            self.pauses,
            max_body=settings.max_supplier_body_bytes,
            keep_cache_control=keep_cache_control,
        )
        self._hedging = Hedging(slots, self._turns, self.pauses)
        self._suppliers: dict[str, SupplierState] = {}
        self.use(catalogue, retry_budgets, hedge_budgets)
        self._attempts = settings.attempts
        self._backoff = (settings.backoff_min, settings.backoff_max)
        self._retry_after_cap = settings.retry_after_cap

    token_fetches: dict[tuple[str, str], int]
    """Token requests by supplier and outcome (``tokens.OK``...), for ``/metrics``."""

    def use(
        self,
        catalogue: Catalogue,
        retry_budgets: Mapping[str, RetryLimiter] | None = None,
        hedge_budgets: Mapping[str, HedgeLimiter] | None = None,
    ) -> None:
        """Ask ``catalogue``'s suppliers from now on (a reload); calls in flight keep theirs.

        A supplier that stays keeps its retry budget (unless ``retry_budgets``
        brings one, or its capacity changed), its hedge budget (likewise, with
        ``hedge_budgets`` and its ``burst``) and its learned attempt times.
        One that is gone stays reachable under its old entry until ``forget``:
        a request that started before the reload may still ask it.
        """
        settings = self._settings
        states = dict(self._suppliers)
        for supplier in catalogue.suppliers:
            old = states.get(supplier.name)
            if retry_budgets is not None:
                budget = retry_budgets[supplier.name]
            elif (
                old is not None and old.spec.retry_budget_capacity == supplier.retry_budget_capacity
            ):
                budget = old.retry_budget
            else:
                budget = RetryBudget(supplier.retry_budget_capacity, settings.retry_budget_earn)
            attempt_time = None if old is None else old.attempt_time
            answer_times = None if old is None else old.answer_times
            state = states[supplier.name] = SupplierState(
                supplier, settings, budget, attempt_time, answer_times
            )
            state.tokens = self._keeper(supplier, old)
            state.hedge_budget = _hedge_budget(state, old, hedge_budgets)
        self._suppliers = states  # swapped whole: no request sees half of it
        self._turns.keep_only(set(catalogue.names))

    def _keeper(self, supplier: Supplier, old: SupplierState | None) -> TokenKeeper | None:
        """The supplier's token keeper: the old one if its OAuth2 client is unchanged."""
        kept = None if old is None else old.tokens
        if kept is not None and supplier.oauth2 == kept.client:
            return kept
        if kept is not None:
            kept.retire()  # new credentials: the old token is never sent again
            self._keep_retired(kept)
        if supplier.oauth2 is None:
            return None
        keeper = TokenKeeper(self._session, supplier.oauth2, supplier.name, self._token_fetched)
        keeper.start()
        return keeper

    def _keep_retired(self, keeper: TokenKeeper) -> None:
        """Hold on to a retired keeper only while a fetch of its own may still run."""
        self._retired = {old for old in self._retired if old.fetching}
        self._retired.add(keeper)

    def _token_fetched(self, supplier: str, outcome: str) -> None:
        key = (supplier, outcome)
        self.token_fetches[key] = self.token_fetches.get(key, 0) + 1

    async def close(self) -> None:
        """At shutdown, before the session closes: no token fetch outlives it."""
        keepers = {state.tokens for state in self._suppliers.values()} | self._retired
        for keeper in keepers:
            if keeper is not None:
                await keeper.close()

    def forget(self, suppliers: tuple[str, ...]) -> None:
        """Drop suppliers an old catalogue named, once no request can still ask them."""
        for name in suppliers:
            state = self._suppliers.get(name)
            if state is not None and state.tokens is not None:
                state.tokens.retire()
                self._keep_retired(state.tokens)
        self._suppliers = {
            name: state for name, state in self._suppliers.items() if name not in suppliers
        }

    @property
    def in_flight(self) -> int:
        """Attempts holding an outbound slot right now."""
        return self._slots.in_use

    def priced_per_quantity(self, supplier: str) -> bool:
        """Whether ``supplier``'s quote depends on the quantity asked.

        It does when its request carries ``{quantity}`` or its adapter reads
        what was asked: its quotes are then shared and cached per quantity.
        """
        state = self._suppliers.get(supplier)
        return state is not None and state.per_quantity

    def retry_tokens(self, supplier: str) -> float:
        """Retries ``supplier`` may still spend now."""
        return self._suppliers[supplier].retry_budget.tokens

    def hedge_tokens(self, supplier: str) -> float | None:
        """Hedges this process holds for ``supplier`` (in the fleet, its pool); None: unhedged."""
        state = self._suppliers.get(supplier)
        budget = None if state is None else state.hedge_budget
        return None if budget is None else budget.held

    async def quote(
        self,
        trace: SupplierTrace,
        request: QuoteRequest,
        request_id: str,
        deadline: float | MovingDeadline,
    ) -> SupplierQuote | Failure:
        """Ask ``trace.supplier`` for ``request``; the caller enforces ``deadline``.

        A ``MovingDeadline`` (a shared call's) is read afresh for each
        attempt's ``X-Deadline-Remaining-Ms`` and each retry decision.
        """
        state = self._suppliers[trace.supplier]
        if state.spec.batch is not None:
            # A batch supplier takes a single quote as a batch of one line.
            line = CartLine(request.sku, request.quantity)
            answered = await ask_batch(
                self._ask, state, trace, (line,), request, request_id, deadline
            )
            return answered[request.sku]
        asked = None
        if state.asks_adapter:
            asked = Asked(trace.supplier, request.sku, request.quantity, request.scenario)
        shaped = None if state.shape is None else state.shaped(request, request_id)
        url = state.url_for(request) if shaped is None else shaped.url
        call = Call(url, request, request_id, deadline, state.attempt_time, shaped, asked)
        result = await self._ask(state, call, trace)
        return result.quote if result.quote is not None else Failure(trace.supplier, result.code)

    def chunks(self, supplier: str, lines: tuple[CartLine, ...]) -> list[tuple[CartLine, ...]]:
        """A cart's ``lines`` as the calls a batch supplier is asked in; empty for any other."""
        return chunks(self._suppliers[supplier].spec, lines)

    async def batch(
        self,
        trace: SupplierTrace,
        lines: tuple[CartLine, ...],
        scenario: str,
        request_id: str,
        deadline: float,
    ) -> dict[str, SupplierQuote | Failure]:
        """Ask a batch supplier for ``lines`` in one call (``batch_calls.py``)."""
        state = self._suppliers[trace.supplier]
        first = lines[0]
        request = QuoteRequest(sku=first.sku, quantity=first.quantity, scenario=scenario)
        return await ask_batch(self._ask, state, trace, lines, request, request_id, deadline)

    async def _ask(self, state: SupplierState, call: Call, trace: SupplierTrace) -> AttemptResult:
        """The attempt loop: at most two attempts under the deadline; the last result stands."""
        state.retry_budget.first_attempt()
        result: AttemptResult | None = None
        for attempt in range(1, self._attempts + 1):
            if attempt == 1 and state.hedge is not None and not trace.probe:
                # Maybe with attempt 2 beside it (``hedging.py``).
                tried = await self._hedging.race(state, call, trace, self._attempt)
            else:
                tried = await self._attempt(
                    state, call, trace, attempt
                )  # slot taken and given back
            if tried.not_sent is not None:
                # Not sent (no slot came in time, no token, the supplier paused):
                # answer now. A retry that gave its place up keeps the code the
                # first attempt got; the others have a code of their own.
                trace.stopped = tried.not_sent
                if result is None or tried is not NO_SLOT_IN_TIME:
                    result = tried
                break
            result = tried
            if result.code == OK:
                if attempt > 1:
                    state.retry_budget.paid_off()
                trace.stopped = STOPPED_SUCCESS
                return result
            if trace.hedged:  # both attempts were out at once; the later failure stands
                trace.stopped = STOPPED_ATTEMPTS_EXHAUSTED
                break
            if not result.retryable:
                trace.stopped = STOPPED_NOT_RETRYABLE
                break
            if attempt == self._attempts:
                trace.stopped = STOPPED_ATTEMPTS_EXHAUSTED
                break
            backoff, refusal = self._plan_retry(state, result, call.deadline)
            if refusal is not None:
                trace.stopped = refusal  # answer now: waiting could not bring a quote
                break
            # Back off outside the slot, so a failing supplier does not hold
            # capacity a healthy one could use; the caller's deadline still runs.
            trace.attempts[-1] = attrs.evolve(trace.attempts[-1], backoff=backoff)
            await asyncio.sleep(backoff)
        assert result is not None
        return result

    def _plan_retry(
        self, state: SupplierState, failed: AttemptResult, deadline: float | MovingDeadline
    ) -> tuple[float, str | None]:
        """The backoff before a second attempt, or why there will be none."""
        # A refused token is put right by a fresh one, not by waiting: its
        # fetch (``tokens.py``, one for every request that needs it) is the wait.
        backoff = 0.0 if failed.fresh_token else random.uniform(*self._backoff)
        if failed.retry_after is not None:
            if failed.retry_after > self._retry_after_cap:
                return backoff, STOPPED_RETRY_AFTER
            backoff = max(backoff, failed.retry_after)
        remaining = deadline - time.monotonic()
        if remaining < backoff + state.attempt_time.answer_time:
            asked_to_wait = failed.retry_after is not None and failed.retry_after > 0
            return backoff, (STOPPED_RETRY_AFTER if asked_to_wait else STOPPED_NO_TIME)
        if not state.retry_budget.try_spend():
            return backoff, STOPPED_RETRY_BUDGET
        return backoff, None

    async def _attempt(
        self,
        state: SupplierState,
        call: Call,
        trace: SupplierTrace,
        attempt: int,
        race: Race | None = None,
        *,
        hedge: bool = False,
    ) -> AttemptResult:
        """One attempt: wait for a slot, fetch, give the slot back, then decode.

        In a hedged race (``race``) a hedge (``hedge``) comes with its slot
        and turn already taken by ``hedging.Hedging.refusal``.
        """
        waiting_since = time.monotonic()
        if hedge:
            # Its slot and its turn were taken by ``hedging.Hedging.refusal``: a hedge never waits.
            authorization = None if state.tokens is None else state.tokens.current()
        else:
            # Wait for a slot only while the attempt could still finish: the time
            # this supplier has been seen to need must be left when it starts. With
            # no answer seen yet nothing is known, so it waits until the first
            # answers say otherwise (``Call.left``); the half-open probe always
            # waits, the only way a supplier's circuit closes again. A
            # wait the deadline (or the caller leaving) cancels never reached the
            # supplier: it is not an attempt, and goes on no bill.
            patience = None if trace.probe else call
            pauses = self.pauses
            # ``pauses.active`` is empty unless some supplier said 429 lately: no call then.
            if pauses.active and pauses.until(trace.supplier) is not None:
                return PAUSED
            rate = state.spec.rate
            if rate is not None:
                if not await turn(self._turns, self._turn_slack, call, trace, rate):
                    return NO_TURN
                if call.lines and state.item_rate:
                    # A rate that counts parts: one turn per line of the call (the
                    # first is had). Turns had before one that does not come are
                    # spent: the supplier is sent less than the rate, never more.
                    for _ in range(len(call.lines) - 1):
                        if not await turn(self._turns, self._turn_slack, call, trace, rate):
                            return NO_TURN
            authorization = None
            if state.tokens is not None:
                # Before the slot: a wait for the token holds none of the outbound capacity.
                authorization = state.tokens.current()
                if authorization is None:
                    authorization = await token(state.tokens, trace)
                    if authorization is None:
                        return NO_TOKEN
            # One wait for both the shared slot and room in the supplier's share; a
            # cart's call waits in the carts' part (``slots.CartPart``).
            if not (
                await self._slots.acquire(trace.supplier, patience)
                if not trace.lines
                else await self._slots.acquire(trace.supplier, patience, later=True)
            ):
                trace.gave_up_after = time.monotonic() - waiting_since
                return NO_SLOT_IN_TIME
            if pauses.active and pauses.until(trace.supplier) is not None:
                # Paused while this attempt waited: the wave that got the 429 was enough.
                self._slots.release(trace.supplier, later=bool(trace.lines))
                return PAUSED
        try:
            started = time.monotonic()
            if race is not None and attempt == 1:
                race.sent_at = started
                race.sent.set()
            headers = {
                "X-Request-ID": call.request_id,
                "X-Attempt": str(attempt),
                # Measured once the slot is ours: the wait is not the supplier's time.
                "X-Deadline-Remaining-Ms": str(max(0, int((call.deadline - started) * 1000))),
            }
            shaped = call.shaped
            if shaped is not None:
                headers.update(shaped.headers)  # the catalogue's (never QuoteFlow's own)
            elif state.headers:
                headers.update(state.headers)
            if authorization is not None:
                headers[hdrs.AUTHORIZATION] = authorization
            if self._listener is not None:  # e.g. traceparent
                if shaped is None:
                    self._listener.sending(attempt, call.url, headers, "GET")
                else:
                    self._listener.sending(attempt, shaped.shown_url, headers, state.shape_method)
            fetched = await self._wire.fetch(state, call, headers, authorization)
            ended = time.monotonic()
            # Before the slot is handed on: the next waiter is judged by what this taught.
            state.learn(call, fetched, ended - started, self._slots)
        except asyncio.CancelledError:
            if race is not None and attempt in race.lost:
                # The other attempt won: not the supplier's failure, not its slowness
                # to the slot rule; at least this long for the hedge's percentile.
                state.lost(trace, attempt, waiting_since, started, hedge)
                raise
            # Before the slot is handed on: the next waiter is judged by what this taught.
            state.cut(call, trace, attempt, waiting_since, started, self._slots, hedge)
            raise
        finally:
            if not trace.lines:
                self._slots.release(trace.supplier)
            else:  # a cart's slot, back to the carts' part
                self._slots.release(trace.supplier, later=True)
        if isinstance(fetched, bytes):
            fetched = self._wire.decode(state, fetched, trace.supplier, call)
        elif isinstance(fetched, Answer):
            fetched = self._wire.decode(
                state, fetched.body, trace.supplier, call, fetched.cache_control
            )
        outcome = fetched.code
        if outcome == OK and state.hedge_budget is not None:
            state.hedge_budget.earned()  # a success pays for a share of a hedge (hedging.py)
        trace.attempts.append(
            record(
                attempt,
                waiting_since,
                started,
                ended,
                outcome,
                fetched.status,
                hedge=hedge,
                problem=fetched.problem,
            )
        )
        return fetched


def _hedge_budget(
    state: SupplierState, old: SupplierState | None, given: Mapping[str, HedgeLimiter] | None
) -> HedgeLimiter | None:
    """A hedged supplier's hedge tokens: the fleet's, else its old bucket if ``burst`` stays."""
    hedge = state.hedge
    if hedge is None:
        return None
    if given is not None and state.spec.name in given:
        return given[state.spec.name]
    kept = None if old is None else old.hedge_budget
    if isinstance(kept, HedgeBudget) and kept.capacity == hedge.burst:
        kept.earn = hedge.earn
        return kept
    return HedgeBudget(hedge.burst, hedge.earn)
