"""The foreign dialects: suppliers asked as real supplier APIs are, on the shared pipeline.

``json``
    ``POST /json/{supplier}/quote`` with a JSON body
    ``{"items": [{"partNumber": "KB-001", "quantity": 10}], "scenario": "..."}``
    and ``Authorization: Bearer <token>`` from ``POST /oauth2/token``. Answers
    price breaks, money as decimal strings::

        {"partNumber": "KB-001", "currency": "EUR", "priceBreaks": [{"minQuantity": 1,
         "unitPrice": "12.00"}, ...], "shipping": "3.00", "available": 20}

``path``
    ``GET /path/{supplier}/parts/{sku}/price?qty=N&key=<api key>&scenario=...``,
    the SKU one percent-encoded path segment. Answers the price for that quantity::

        {"part": "KB-001", "qty": 10, "unitPriceCents": 1080, "freightCents": 300, "onHand": 20}

``batch``
    Many parts in one call, no credentials: ``POST /batch/{supplier}/match`` with
    ``{"parts": [{"mpn": "KB-001", "qty": 10}, ...], "scenario": "..."}``, or
    ``GET /batch/{supplier}/parts?pn=A|B|C&qty=N&scenario=...`` (one quantity for
    every part). At most ``LabConfig.batch_max_items`` parts (else ``413``), each
    part number once. Answers one entry per part, in request order, each priced
    for its quantity; a part the supplier does not sell is an error entry of the
    200, never a 404::

        {"results": [{"mpn": "KB-001", "qty": 10,
                      "offer": {"unitCents": 1080, "shippingCents": 300, "stock": 20}},
                     {"mpn": "NOPE", "qty": 1,
                      "error": {"code": "not_found", "message": "atlas has no part NOPE"}}]}

    A part of ``catalogue.PRICE_LISTS`` (the ``RES-0402-*`` reels, ``CAP-BULK-1``)
    is offered as its price list rather than priced for the quantity::

        {"mpn": "RES-0402-1K", "qty": 7,
         "offer": {"currency": "USD", "moq": 10, "multiple": 10,
                   "breaks": [{"quantity": 1, "unitPrice": "0.0100"}, ...],
                   "shipping": "4.00", "stock": 50000}}

    (``shippingCents``, an integer, instead of ``shipping`` where the supplier
    states it in cents). The ``json`` and ``path`` dialects do not list those parts
    (404).

Each dialect reads (supplier, SKU, quantity, scenario) its own way — a request
it cannot read is a ``400 bad_request`` that ``/stats`` does not count, as the
classic dialect's 400s — checks its own credentials once the request is
counted, and writes its own good quote and 404. Everything in between (the
supplier's contract, latency, faults, scenarios, the catalogue) is
:func:`provider_lab.handlers.serve`, once per request: a batch call is one
request, whatever its parts. The
prices come from the classic offer (:func:`provider_lab.catalogue.price_breaks`).
"""

from __future__ import annotations

import asyncio
import functools
import hmac
import json
import re
from collections.abc import Callable
from typing import ClassVar, Final
from urllib.parse import unquote_to_bytes

import attrs
from aiohttp import web

from provider_lab import answers
from provider_lab.answers import JSON, Call, Pairs, json_response, render
from provider_lab.catalogue import Offer, PriceList, break_price, lookup, price_breaks, price_list
from provider_lab.faults import EXTRA_KEY, EXTRA_VALUE, BatchKind, Fault, Kind
from provider_lab.handlers import Refusal, deadline, serve
from provider_lab.state import SCENARIOS, STATE

CURRENCY: Final = "EUR"
MAX_QUANTITY: Final = 1_000_000_000
SKU_SEGMENT: Final = 4
"""Where the SKU is in ``/path/{supplier}/parts/{sku}/price``'s raw parts (``/`` first)."""

