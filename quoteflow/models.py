"""QuoteFlow's data: plain frozen attrs classes whose validators hold the invariants.

Parsing and serialising live in ``codec.py``; nothing here knows about JSON.
"""

from __future__ import annotations

import attrs
from attrs import validators as v

from quoteflow.config import SCENARIOS

INVALID_DATA = "invalid_data"
"""The supplier answered 200, but not with a valid quote for this supplier and SKU."""
TRANSPORT_ERROR = "transport_error"
"""The connection failed, broke or stalled before a full answer arrived."""
TIMEOUT = "timeout"
"""The request's deadline came before the supplier gave a final answer."""
CIRCUIT_OPEN = "circuit_open"
"""The supplier kept failing: its circuit is open and it was not asked (``breaker.py``)."""
RATE_LIMITED = "rate_limited"
"""The supplier was not asked: it answered a 429 with ``Retry-After`` lately, and that
time is not over (``pauses.py``). Never retried, never counted by its breaker."""
NOT_FOUND = "not_found"
"""A batch supplier answered the call, and said it has no such SKU (a cart's line, or a
single quote asked of a batch supplier). Never retried, never counted by its breaker;
a classic supplier's 404 stays ``http_404``."""
NO_RATE = "no_rate"
"""The supplier answered with a quote in a currency that no fresh exchange rate converts
to the answer's (``fx.py``): never compared in the wrong currency, never retried, never
counted by its breaker."""
AUTH_FAILED = "auth_failed"
"""No OAuth2 token for the supplier in time: its token endpoint is down, slow or refuses
QuoteFlow's credentials (``tokens.py``). Not the supplier's failure, never retried."""


def http_failure_code(status: int) -> str:
    """The failure code of a non-200 answer, e.g. ``http_503``."""
    return f"http_{status}"


# One validator function per field, each a single test on the happy path: a
# list of attrs' small validators costs a call per check, and a SupplierQuote
# is built for every supplier answer.


def _refuse_int(attribute: attrs.Attribute[int], value: object, low: int, high: int) -> None:
    # attrs' instance_of(int) accepts True and False; money and stock never are.
    if type(value) is not int:
        raise TypeError(f"{attribute.name} must be an int, got {type(value).__name__}")
    raise ValueError(f"{attribute.name} must be from {low} to {high}, got {value}")


MAX_SKU_LENGTH = 64
MAX_QUANTITY = 100
"""The bounds of a request; ``codec`` checks the same ones to name each field's error."""
MAX_LINE_QUANTITY = 100_000
"""The largest quantity of a cart's line (a bill of materials asks for thousands). A
line is asked of suppliers as a ``QuoteRequest``, so that is the model's bound; the
single quote's own, ``MAX_QUANTITY``, is checked where its body is decoded."""

MAX_SUPPLIED_NUMBER = 2**53 - 1
"""The largest price or stock a supplier may send: RFC 8259's interoperable
integer range, so every caller's JSON reader keeps our figures exact. It also
keeps a single quote's ``total_cents`` (at most 100 units) well inside 64 bits;
a cart's line, up to 100,000 units, is priced only while its total stays in
that range (``service.py``)."""