_QUANTITY_TEXT: Final = re.compile(r"[0-9]{1,10}")
_BAD_ESCAPE: Final = re.compile(r"%(?![0-9A-Fa-f]{2})")
_INVALID_TOKEN: Final = {"WWW-Authenticate": 'Bearer error="invalid_token"'}


def money(cents: int) -> str:
    """Cents as a decimal string of euros: ``1080`` → ``"10.80"``."""
    return f"{cents // 100}.{cents % 100:02d}"


def _bad_request(detail: str) -> web.Response:
    return json_response(400, {"error": "bad_request", "detail": detail})


def _unknown_supplier(supplier: str) -> web.Response:
    return json_response(404, {"error": "unknown_supplier", "supplier": supplier})


# -- json: POST JSON + a bearer token ---------------------------------------------------


@attrs.frozen
class JsonCall(Call):
    """A ``json``-dialect request: its quantity, and its answers in that dialect's shape."""

    quantity: int
    lists_prices: ClassVar[bool] = False

    def ok(self, offer: Offer) -> web.Response:
        """The 200: every price break, money as decimal strings."""
        return web.Response(body=self.body(offer), content_type=JSON)

    def body(self, offer: Offer) -> bytes:
        """The good quote's bytes."""
        return _price_list(self.sku, offer, prices_as_text=True)

    def malformed(self, offer: Offer) -> bytes:
        """The ``malformed`` scenario: the break prices as JSON numbers, not decimal strings."""
        return _price_list(self.sku, offer, prices_as_text=False)

    def unknown_sku(self) -> web.Response:
        """The 404 for a SKU the supplier does not sell."""
        return json_response(404, {"error": "unknown_sku"})

    def elsewhere(self, other: str) -> str:
        """A 3xx's target: the same question to supplier ``other``."""
        return f"/json/{other}/quote"


@functools.lru_cache(maxsize=1024)
def _price_list(sku: str, offer: Offer, *, prices_as_text: bool) -> bytes:
    # Memoised: the list depends on the SKU and the offer only, not on the quantity,
    # and the same few are asked for again and again under load.
    def price(cents: int) -> str:
        return json.dumps(money(cents)) if prices_as_text else money(cents)

    breaks = ", ".join(
        render([("minQuantity", str(least)), ("unitPrice", price(cents))]).decode()
        for least, cents in price_breaks(offer)
    )
    return render(
        [
            ("partNumber", json.dumps(sku)),
            ("currency", json.dumps(CURRENCY)),
            ("priceBreaks", f"[{breaks}]"),
            ("shipping", json.dumps(money(offer.shipping_cents))),
            ("available", str(offer.stock)),
        ]
    )


def _object(pairs: list[tuple[str, object]]) -> dict[str, object]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise ValueError("a key is repeated")
    return found


def _constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


def _order(data: object) -> tuple[str, int, str] | str:
    """``(sku, quantity, scenario)`` from a decoded body, or what is wrong with it."""
    if type(data) is not dict:
        return "body: must be a JSON object"
    unknown = sorted(set(data) - {"items", "scenario"})
    if unknown:
        return f"{unknown[0]}: not a field (items, scenario)"
    items = data.get("items")
    if type(items) is not list or len(items) != 1:
        return "items: must be a list of exactly one item"
    item = items[0]
    if type(item) is not dict or set(item) != {"partNumber", "quantity"}:
        return 'items[0]: must be {"partNumber": "<sku>", "quantity": N}'
    sku, quantity = item["partNumber"], item["quantity"]
    if type(sku) is not str:
        return "items[0].partNumber: must be a string"
    if type(quantity) is not int or not 1 <= quantity <= MAX_QUANTITY:
        return f"items[0].quantity: must be an integer 1–{MAX_QUANTITY}"
    scenario = data.get("scenario", "normal")
    if type(scenario) is not str or scenario not in SCENARIOS:
        return f"scenario: must be one of {', '.join(SCENARIOS)}"
    return sku, quantity, scenario


async def json_quote(request: web.Request) -> web.StreamResponse:
    """``POST /json/{supplier}/quote``: read the order, then the shared pipeline behind a bearer."""
    supplier = request.match_info["supplier"]
    state = request.app[STATE]
    if supplier not in state.suppliers:
        return _unknown_supplier(supplier)
    if request.content_type != JSON:
        return _bad_request("Content-Type: must be application/json")
    try:
        data = json.loads(await request.read(), object_pairs_hook=_object, parse_constant=_constant)
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return _bad_request(f"body: not JSON ({exc})")
    order = _order(data)
    if isinstance(order, str):
        return _bad_request(order)
    sku, quantity, scenario = order
    headers = request.headers
    call = JsonCall(
        request=request,
        state=state,
        supplier=supplier,
        sku=sku,
        scenario=scenario,
        request_id=headers.get("X-Request-ID"),
        deadline=deadline(headers.get("X-Deadline-Remaining-Ms")),
        quantity=quantity,
    )
    return await serve(call, bearer)


def bearer(call: Call) -> Refusal | None:
    """RFC 6750: a token the token endpoint issued, not expired or revoked; else 401."""
    header = call.request.headers.get("Authorization", "")
    if header[:7].lower() == "bearer ":
        token = header[7:]
        if token and call.state.tokens.valid(token, asyncio.get_running_loop().time()):
            return None
    return "invalid_token", json_response(401, {"error": "invalid_token"}, **_INVALID_TOKEN)


# -- path: the SKU in the path, an API key in the query ---------------------------------


@attrs.frozen
class PathCall(Call):
    """A ``path``-dialect request: its quantity, and its answers in that dialect's shape."""

    quantity: int
    lists_prices: ClassVar[bool] = False

    def ok(self, offer: Offer) -> web.Response:
        """The 200: the unit price for this quantity, in cents."""
        return web.Response(body=self.body(offer), content_type=JSON)

    def body(self, offer: Offer) -> bytes:
        """The good quote's bytes."""
        return render(self._pairs(offer, str(break_price(offer, self.quantity))))

    def malformed(self, offer: Offer) -> bytes:
        """The ``malformed`` scenario: the unit price as a string."""
        return render(self._pairs(offer, f'"{break_price(offer, self.quantity)}"'))

    def _pairs(self, offer: Offer, unit_price: str) -> answers.Pairs:
        return [
            ("part", json.dumps(self.sku)),
            ("qty", str(self.quantity)),
            ("unitPriceCents", unit_price),
            ("freightCents", str(offer.shipping_cents)),
            ("onHand", str(offer.stock)),
        ]

    def unknown_sku(self) -> web.Response:
        """The 404 for a SKU the supplier does not sell."""
        return json_response(404, {"error": "unknown_sku"})

    def elsewhere(self, other: str) -> str:
        """A 3xx's target: the same path and query (as sent) at supplier ``other``."""
        url = self.request.rel_url
        query = url.raw_query_string
        path = f"/path/{other}/parts/{url.raw_parts[SKU_SEGMENT]}/price"
        return path + (f"?{query}" if query else "")


def path_sku(raw: str) -> str:
    """The SKU of a raw path segment, percent-decoded; ``ValueError`` if it cannot be one.

    Strict where a lenient server would guess: a ``%`` not followed by two hex
    digits, escapes that are not UTF-8, or a bare ``.``/``..`` segment (which
    any URL normaliser would resolve away; a SKU ``..`` arrives as ``%2E%2E``).
    """
    if raw in (".", ".."):
        raise ValueError("sku: a dot segment; a SKU '.' or '..' must be percent-encoded")
    if _BAD_ESCAPE.search(raw):
        raise ValueError("sku: '%' not followed by two hex digits")
    try:
        return unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError("sku: percent-escapes that are not UTF-8") from None