def _count(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or not 0 <= value <= MAX_SUPPLIED_NUMBER:
        _refuse_int(attribute, value, 0, MAX_SUPPLIED_NUMBER)


def _quantity(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if type(value) is not int or not 1 <= value <= MAX_LINE_QUANTITY:
        _refuse_int(attribute, value, 1, MAX_LINE_QUANTITY)


def _sku(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if type(value) is not str:
        raise TypeError(f"{attribute.name} must be a str, got {type(value).__name__}")
    if not 1 <= len(value) <= MAX_SKU_LENGTH:
        raise ValueError(
            f"{attribute.name} must be 1 to {MAX_SKU_LENGTH} characters, got {len(value)}"
        )


@attrs.frozen(kw_only=True)
class QuoteRequest:
    """What a caller asks: a SKU, a quantity and the lab scenario to forward."""

    sku: str = attrs.field(default="KB-001", validator=_sku)
    quantity: int = attrs.field(default=2, validator=_quantity)
    scenario: str = attrs.field(default="normal", validator=v.in_(SCENARIOS))
    currency: str | None = None
    """The answer's currency; None: the service's ``--currency``. Not sent to suppliers."""


@attrs.frozen
class Asked:
    """What one supplier is asked, as an adapter that takes a second argument sees it."""

    supplier: str
    sku: str
    quantity: int
    scenario: str


@attrs.frozen
class PriceBreak:
    """An all-units price break: from ``quantity`` units on, each costs ``micros``."""

    quantity: int
    micros: int
    """The unit price in millionths of the currency's major unit (``money.MICROS``)."""


@attrs.frozen(kw_only=True)
class OfferTerms:
    """How a supplier sells a part, beyond today's integer unit price (issue: offers).

    Present only on a quote that said more than today's five keys; the legal buy
    and the conversion (``offers.py``) read it per request.
    """

    currency: str | None
    """As the supplier gave it; None: its default (the catalogue's, else ``--currency``)."""
    breaks: tuple[PriceBreak, ...]
    """Rising quantities; one break at quantity 1 for a single unit price."""
    moq: int = 1
    multiple: int = 1
    exponent: int = 2
    """The minor unit's digits of the offer's currency, as it was decoded."""
    quantities: tuple[int, ...] = attrs.field(init=False, repr=False, eq=False)
    """The breaks' quantities and unit prices apart, as the legal buy searches them."""
    prices: tuple[int, ...] = attrs.field(init=False, repr=False, eq=False)

    @quantities.default
    def _quantities(self) -> tuple[int, ...]:
        return tuple(entry.quantity for entry in self.breaks)

    @prices.default
    def _prices(self) -> tuple[int, ...]:
        return tuple(entry.micros for entry in self.breaks)


@attrs.frozen(kw_only=True)
class SupplierQuote:
    """One supplier's answer, as its wire format carries it (money in exact integers)."""

    supplier: str = attrs.field(validator=v.instance_of(str))
    sku: str = attrs.field(validator=v.instance_of(str))
    unit_cents: int | None = attrs.field(default=None)
    """Today's integer unit price in minor units; None when ``terms`` price it otherwise."""
    shipping_cents: int = attrs.field(validator=_count)
    """In the offer currency's minor units, however the supplier wrote it."""
    stock: int = attrs.field(validator=_count)
    terms: OfferTerms | None = None
    """None: a quote in today's shape (``unit_cents`` in the supplier's default currency)."""
    cache_control: str | None = None
    """The answer's ``Cache-Control`` header, kept only when the quote cache is on."""
    age_s: float | None = None
    """Seconds since the supplier gave this quote, for one served from the cache."""


# ShownOffer and RankedQuote are built for every quote of every answer (1,600 for a
# cart of 200 lines × 8 suppliers): plain slotted classes, treated as immutable, init
# in half the time of frozen ones (whose every field goes through object.__setattr__).


@attrs.define(kw_only=True)
class ShownOffer:
    """A quote's offer as the supplier gave it, for the answer (written as text by ``codec``)."""

    currency: str
    unit_micros: int
    """The unit price of the break used, in millionths of the major unit."""
    shipping: int
    """Shipping in the offer currency's minor units."""
    exponent: int
    """The offer currency's minor-unit digits: how many places its amounts are written with."""
    rate: str | None = None
    """Answer-currency units per offer-currency unit, 10 significant digits; only when converted."""
    rate_date: str | None = None
    """The ECB table's date the rate comes from; only when converted."""


@attrs.define(kw_only=True)
class RankedQuote:
    """A usable quote priced for the requested quantity, in the answer's currency."""

    supplier: str
    sku: str
    unit_cents: int | None = None
    """Only for a quote answered as today: native currency, whole minor units, bought as asked."""
    shipping_cents: int
    stock: int
    total_cents: int
    line_cents: int | None = None
    """The goods, converted; every quote not answered as today has it."""
    buy_quantity: int | None = None
    """Units bought, when that is not the quantity asked (MOQ, multiple, a cheaper break)."""
    offer: ShownOffer | None = None
    age_s: float | None = None
    """Set only for a quote from the cache; the answer leaves it out otherwise."""

    @classmethod
    def for_quantity(cls, quote: SupplierQuote, quantity: int) -> RankedQuote:
        """Price a quote in today's shape for ``quantity`` units, shipping included."""
        unit_cents = quote.unit_cents
        assert unit_cents is not None
        return cls(
            supplier=quote.supplier,
            sku=quote.sku,
            unit_cents=unit_cents,
            shipping_cents=quote.shipping_cents,
            stock=quote.stock,
            total_cents=unit_cents * quantity + quote.shipping_cents,
            age_s=quote.age_s,
        )

    @property
    def goods_cents(self) -> int:
        """What the goods cost, shipping apart, in the answer's minor units."""
        if self.line_cents is not None:
            return self.line_cents
        return self.total_cents - self.shipping_cents


@attrs.frozen
class Failure:
    """A supplier that gave no usable quote, and why."""

    supplier: str
    code: str
    sku: str | None = None
    """The SKU it failed for, on a cart's line with alternates (one line, several SKUs)."""


@attrs.frozen(kw_only=True)
class QuoteResult:
    """The answer to one quote request: every usable quote and every failure."""

    sku: str
    quantity: int
    quotes: tuple[RankedQuote, ...]
    """Quotes with enough stock, cheapest first, ties broken by supplier name."""
    failures: tuple[Failure, ...]
    """Suppliers without a usable quote, in the fixed supplier order."""
    elapsed_ms: float
    request_id: str
    currency: str
    """The currency every money field of the answer is in."""
    alternates: tuple[str, ...] = ()
    """A cart line's approved alternates: ``quotes`` and ``failures`` cover them too."""

    @property
    def best(self) -> RankedQuote | None:
        """The cheapest usable quote, if any."""
        return self.quotes[0] if self.quotes else None


# -- the budget bill: what happened to one supplier within one request ----------

STOPPED_SUCCESS = "success"
STOPPED_NOT_RETRYABLE = "not_retryable"
STOPPED_ATTEMPTS_EXHAUSTED = "attempts_exhausted"
STOPPED_DEADLINE = "deadline"
STOPPED_NO_TIME = "no_time"
"""The budget left could not cover the backoff and a useful attempt."""
STOPPED_NO_SLOT_IN_TIME = "no_slot_in_time"
"""An attempt waited for an outbound slot until the deadline no longer left it the
time the supplier needs: it gave its place up and the supplier was answered at once
(``timeout`` for a first attempt, the last attempt's code for a retry)."""
STOPPED_RATE_LIMITED = "rate_limited"
"""The supplier's outbound rate (its catalogue ``rate``) left no turn in time: not sent."""
STOPPED_PAUSED = "paused"
"""The supplier is paused after a 429 with ``Retry-After`` (``rate_limited``): not asked."""
STOPPED_NO_TOKEN = "no_token"
"""The supplier's OAuth2 token did not come (``auth_failed``): no attempt was sent."""
STOPPED_RETRY_AFTER = "retry_after"
"""The supplier's Retry-After asked for a wait the budget could not afford."""
STOPPED_RETRY_BUDGET = "retry_budget"
"""This supplier's recent retries did not pay off; its retry budget is spent."""
STOPPED_CIRCUIT_OPEN = "circuit_open"
"""The supplier's circuit is open (or another request is probing it): no attempt."""
STOPPED_JOINED = "joined"
"""An identical call was in flight (``--coalesce``): this request waited for its outcome."""
STOPPED_CACHED = "cached"
"""A fresh quote from the cache (``--cache-size``): the supplier was not asked."""


@attrs.frozen(kw_only=True)
class AttemptRecord:
    """One HTTP attempt at one supplier; times are ``time.monotonic()`` seconds."""

    attempt: int
    started: float
    """When it began waiting for an outbound slot."""
    slot_wait: float
    duration: float
    """Time holding the slot: request sent until the body was read or the error came."""
    outcome: str
    """``ok`` or the failure code."""
    status: int | None
    backoff: float | None = None
    """Seconds slept after this attempt before the next one, if any."""
    cut_short: bool = False
    """The request's deadline (or its caller leaving) cut it before it had a fair
    time (``breaker.py``): QuoteFlow's own lateness, not the supplier's failure."""
    hedge: bool = False
    """Sent while the first attempt was still out (a hedge), not after it failed."""
    problem: str | None = None
    """For ``invalid_data``: the field and the rule the answer broke."""

    @property
    def ended(self) -> float:
        """When the attempt gave its slot back."""
        return self.started + self.slot_wait + self.duration


OK = "ok"
CANCELLED = "cancelled"
"""An attempt of a hedged call cancelled because the other attempt brought a quote first."""


@attrs.define
class SupplierTrace:
    """The running bill of one supplier's call; it outlives a cancelled call."""

    supplier: str
    attempts: list[AttemptRecord] = attrs.Factory(list)
    stopped: str | None = None
    """Why no further attempt was made; set once the call ends."""
    probe: bool = False
    """The call is its supplier's half-open probe: it always waits for its slot."""
    gave_up_after: float | None = None
    """Seconds an attempt waited for a slot before giving its place up (``no_slot_in_time``)."""
    rate_wait: float | None = None
    """Seconds the call waited for a turn of its supplier's outbound rate, if it did."""
    token_wait: float | None = None
    """Seconds the call waited for its supplier's OAuth2 token (``tokens.py``), if it did."""
    joined: str | None = None
    """The request id of the shared call this request joined (``--coalesce``)."""
    handed_over: str | None = None
    """The request this one handed its shared call to when it left (``--coalesce``)."""
    stale_if_error: str | None = None
    """The failure a stale quote from the cache stood in for (``--cache-size``)."""
    hedged: bool = False
    """A hedge was sent beside the first attempt: the second attempt, no retry after it."""
    won: int | None = None
    """In a hedged call, the attempt whose quote won (the other was cancelled)."""
    hedge_refused: str | None = None
    """The hedge delay asked for a hedge and none went: ``no_token``, ``no_slot``,
    ``no_turn`` or ``no_time`` (``hedging.py``)."""
    lines: tuple[str, ...] = ()
    """A cart's call: the SKUs of the lines it asks for (one, unless the supplier takes a
    batch). Its waits for a slot come after single quotes' (``slots.py``)."""


@attrs.define
class MovingDeadline:
    """A deadline that may move while a call runs: a shared call's (``coalesce.py``).

    The attempt loop reads a deadline only as ``deadline - now``, the time
    left; this reads the same way, from wherever the deadline is now.
    """

    at: float
    """``time.monotonic()`` value of the deadline now."""

    def __sub__(self, other: float) -> float:
        return self.at - other


@attrs.frozen(kw_only=True)
class QuoteReport:
    """A result together with its budget bill, for callers who ask how it was reached."""

    result: QuoteResult
    budget: float
    admitted_at: float
    """``time.monotonic()`` at admission; every trace time is measured from here."""
    deadline: float
    """When the fan-out had to end: admission + budget - the answer's reserve."""
    traces: tuple[SupplierTrace, ...]
    caller: str | None = None
    """The caller's name when callers are configured (``-`` for an API key without one)."""


# -- carts: many lines in one request ---------------------------------------------


MAX_ALTERNATES = 4
"""Most approved alternates one cart line may carry."""
MAX_REF_LENGTH = 1000
"""Longest ``ref``: a grouped BOM row names every designator it places (``R1, R2, ...``),
a hundred and more of them on a large board."""


def _alternates(
    instance: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
) -> None:
    if len(value) > MAX_ALTERNATES:
        raise ValueError(f"at most {MAX_ALTERNATES} alternates, got {len(value)}")
    for sku in value:
        if type(sku) is not str or not 1 <= len(sku) <= MAX_SKU_LENGTH:
            raise ValueError(f"alternates must be 1 to {MAX_SKU_LENGTH} characters, got {sku!r}")


@attrs.frozen
class CartLine:
    """One line of a cart: a SKU (or any of its approved alternates) and how many are wanted."""

    sku: str = attrs.field(validator=_sku)
    quantity: int = attrs.field(validator=_quantity)
    alternates: tuple[str, ...] = attrs.field(default=(), validator=_alternates)
    """SKUs that serve the line as well as ``sku``, in the buyer's order of preference."""
    ref: str | None = None
    """The buyer's own name for the line (designators), echoed in the answer."""

    @property
    def skus(self) -> tuple[str, ...]:
        """Every SKU that may fill the line, its own first."""
        return (self.sku, *self.alternates)

    def asked(self) -> tuple[CartLine, ...]:
        """The line as suppliers are asked it: one line per SKU, each for the whole quantity."""
        if not self.alternates:
            return (self,)
        return tuple(CartLine(sku, self.quantity) for sku in self.skus)


@attrs.frozen(kw_only=True)
class CartRequest:
    """A bill of materials: its lines (each SKU once, alternates included) and the lab
    scenario to forward."""

    lines: tuple[CartLine, ...]
    scenario: str = attrs.field(default="normal", validator=v.in_(SCENARIOS))
    currency: str | None = None
    """The answer's currency; None: the service's ``--currency``."""

    def line_request(self, line: CartLine) -> QuoteRequest:
        """``line`` as a supplier is asked it: a single quote's request."""
        return QuoteRequest(sku=line.sku, quantity=line.quantity, scenario=self.scenario)

    def asked(self) -> tuple[CartLine, ...]:
        """Every SKU of the cart as suppliers are asked it, alternates beside their line."""
        if not any(line.alternates for line in self.lines):
            return self.lines
        return tuple(asked for line in self.lines for asked in line.asked())


# Built for every line of every basket: a plain slotted class, treated as immutable,
# as RankedQuote is (a frozen one cost a basket of 200 lines 0.1 ms more).
@attrs.define(kw_only=True)
class Pick:
    """A line of the basket: which supplier it is bought from, at what price."""

    sku: str
    """The line's SKU."""
    quantity: int
    supplier: str
    unit_cents: int | None
    """Only when the line's quote is answered as today (see ``RankedQuote``)."""
    bought_sku: str
    """What is bought: the line's SKU, or the alternate the basket took instead."""
    line_cents: int
    """The goods, shipping apart, in the answer's currency."""
    buy_quantity: int | None = None
    """Units bought, when that is not the line's quantity."""


@attrs.frozen
class Shipping:
    """What one supplier of the basket charges for shipping: once per order."""

    supplier: str
    shipping_cents: int


@attrs.frozen(kw_only=True)
class Basket:
    """The cheapest way to buy every quoted line, shipping paid once per supplier."""

    picks: tuple[Pick, ...]
    """One per quoted line, in request order."""
    shipping: tuple[Shipping, ...]
    """One per supplier bought from, in catalogue order: the largest of its lines', once."""
    total_cents: int
    """Every pick's ``line_cents`` and every supplier's shipping."""
    per_line_total_cents: int
    """What buying each quoted line at its own best quote (its own shipping each) would cost."""
    complete: bool
    """Every line was quoted (``unquoted`` is empty)."""
    unquoted: tuple[str, ...]
    """SKUs of the lines no supplier quoted, in request order; the basket prices the rest."""
    optimal: bool
    """The basket is proven the cheapest; False only when proving would pass the deadline."""


@attrs.frozen(kw_only=True)
class CartResult:
    """The answer to a cart: each line as a single quote would answer it, and the basket."""

    lines: tuple[QuoteResult, ...]
    """In request order; each line's ``elapsed_ms`` and ``request_id`` are the cart's."""
    basket: Basket
    elapsed_ms: float
    request_id: str
    currency: str
    asked: tuple[CartLine, ...] = ()
    """The cart's lines as asked (their alternates and refs), beside ``lines``; may be empty."""


@attrs.frozen(kw_only=True)
class CartReport:
    """A cart's result together with its budget bill: every supplier call it made."""

    result: CartResult
    budget: float
    admitted_at: float
    deadline: float
    """When the supplier calls had to end: admission + budget - the solve's reserve."""
    traces: tuple[SupplierTrace, ...]
    """One per supplier call, in catalogue order, each naming its ``lines``."""
    suppliers: tuple[str, ...]
    """Who was asked, in catalogue order."""
    solve_ms: float = 0.0
    caller: str | None = None