def _one(request: web.Request, name: str) -> str | None:
    """The query parameter ``name``, if given; ``ValueError`` if it is given twice."""
    values = request.query.getall(name, ())
    if len(values) > 1:
        raise ValueError(f"{name}: given more than once")
    return values[0] if values else None


async def path_quote(request: web.Request) -> web.StreamResponse:
    """``GET /path/{supplier}/parts/{sku}/price``: read it, then the pipeline behind an API key."""
    supplier = request.match_info["supplier"]
    state = request.app[STATE]
    if supplier not in state.suppliers:
        return _unknown_supplier(supplier)
    try:
        # The raw segment, not match_info: the lab decodes it itself, strictly.
        sku = path_sku(request.rel_url.raw_parts[SKU_SEGMENT])
        quantity_text = _one(request, "qty")
        scenario = _one(request, "scenario") or "normal"
        _one(request, "key")
    except ValueError as exc:
        return _bad_request(str(exc))
    if quantity_text is None or not _QUANTITY_TEXT.fullmatch(quantity_text):
        return _bad_request(f"qty: required, an integer 1–{MAX_QUANTITY}")
    quantity = int(quantity_text)
    if not 1 <= quantity <= MAX_QUANTITY:
        return _bad_request(f"qty: required, an integer 1–{MAX_QUANTITY}")
    if scenario not in SCENARIOS:
        return _bad_request(f"scenario: must be one of {', '.join(SCENARIOS)}")
    headers = request.headers
    call = PathCall(
        request=request,
        state=state,
        supplier=supplier,
        sku=sku,
        scenario=scenario,
        request_id=headers.get("X-Request-ID"),
        deadline=deadline(headers.get("X-Deadline-Remaining-Ms")),
        quantity=quantity,
    )
    return await serve(call, api_key)


def api_key(call: Call) -> Refusal | None:
    """The lab's API key in ``?key=``, compared in constant time; else 403."""
    expected = call.state.api_key
    given = call.request.query.get("key")
    if (
        expected is not None
        and given is not None
        and hmac.compare_digest(
            given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass")
        )
    ):
        return None
    return "invalid_api_key", json_response(403, {"error": "invalid_api_key"})


# -- batch: many parts in one call ------------------------------------------------------

BATCH_SEPARATOR: Final = "|"
"""What separates the part numbers of ``GET /batch/{supplier}/parts?pn=``."""
_OFFER_KEYS: Final = {
    "unit_cents": "unitCents",
    "shipping_cents": "shippingCents",
    "stock": "stock",
}
"""The classic field a data fault names → its key in a batch offer."""
_OTHER: Final = "-OTHER"

Spoil = Callable[[Pairs, Pairs], tuple[Pairs, Pairs | None]]
"""A change to one entry: (its mpn and qty, its offer) → the same, changed (offer None: gone)."""


@attrs.frozen
class Part:
    """One part a batch call asks for: the supplier's part number (the SKU) and a quantity."""

    mpn: str
    qty: int


@attrs.frozen
class BatchCall(Call):
    """A ``batch``-dialect call: its parts in request order (``sku`` is the first one's)."""

    parts: tuple[Part, ...]

    def quote(self) -> Results:
        """Every part's result: a batch call always has an answer, an unknown part an entry."""
        return Results(self, tuple(self._offer(part.mpn) for part in self.parts))

    def _offer(self, mpn: str) -> Offer | PriceList | None:
        offer = lookup(self.supplier, mpn)
        return price_list(self.supplier, mpn) if offer is None else offer

    def batch_size(self) -> int:
        """How many parts the call asks for."""
        return len(self.parts)

    def first_sight(self) -> str:
        """Supplier, request id and the first part: each chunk of a cart is a first sight."""
        return f"{self.supplier} {self.request_id}\n{self.parts[0].mpn}"

    def elsewhere(self, other: str) -> str:
        """A 3xx's target: the same call (the same query, as sent) at supplier ``other``."""
        if self.request.method == "POST":
            return f"/batch/{other}/match"
        query = self.request.rel_url.raw_query_string
        return f"/batch/{other}/parts" + (f"?{query}" if query else "")


@attrs.frozen
class Results:
    """A batch call's good answer, and every way a fault or scenario spoils it.

    ``{"results": [entry, ...]}``, one entry per part in request order: ``{"mpn", "qty",
    "offer": {"unitCents", "shippingCents", "stock"}}``, priced for that part's quantity,
    or ``{"mpn", "qty", "error": {"code": "not_found", "message"}}``.
    """

    call: BatchCall
    offers: tuple[Offer | PriceList | None, ...]
    """Each part's offer, in the parts' order; ``None``: the supplier does not sell it."""

    def ok(self) -> web.Response:
        """The 200."""
        return web.Response(body=self.body(), content_type=JSON)

    def body(self) -> bytes:
        """The 200's bytes."""
        return _results([self._entry(index) for index in range(len(self.offers))])

    def malformed(self) -> bytes:
        """The ``malformed`` scenario: every offer's ``unitCents`` as a string."""
        return self._every(_unit_as_text)

    def changed(self, fault: Fault) -> bytes:
        """A data fault on every offer of the call, or a batch fault on its last part's entry."""
        kind = fault.kind
        if isinstance(kind, BatchKind):
            entries = [self._entry(index) for index in range(len(self.offers))]
            last = len(entries) - 1
            match kind:
                case BatchKind.MALFORMED_ENTRY:
                    entries[last] = self._entry(last, _unit_as_text, error_code="404")
                case BatchKind.MISSING_ENTRY:
                    del entries[last]
                case BatchKind.SHUFFLED:
                    entries.reverse()
                case BatchKind.WRONG_MPN:
                    entries[last] = self._entry(last, mpn=self.call.parts[last].mpn + _OTHER)
            return _results(entries)
        return self._every(_spoiler(fault, self.call.state.other_than(self.call.supplier)))

    def _every(self, spoil: Spoil) -> bytes:
        return _results([self._entry(index, spoil) for index in range(len(self.offers))])

    def _entry(
        self,
        index: int,
        spoil: Spoil | None = None,
        *,
        error_code: str = '"not_found"',
        mpn: str | None = None,
    ) -> Pairs:
        """Part ``index``'s entry: ``spoil`` changes an offer; an error entry keeps its own."""
        part, offer = self.call.parts[index], self.offers[index]
        head: Pairs = [
            ("mpn", json.dumps(part.mpn if mpn is None else mpn)),
            ("qty", str(part.qty)),
        ]
        if offer is None:
            message = json.dumps(f"{self.call.supplier} has no part {part.mpn}")
            return [*head, ("error", _text([("code", error_code), ("message", message)]))]
        if isinstance(offer, PriceList):
            if spoil is None:
                return [*head, ("offer", _listed_offer(offer))]
            offer = offer.classic()  # a spoiled price list: the classic offer nearest it
        priced: Pairs = [
            ("unitCents", str(break_price(offer, part.qty))),
            ("shippingCents", str(offer.shipping_cents)),
            ("stock", str(offer.stock)),
        ]
        if spoil is None:
            return [*head, ("offer", _text(priced))]
        head, spoiled = spoil(head, priced)
        return head if spoiled is None else [*head, ("offer", _text(spoiled))]


@functools.lru_cache(maxsize=256)
def _listed_offer(listed: PriceList) -> str:
    """A price list as a batch offer: ``{"currency", "moq", "multiple", "breaks":
    [{"quantity", "unitPrice"}], "shipping" | "shippingCents", "stock"}`` (a single price is
    one break from 1)."""
    breaks = ", ".join(
        _text([("quantity", str(least)), ("unitPrice", json.dumps(unit))])
        for least, unit in listed.breaks
    )
    shipping = (
        ("shippingCents", str(listed.shipping))
        if isinstance(listed.shipping, int)
        else ("shipping", json.dumps(listed.shipping))
    )
    return _text(
        [
            ("currency", json.dumps(listed.currency)),
            ("moq", str(listed.moq)),
            ("multiple", str(listed.multiple)),
            ("breaks", f"[{breaks}]"),
            shipping,
            ("stock", str(listed.stock)),
        ]
    )


def _text(pairs: Pairs) -> str:
    return render(pairs).decode()


def _results(entries: list[Pairs]) -> bytes:
    return render([("results", "[" + ", ".join(_text(entry) for entry in entries) + "]")])


def _unit_as_text(head: Pairs, offer: Pairs) -> tuple[Pairs, Pairs]:
    return head, [(k, json.dumps(v) if k == "unitCents" else v) for k, v in offer]


def _spoiler(fault: Fault, other: str) -> Spoil:
    """``fault`` (a classic data kind that changes a field) as a change to one offered entry."""

    def spoil(head: Pairs, offer: Pairs) -> tuple[Pairs, Pairs | None]:
        values = dict(offer)
        match fault.kind:
            case Kind.WRONG_TYPES:
                key = _OFFER_KEYS[fault.str_param("field")]
                values[key] = answers.retyped(int(values[key]), fault.str_param("variant"))
            case Kind.NEGATIVE:
                key = _OFFER_KEYS[fault.str_param("field")]
                values[key] = str(-(abs(int(values[key])) or 1))
            case Kind.EXTRA_KEY:
                values[EXTRA_KEY] = json.dumps(EXTRA_VALUE)
            case Kind.DUPLICATE_KEY:
                return head, [*offer, (_OFFER_KEYS[fault.str_param("field")], "1")]
            case Kind.MISSING_KEY:
                field = fault.str_param("field")
                if field == "sku":
                    return [pair for pair in head if pair[0] != "mpn"], offer
                if field == "supplier":
                    return head, None
                del values[_OFFER_KEYS[field]]
            case Kind.WRONG_SUPPLIER:
                return [*head, ("supplier", json.dumps(other))], offer
            case Kind.WRONG_SKU:
                mpn = json.loads(head[0][1]) + _OTHER
                return [("mpn", json.dumps(mpn)), *head[1:]], offer
            case _:  # pragma: no cover - only the field-changing kinds come here
                raise AssertionError(fault.kind)
        return head, list(values.items())

    return spoil


def _batch_order(data: object) -> tuple[tuple[Part, ...], str] | str:
    """``(parts, scenario)`` from a decoded ``POST /batch/.../match`` body, or what is wrong."""
    if type(data) is not dict:
        return "body: must be a JSON object"
    unknown = sorted(set(data) - {"parts", "scenario"})
    if unknown:
        return f"{unknown[0]}: not a field (parts, scenario)"
    items = data.get("parts")
    if type(items) is not list or not items:
        return "parts: must be a non-empty list"
    parts: list[Part] = []
    for index, item in enumerate(items):
        if type(item) is not dict or set(item) != {"mpn", "qty"}:
            return f'parts[{index}]: must be {{"mpn": "<sku>", "qty": N}}'
        part = _part(f"parts[{index}]", item["mpn"], item["qty"])
        if isinstance(part, str):
            return part
        parts.append(part)
    repeated = _repeated(parts, "parts[{}].mpn")
    if repeated is not None:
        return repeated
    scenario = data.get("scenario", "normal")
    if type(scenario) is not str or scenario not in SCENARIOS:
        return f"scenario: must be one of {', '.join(SCENARIOS)}"
    return tuple(parts), scenario


def _part(where: str, mpn: object, qty: object) -> Part | str:
    if type(mpn) is not str or not mpn:
        return f"{where}.mpn: must be a non-empty string"
    if type(qty) is not int or not 1 <= qty <= MAX_QUANTITY:
        return f"{where}.qty: must be an integer 1–{MAX_QUANTITY}"
    return Part(mpn, qty)


def _repeated(parts: list[Part], where: str) -> str | None:
    """What is wrong if a part number is asked twice in one call (each part once a call)."""
    first: dict[str, int] = {}
    for index, part in enumerate(parts):
        earlier = first.setdefault(part.mpn, index)
        if earlier != index:
            return f"{where.format(index)}: {part.mpn!r} repeats part {earlier}: ask a part once"
    return None


async def batch_match(request: web.Request) -> web.StreamResponse:
    """``POST /batch/{supplier}/match``: read the parts, then the pipeline once for the call."""
    supplier = request.match_info["supplier"]
    state = request.app[STATE]
    if supplier not in state.suppliers:
        return _unknown_supplier(supplier)
    if request.content_type != JSON:
        return _bad_request("Content-Type: must be application/json")
    try:
        data = json.loads(await request.read(), object_pairs_hook=_object, parse_constant=_constant)
    except ValueError as exc:
        return _bad_request(f"body: not JSON ({exc})")
    order = _batch_order(data)
    if isinstance(order, str):
        return _bad_request(order)
    parts, scenario = order
    return await serve(_batch_call(request, supplier, parts, scenario), within_max_items)


async def batch_parts(request: web.Request) -> web.StreamResponse:
    """``GET /batch/{supplier}/parts?pn=A|B&qty=N``: part numbers joined by ``|``, one quantity."""
    supplier = request.match_info["supplier"]
    state = request.app[STATE]
    if supplier not in state.suppliers:
        return _unknown_supplier(supplier)
    unknown = sorted(set(request.query) - {"pn", "qty", "scenario"})
    if unknown:
        return _bad_request(f"{unknown[0]}: not a parameter (pn, qty, scenario)")
    try:
        joined = _one(request, "pn")
        quantity_text = _one(request, "qty")
        scenario = _one(request, "scenario") or "normal"
    except ValueError as exc:
        return _bad_request(str(exc))
    if joined is None:
        return _bad_request(f"pn: required, part numbers separated by {BATCH_SEPARATOR!r}")
    if (
        quantity_text is None
        or not _QUANTITY_TEXT.fullmatch(quantity_text)
        or not 1 <= int(quantity_text) <= MAX_QUANTITY
    ):
        return _bad_request(f"qty: required, an integer 1–{MAX_QUANTITY}")
    quantity = int(quantity_text)
    parts: list[Part] = []
    for index, mpn in enumerate(joined.split(BATCH_SEPARATOR)):
        part = _part(f"pn[{index}]", mpn, quantity)
        if isinstance(part, str):
            return _bad_request(part)
        parts.append(part)
    repeated = _repeated(parts, "pn[{}]")
    if repeated is not None:
        return _bad_request(repeated)
    if scenario not in SCENARIOS:
        return _bad_request(f"scenario: must be one of {', '.join(SCENARIOS)}")
    return await serve(_batch_call(request, supplier, tuple(parts), scenario), within_max_items)


def _batch_call(
    request: web.Request, supplier: str, parts: tuple[Part, ...], scenario: str
) -> BatchCall:
    headers = request.headers
    return BatchCall(
        request=request,
        state=request.app[STATE],
        supplier=supplier,
        sku=parts[0].mpn,
        scenario=scenario,
        request_id=headers.get("X-Request-ID"),
        deadline=deadline(headers.get("X-Deadline-Remaining-Ms")),
        parts=parts,
    )


def within_max_items(call: Call) -> Refusal | None:
    """The batch dialect's gate: no credentials, but at most ``batch_max_items`` parts; else
    413, counted as ``too_many_parts``."""
    size = call.batch_size()
    limit = call.state.config.batch_max_items
    if size is None or size <= limit:
        return None
    body = {"error": "too_many_parts", "max_items": limit, "parts": size}
    return "too_many_parts", json_response(413, body)
