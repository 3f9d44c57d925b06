"""The edges where bytes become models and models become JSON.

Two private, strict cattrs converters. cattrs' defaults are lenient on purpose
(``int("100")``, ``int(True)``, ``int(1.5)`` and ``str(None)`` all succeed, and
unknown keys are dropped); on both edges that would turn a wrong value into a
plausible one, so every primitive hook here checks the exact type and every
unknown key is an error.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from decimal import Decimal
from typing import Any, Final, NoReturn

import attrs
import cattrs
import orjson
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn, override

from quoteflow.config import SCENARIOS
from quoteflow.errors import (
    BadRequestBody,
    FieldError,
    InvalidRequest,
    InvalidSupplierData,
)
from quoteflow.models import (
    MAX_ALTERNATES,
    MAX_LINE_QUANTITY,
    MAX_QUANTITY,
    MAX_REF_LENGTH,
    MAX_SKU_LENGTH,
    MAX_SUPPLIED_NUMBER,
    NOT_FOUND,
    OK,
    CartLine,
    CartReport,
    CartRequest,
    CartResult,
    Failure,
    OfferTerms,
    Pick,
    PriceBreak,
    QuoteReport,
    QuoteRequest,
    QuoteResult,
    RankedQuote,
    SupplierQuote,
    SupplierTrace,
)
from quoteflow.money import (
    MICROS_PER_MINOR,
    micros_of_decimal,
    micros_of_text,
    minor_unit,
    text_of_micros,
    text_of_minor,
)

# -- JSON text -----------------------------------------------------------------


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _reject_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        raise ValueError("duplicate key in JSON object")
    return obj


class _UnusableJSON(ValueError):
    """Valid JSON that no quote or request can be: nested too deep, or a huge integer."""


def _parse_int(text: str) -> int:
    # Far beyond any quantity, price or stock, and short of int()'s own
    # 4300-digit guard, which would make valid JSON look like a syntax error.
    if len(text) > 40:
        raise _UnusableJSON(f"an integer of {len(text)} digits")
    return int(text)


_decoder = json.JSONDecoder(
    parse_int=_parse_int,
    # A number with a fraction or exponent is read exactly, never through a
    # binary float: an adapter for an API that sends a price as 0.0034 sees
    # Decimal("0.0034"). Every field of our own protocol refuses it anyway.
    parse_float=Decimal,
    parse_constant=_reject_constant,
    object_pairs_hook=_reject_duplicate_keys,
)
"""Built once: ``json.loads`` with hooks would build a new decoder on every call."""


def _loads(body: bytes) -> Any:
    """Strict JSON in UTF-8: no NaN/Infinity, no duplicate keys.

    Raises ``_UnusableJSON`` for valid JSON no model can hold, and
    ``ValueError`` for anything that is not JSON.
    """
    # raw_decode on text stripped of JSON's own whitespace (RFC 8259: space,
    # tab, LF, CR) is decode() without its two regular-expression scans.
    text = body.decode("utf-8").strip(" \t\n\r")
    try:
        obj, end = _decoder.raw_decode(text)
    except RecursionError as exc:
        raise _UnusableJSON("JSON nested too deeply") from exc
    if end != len(text):
        raise ValueError("extra data after the JSON value")
    return obj


# -- strict primitive hooks ----------------------------------------------------


def _wrong_type(value: Any, name: str) -> TypeError:
    return TypeError(f"must be {name}, not {_json_type(value)}")


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, Decimal | float):
        return "a number with a fraction or exponent"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


# Each hook tests the exact type inline: they run for every field of every
# payload, and a helper call per check was a visible part of decoding.


def _strict_str(value: Any, _: type) -> str:
    if type(value) is not str:
        raise _wrong_type(value, "a string")
    return value


def _strict_int(value: Any, _: type) -> int:
    if type(value) is not int:
        raise _wrong_type(value, "an integer")
    return value


def _supplied_number(value: Any, _: type) -> int:
    if type(value) is not int:
        raise _wrong_type(value, "an integer")
    if value < 0:
        raise ValueError(f"must be 0 or more, got {value}")
    if value > MAX_SUPPLIED_NUMBER:
        raise ValueError(f"must be at most 2**53 - 1, got {value}")
    return value


def _sku(value: Any, _: type) -> str:
    if type(value) is not str:
        raise _wrong_type(value, "a string")
    if not 1 <= len(value) <= MAX_SKU_LENGTH:
        raise ValueError(f"must be 1 to {MAX_SKU_LENGTH} characters, got {len(value)}")
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            # JSON lets "\ud800" through; no URL can carry it to a supplier unchanged.
            raise ValueError("must be valid Unicode text (no lone surrogates)") from None
    return value


def _whole_number(low: int, high: int, shown: str = "") -> Callable[[Any, type], int]:
    """A hook for an integer from ``low`` to ``high`` (``shown`` names ``high`` in errors)."""

    def check(value: Any, _: type) -> int:
        if type(value) is not int:
            raise _wrong_type(value, "an integer")
        if not low <= value <= high:
            raise ValueError(f"must be from {low} to {shown or high}, got {value}")
        return value

    return check


_quantity = _whole_number(1, MAX_QUANTITY)


def _scenario(value: Any, _: type) -> str:
    if type(value) is not str:
        raise _wrong_type(value, "a string")
    if value not in SCENARIOS:
        raise ValueError(f"must be one of {', '.join(SCENARIOS)}")
    return value


def _currency(value: Any, _: type) -> str:
    if type(value) is not str:
        raise _wrong_type(value, "a string")
    if minor_unit(value) is None:
        raise ValueError(
            "must be an ISO 4217 currency code with a minor unit, in upper case (e.g. USD)"
        )
    return value


def decode_currency(value: Any) -> str:
    """A ``currency`` given outside a JSON body (a CSV cart's ``?currency=``): the same rule.

    Raises ``TypeError`` or ``ValueError`` with the message a JSON ``currency`` would get.
    """
    return _currency(value, str)


def _strict_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(str, _strict_str)
    converter.register_structure_hook(int, _strict_int)
    return converter


# -- inbound requests ----------------------------------------------------------

_requests = _strict_converter()
_structure_request = make_dict_structure_fn(
    QuoteRequest,
    _requests,
    sku=override(struct_hook=_sku),
    quantity=override(struct_hook=_quantity),
    scenario=override(struct_hook=_scenario),
    currency=override(struct_hook=_currency),
)
"""Called directly, not through ``_requests.structure``: no dispatch per request."""


def decode_request(body: bytes) -> QuoteRequest:
    """Parse an inbound body; ``{}`` asks for every default.

    Raises ``BadRequestBody`` when it is not JSON and ``InvalidRequest``, with
    every field error, when it is JSON but not a valid request.
    """
    obj = _json_object(body)
    try:
        return _structure_request(obj, QuoteRequest)
    except ClassValidationError as exc:
        raise InvalidRequest(_field_errors(exc)) from exc


_CART_KEYS = frozenset({"lines", "scenario", "currency"})
_LINE_KEYS = ("sku", "quantity", "alternates", "ref")


def decode_cart(body: bytes, max_lines: int) -> CartRequest:
    """Parse an inbound cart: ``{"lines": [{"sku", "quantity", "alternates"?, "ref"?}, ...],
    "scenario"?, "currency"?}``.

    Every problem is reported at once, each at its place (``["lines", 3,
    "quantity"]``), so a caller fixing a 200-line bill of materials needs one
    round trip. A SKU asked twice, as a line's or an alternate, is an error at
    the later place naming the earlier one: merging them silently would hide
    a mistake in the bill, and one offer must never serve two lines.
    Raises ``BadRequestBody`` when it is not JSON, ``InvalidRequest`` otherwise.
    """
    obj = _json_object(body)
    errors = [FieldError((key,), "unknown field") for key in sorted(set(obj) - _CART_KEYS)]
    scenario = "normal"
    if "scenario" in obj:
        try:
            scenario = _scenario(obj["scenario"], str)
        except (TypeError, ValueError) as exc:
            errors.append(FieldError(("scenario",), str(exc)))
    currency = None
    if "currency" in obj:
        try:
            currency = _currency(obj["currency"], str)
        except (TypeError, ValueError) as exc:
            errors.append(FieldError(("currency",), str(exc)))
    lines: list[CartLine] = []
    raw_lines = obj.get("lines")
    if "lines" not in obj:
        errors.append(FieldError(("lines",), "required field missing"))
    elif type(raw_lines) is not list:
        errors.append(FieldError(("lines",), str(_wrong_type(raw_lines, "an array"))))
    elif not 1 <= len(raw_lines) <= max_lines:
        errors.append(
            FieldError(("lines",), f"must have 1 to {max_lines} lines, got {len(raw_lines)}")
        )
    else:
        read = [(index, _cart_line(raw, index, errors)) for index, raw in enumerate(raw_lines)]
        numbered = [(index, line) for index, line in read if line is not None]
        repeated = repeated_skus([(i, ln.skus) for i, ln in numbered], errors, _json_place)
        lines = [line for index, line in numbered if index not in repeated]
    if errors:
        raise InvalidRequest(errors)
    return CartRequest(lines=tuple(lines), scenario=scenario, currency=currency)


def _cart_line(raw: Any, index: int, errors: list[FieldError]) -> CartLine | None:
    """One line, or None with its every problem added to ``errors``."""
    if type(raw) is not dict:
        errors.append(FieldError(("lines", index), str(_wrong_type(raw, "an object"))))
        return None
    found = len(errors)
    errors.extend(
        FieldError(("lines", index, key), "unknown field")
        for key in sorted(set(raw) - set(_LINE_KEYS))
    )
    values: dict[str, Any] = {}
    for key, check in (("sku", _sku), ("quantity", _line_quantity)):
        if key not in raw:
            errors.append(FieldError(("lines", index, key), "required field missing"))
            continue
        try:
            values[key] = check(raw[key], str)
        except (TypeError, ValueError) as exc:
            errors.append(FieldError(("lines", index, key), str(exc)))
    alternates: tuple[str, ...] = ()
    if "alternates" in raw:
        given = raw["alternates"]
        if type(given) is not list:
            problem = str(_wrong_type(given, "an array of SKUs"))
            errors.append(FieldError(("lines", index, "alternates"), problem))
        else:
            alternates = line_alternates(given, values.get("sku"), index, errors)
    ref = None
    if "ref" in raw:
        try:
            ref = line_ref(raw["ref"]) or None  # an empty ref is no ref, as in a CSV file
        except (TypeError, ValueError) as exc:
            errors.append(FieldError(("lines", index, "ref"), str(exc)))
    if len(errors) > found:
        return None
    return CartLine(values["sku"], values["quantity"], alternates, ref)


def line_alternates(
    given: list[Any], sku: str | None, index: int, errors: list[FieldError], row: int | None = None
) -> tuple[str, ...]:
    """A line's approved alternates (JSON's list, a CSV cell's pieces); every problem to ``errors``.

    At most ``MAX_ALTERNATES``, each a SKU as a line's is, none the line's own
    SKU; those that pass are returned even when others do not, so that a repeat
    among them is still named. A SKU given twice in the cart is
    ``repeated_skus``' to find.
    """
    at = ("lines", index, "alternates")
    if len(given) > MAX_ALTERNATES:
        problem = f"must have at most {MAX_ALTERNATES} SKUs, got {len(given)}"
        errors.append(FieldError(at, problem, row=row))
        return ()
    valid: list[str] = []
    for k, raw in enumerate(given):
        try:
            alternate = _sku(raw, str)
        except (TypeError, ValueError) as exc:
            errors.append(FieldError((*at, k), str(exc), row=row))
            continue
        if alternate == sku:
            problem = "is the line's own SKU: list only the SKUs that may replace it"
            errors.append(FieldError((*at, k), problem, row=row))
            continue
        valid.append(alternate)
    return tuple(valid)


def line_ref(value: Any) -> str:
    """A line's ``ref``: the buyer's own text, echoed (``TypeError``/``ValueError`` otherwise)."""
    text = _strict_str(value, str)
    if len(text) > MAX_REF_LENGTH:
        raise ValueError(f"must be at most {MAX_REF_LENGTH} characters, got {len(text)}")
    return text


def repeated_skus(
    lines: list[tuple[int, tuple[str, ...]]],
    errors: list[FieldError],
    place: Callable[[int, int | None], str],
    rows: dict[int, int] | None = None,
) -> set[int]:
    """The indices of lines naming a SKU named before, as a line's or as an alternate.

    ``lines``: each line's index and SKUs, its own first. A SKU appears once
    in a cart, so that no offer can serve two lines. Each repeat is an error
    at its own place (``loc``, and its ``row`` from ``rows``) naming the
    earlier one (``place(index, alternate or None)``); ``errors`` stay in
    line order.
    """
    first_of: dict[str, tuple[int, int | None]] = {}
    repeated: set[int] = set()
    for index, skus in lines:
        for k, sku in enumerate(skus):
            alternate = k - 1 if k else None
            earlier = first_of.setdefault(sku, (index, alternate))
            if earlier == (index, alternate):
                continue
            loc: tuple[str | int, ...] = ("lines", index, "sku")
            if alternate is not None:
                loc = ("lines", index, "alternates", alternate)
            row = None if rows is None else rows[index]
            errors.append(FieldError(loc, f"repeats {place(*earlier)}: ask a SKU once", row=row))
            repeated.add(index)
    if repeated:
        errors.sort(key=_line_of)
    return repeated


def _line_of(error: FieldError) -> int:
    """The line an error is on (-1: the cart's own), for keeping errors in line order."""
    loc = error.loc
    return loc[1] if len(loc) > 1 and loc[0] == "lines" and type(loc[1]) is int else -1


def _json_place(index: int, alternate: int | None) -> str:
    if alternate is None:
        return f"line {index}"
    return f"alternate {alternate} of line {index}"


_line_quantity = _whole_number(1, MAX_LINE_QUANTITY)


def _json_object(body: bytes) -> dict[str, Any]:
    """An inbound body as a JSON object: ``BadRequestBody`` if not JSON, else ``InvalidRequest``."""
    try:
        obj = _loads(body)
    except _UnusableJSON as exc:
        raise InvalidRequest([FieldError((), str(exc))]) from exc
    except ValueError as exc:
        raise BadRequestBody(str(exc)) from exc
    if type(obj) is not dict:
        raise InvalidRequest([FieldError((), f"must be a JSON object, not {_json_type(obj)}")])
    return obj


def _field_errors(exc: ClassValidationError) -> list[FieldError]:
    """Every field error of ``exc``, with the hook's own message (not cattrs' generic one)."""
    errors: list[FieldError] = []
    with_notes, without = exc.group_exceptions()
    for error, note in with_notes:
        msg = "required field missing" if isinstance(error, KeyError) else str(error)
        errors.append(FieldError((note.name,), msg))
    for error in without:
        if isinstance(error, ForbiddenExtraKeysError):
            errors.extend(FieldError((key,), "unknown field") for key in sorted(error.extra_fields))
        else:
            errors.append(FieldError((), str(error)))
    return errors


# -- supplier payloads ---------------------------------------------------------

_payloads = _strict_converter()
_structure_quote = make_dict_structure_fn(
    SupplierQuote,
    _payloads,
    unit_cents=override(struct_hook=_supplied_number),
    shipping_cents=override(struct_hook=_supplied_number),
    stock=override(struct_hook=_supplied_number),
    # What QuoteFlow learns beside the payload: a supplier can never send these.
    terms=override(omit=True),
    cache_control=override(omit=True),
    age_s=override(omit=True),
)
"""Today's five keys: the path nearly every answer takes, as fast as before offers."""


def _today(obj: dict[str, Any]) -> SupplierQuote | None:
    """A quote of exactly today's five valid keys, or None: then it is read as an offer.

    Tried first, as nearly every answer is one: an offer's keys make it fail
    (they are extra here), and the offer's reading names every problem.
    """
    try:
        quote = _structure_quote(obj, SupplierQuote)
    except ClassValidationError:
        return None
    return None if quote.unit_cents is None else quote


MAX_OFFER_COUNT: Final = 10**9
"""The largest ``moq`` or ``multiple`` a supplier may state."""
_offer_count = _whole_number(1, MAX_OFFER_COUNT, "10**9")


def _price_text(value: Any, _: type) -> int:
    """A decimal string as micros of the major unit (``money.MICROS``)."""
    if type(value) is not str:
        raise _wrong_type(value, "a decimal string")
    micros = micros_of_text(value)
    if micros is None:
        raise ValueError("must be a decimal string like 12.50, at most 6 decimal places")
    return micros


def _price_adapted(value: Any, _: type) -> int:
    """An adapter's price: a decimal string, or a ``Decimal`` of at most 6 places."""
    if isinstance(value, Decimal):
        micros = micros_of_decimal(value)
        if micros is None:
            raise ValueError("must be a finite Decimal of at least 0 with at most 6 places")
        return micros
    return _price_text(value, str)


def _places(value: Any) -> int:
    """Decimal places as written: ``"3.000"`` has three (trailing zeros counted)."""
    if isinstance(value, Decimal):
        exponent = value.as_tuple().exponent
        return max(0, -exponent) if isinstance(exponent, int) else 0
    return len(str(value).partition(".")[2])


def _shipping_hook(price: Any) -> Any:
    def shipping(value: Any, _: type) -> tuple[int, int]:
        """A decimal shipping as (micros, places written): its places are checked per currency."""
        return price(value, str), _places(value)

    return shipping


_BREAK_PRICES: Final = ("unit_price", "unit_cents")


def _breaks_hook(price: Any) -> Any:
    def breaks(value: Any, _: type) -> tuple[tuple[int, int, bool], ...]:
        """``[{quantity, unit_price | unit_cents}, ...]`` as (quantity, price, in minor units)."""
        if type(value) is not list:
            raise _wrong_type(value, "an array")
        if not value:
            raise ValueError("must have at least one break")
        read: list[tuple[int, int, bool]] = []
        for index, entry in enumerate(value):
            if type(entry) is not dict:
                raise ValueError(f"[{index}] {_wrong_type(entry, 'an object')}")
            given = [key for key in _BREAK_PRICES if key in entry]
            extra = sorted(set(entry) - {"quantity", *_BREAK_PRICES})
            if extra:
                raise ValueError(f"[{index}].{extra[0]}: unknown field")
            if len(given) != 1:
                raise ValueError(f"[{index}] must have exactly one of unit_price or unit_cents")
            try:
                quantity = _offer_count(entry.get("quantity"), int)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"[{index}].quantity {exc}") from None
            if read and quantity <= read[-1][0]:
                raise ValueError(f"[{index}].quantity must rise, {quantity} after {read[-1][0]}")
            try:
                if given[0] == "unit_cents":
                    read.append((quantity, _supplied_number(entry["unit_cents"], int), True))
                else:
                    read.append((quantity, price(entry["unit_price"], str), False))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"[{index}].{given[0]} {exc}") from None
        return tuple(read)

    return breaks


@attrs.frozen(kw_only=True)
class _WireOffer:
    """A quote with offer fields as the protocol carries it, each field checked alone."""

    supplier: str
    sku: str
    stock: int
    currency: str | None = None
    unit_cents: int | None = None
    unit_price: int | None = None
    """Micros."""
    breaks: tuple[tuple[int, int, bool], ...] | None = None
    shipping_cents: int | None = None
    shipping: tuple[int, int] | None = None
    """Micros, and the decimal places it was written with."""
    moq: int = 1
    multiple: int = 1


def _offer_structure(price: Any) -> Any:
    return make_dict_structure_fn(
        _WireOffer,
        _payloads,
        stock=override(struct_hook=_supplied_number),
        currency=override(struct_hook=_currency),
        unit_cents=override(struct_hook=_supplied_number),
        unit_price=override(struct_hook=price),
        breaks=override(struct_hook=_breaks_hook(price)),
        shipping_cents=override(struct_hook=_supplied_number),
        shipping=override(struct_hook=_shipping_hook(price)),
        moq=override(struct_hook=_offer_count),
        multiple=override(struct_hook=_offer_count),
    )


_structure_offer = _offer_structure(_price_text)
"""A supplier's own JSON: a price that is not a string (a JSON number) is refused."""
_structure_adapted_offer = _offer_structure(_price_adapted)
"""An adapter's mapping: a ``Decimal`` price is welcome too."""


def decode_supplier_quote(
    body: bytes, *, supplier: str, sku: str, currency: str = "USD"
) -> SupplierQuote:
    """Parse one supplier's 200 body as its quote for ``sku``.

    Raises ``InvalidSupplierData`` for anything else: not JSON, not an object,
    wrong or missing or extra keys, wrong types, negative numbers, an offer
    that breaks a rule of the protocol, or a quote that names another
    supplier or SKU. ``currency``: the supplier's default, for a quote that
    names none.
    """
    return supplier_quote_from(
        decode_supplier_json(body), supplier=supplier, sku=sku, currency=currency
    )


def decode_supplier_json(body: bytes) -> Any:
    """A supplier's 200 body as strict JSON (an adapter's input); ``InvalidSupplierData`` if not."""
    try:
        return _loads(body)
    except ValueError as exc:
        raise InvalidSupplierData(f"not JSON: {exc}") from exc


def supplier_quote_from(
    obj: Any, *, supplier: str, sku: str, currency: str = "USD", adapted: bool = False
) -> SupplierQuote:
    """Check decoded JSON (or an adapter's output, ``adapted``) as ``supplier``'s quote for ``sku``.

    ``currency``: the supplier's default (its catalogue entry's, else the
    service's), which a quote that names none is in.
    """
    if type(obj) is not dict:
        raise InvalidSupplierData(f"not a JSON object but {_json_type(obj)}")
    try:
        quote = _today(obj)
        if quote is None:
            structure = _structure_adapted_offer if adapted else _structure_offer
            quote = _quote_of_offer(structure(obj, _WireOffer), currency)
    except ClassValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e.loc)) or '$'}: {e.msg}" for e in _field_errors(exc)
        )
        raise InvalidSupplierData(problems) from exc
    if quote.supplier != supplier or quote.sku != sku:
        raise InvalidSupplierData(f"quote is for {quote.supplier!r}/{quote.sku!r}")
    return quote


def _quote_of_offer(wire: _WireOffer, default_currency: str) -> SupplierQuote:
    """The rules between an offer's fields; each broken one is named in ``InvalidSupplierData``."""
    prices = [
        name
        for name, value in (
            ("unit_cents", wire.unit_cents),
            ("unit_price", wire.unit_price),
            ("breaks", wire.breaks),
        )
        if value is not None
    ]
    if len(prices) != 1:
        raise InvalidSupplierData(
            "unit_cents, unit_price, breaks: exactly one must be given, got "
            + (", ".join(prices) or "none")
        )
    if (wire.shipping_cents is None) == (wire.shipping is None):
        raise InvalidSupplierData("shipping_cents, shipping: exactly one must be given")
    currency = default_currency if wire.currency is None else wire.currency
    exponent = minor_unit(currency)
    assert exponent is not None  # the hook and the settings checked it
    to_minor = MICROS_PER_MINOR[exponent]
    if wire.shipping is not None:
        micros, places = wire.shipping
        if places > exponent:
            raise InvalidSupplierData(f"shipping: more decimal places than {currency}'s {exponent}")
        shipping = micros // to_minor
        if shipping > MAX_SUPPLIED_NUMBER:
            raise InvalidSupplierData("shipping: must be at most 2**53 - 1 minor units")
    else:
        assert wire.shipping_cents is not None
        shipping = wire.shipping_cents
    unit_cents = None
    if wire.breaks is not None:
        breaks = tuple(
            PriceBreak(quantity, price * to_minor if minor else price)
            for quantity, price, minor in wire.breaks
        )
    elif wire.unit_price is not None:
        breaks = (PriceBreak(1, wire.unit_price),)
    else:
        assert wire.unit_cents is not None
        unit_cents = wire.unit_cents
        breaks = (PriceBreak(1, unit_cents * to_minor),)
    terms = OfferTerms(
        currency=wire.currency,
        breaks=breaks,
        moq=wire.moq,
        multiple=wire.multiple,
        exponent=exponent,
    )
    return SupplierQuote(
        supplier=wire.supplier,
        sku=wire.sku,
        unit_cents=unit_cents,
        shipping_cents=shipping,
        stock=wire.stock,
        terms=terms,
    )


INSUFFICIENT_STOCK = "insufficient_stock"
"""A cart bill's word for a supplier that quoted a line with too little in stock."""

_BATCH_KEYS = frozenset({"quotes", "not_found"})


def decode_batch_answer(body: bytes) -> dict[str, object]:
    """A batch supplier's 200 in QuoteFlow's protocol, as SKU → entry or ``"not_found"``.

    ``{"quotes": [<a quote's five fields>, ...], "not_found": ["SKU", ...]}``.
    Each entry is checked later, against its own line (``supplier_quote_from``);
    an SKU named twice maps to None, which no line can use. Raises
    ``InvalidSupplierData`` when the body as a whole is not the protocol.
    """
    obj = decode_supplier_json(body)
    if type(obj) is not dict or set(obj) - _BATCH_KEYS:
        raise InvalidSupplierData("not a batch answer: an object of quotes and not_found")
    quotes, missing = obj.get("quotes", []), obj.get("not_found", [])
    if type(quotes) is not list or type(missing) is not list:
        raise InvalidSupplierData("quotes and not_found must be arrays")
    entries: dict[str, object] = {}
    named: list[tuple[object, object]] = [(e.get("sku"), e) for e in quotes if type(e) is dict]
    named += [(sku, NOT_FOUND) for sku in missing]
    for sku, entry in named:
        if type(sku) is str:
            entries[sku] = None if sku in entries else entry
    return entries


# -- outbound JSON -------------------------------------------------------------


def to_json(obj: Any) -> bytes:
    """``obj`` as compact UTF-8 JSON, for every answer QuoteFlow sends.

    orjson, not ``json.dumps``: encoding the answer was the largest single
    cost in QuoteFlow's own code per request, and orjson does it more than
    ten times faster. Decoding stays with ``json``: it alone lets us refuse
    duplicate keys (see ``_loads``).
    """
    try:
        return orjson.dumps(obj)
    except TypeError:
        # orjson refuses what json escapes: a lone surrogate, valid in JSON
        # text, can come back to a caller in a 422 as the name of its unknown
        # key. Only error answers take this path.
        return json.dumps(obj, separators=(",", ":")).encode()


_results = cattrs.Converter()


def _unstructure_failure(failure: Failure) -> dict[str, Any]:
    """A failure as the contract writes it; on a line with alternates it names its SKU too."""
    if failure.sku is None:
        return {"supplier": failure.supplier, "code": failure.code}
    return {"supplier": failure.supplier, "sku": failure.sku, "code": failure.code}


def _quote_json(quote: RankedQuote) -> dict[str, Any]:
    """A quote's JSON, written out by hand: it is the bulk of every answer.

    One answered as today has exactly today's keys, in today's order; any
    other has ``line_cents``, ``buy_quantity`` when it differs from the need,
    and its ``offer`` (``rate`` and ``rate_date`` only when converted).
    ``age_s`` comes last, only for a quote from the cache.
    """
    offer = quote.offer
    if offer is None:
        encoded: dict[str, Any] = {
            "supplier": quote.supplier,
            "sku": quote.sku,
            "unit_cents": quote.unit_cents,
            "shipping_cents": quote.shipping_cents,
            "stock": quote.stock,
            "total_cents": quote.total_cents,
        }
    else:
        shown: dict[str, Any] = {
            "currency": offer.currency,
            # Money becomes text here only, as decimal strings in the offer's currency.
            "unit_price": text_of_micros(offer.unit_micros, offer.exponent),
            "shipping": text_of_minor(offer.shipping, offer.exponent),
        }
        if offer.rate is not None:
            shown["rate"] = offer.rate
            shown["rate_date"] = offer.rate_date
        encoded = {
            "supplier": quote.supplier,
            "sku": quote.sku,
            "shipping_cents": quote.shipping_cents,
            "stock": quote.stock,
            "total_cents": quote.total_cents,
            "line_cents": quote.line_cents,
        }
        if quote.buy_quantity is not None:
            encoded["buy_quantity"] = quote.buy_quantity
        encoded["offer"] = shown
    if quote.age_s is not None:
        encoded["age_s"] = quote.age_s
    return encoded


def encode_result(result: QuoteResult) -> dict[str, Any]:
    """The contract's JSON shape of a result (``best`` is the first quote or null)."""
    quotes = [_quote_json(quote) for quote in result.quotes]
    return {
        "sku": result.sku,
        "quantity": result.quantity,
        "currency": result.currency,
        "quotes": quotes,
        "failures": [_unstructure_failure(failure) for failure in result.failures],
        "best": quotes[0] if quotes else None,
        "elapsed_ms": round(result.elapsed_ms, 3),
        "request_id": result.request_id,
    }


def encode_cart(result: CartResult) -> dict[str, Any]:
    """A cart's answer: its lines as single quotes answer them (less their own ids), the basket."""
    lines = []
    asked = result.asked or (None,) * len(result.lines)
    for line, given in zip(result.lines, asked, strict=True):
        encoded = encode_result(line)
        # The cart's, given once.
        del encoded["elapsed_ms"], encoded["request_id"], encoded["currency"]
        if given is not None and given.alternates:
            encoded["alternates"] = list(given.alternates)
        if given is not None and given.ref is not None:
            encoded["ref"] = given.ref
        lines.append(encoded)
    basket = result.basket
    return {
        "currency": result.currency,
        "lines": lines,
        "basket": {
            "picks": [_pick(pick) for pick in basket.picks],
            "shipping": [
                {"supplier": item.supplier, "shipping_cents": item.shipping_cents}
                for item in basket.shipping
            ],
            "total_cents": basket.total_cents,
            "per_line_total_cents": basket.per_line_total_cents,
            "complete": basket.complete,
            "unquoted": list(basket.unquoted),
            "optimal": basket.optimal,
        },
        "elapsed_ms": round(result.elapsed_ms, 3),
        "request_id": result.request_id,
    }


def _pick(pick: Pick) -> dict[str, Any]:
    """A basket line: ``unit_cents`` only when answered as today, ``buy_quantity`` if it differs."""
    encoded: dict[str, Any] = {
        "sku": pick.sku,
        "bought_sku": pick.bought_sku,
        "quantity": pick.quantity,
        "supplier": pick.supplier,
    }
    if pick.unit_cents is not None:
        encoded["unit_cents"] = pick.unit_cents
    encoded["line_cents"] = pick.line_cents
    if pick.buy_quantity is not None:
        encoded["buy_quantity"] = pick.buy_quantity
    return encoded


def encode_errors(errors: tuple[FieldError, ...]) -> list[dict[str, Any]]:
    """Field errors as the contract's ``detail`` list."""
    return [
        {"loc": list(error.loc), "msg": error.msg}
        if error.row is None
        else {"loc": list(error.loc), "msg": error.msg, "row": error.row}
        for error in errors
    ]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def encode_explain(report: QuoteReport) -> dict[str, Any]:
    """The budget bill: every attempt of every supplier, in milliseconds from admission."""
    suppliers: dict[str, Any] = {}
    for trace in report.traces:
        suppliers[trace.supplier] = _bill(trace, report.admitted_at, report.deadline)
    explained: dict[str, Any] = {"budget_ms": _ms(report.budget), "suppliers": suppliers}
    if report.caller is not None:
        explained["caller"] = report.caller
    return explained


def _bill(trace: SupplierTrace, admitted_at: float, deadline: float) -> dict[str, Any]:
    """One supplier call's part of the bill."""
    attempts: list[dict[str, Any]] = []
    for record in trace.attempts:
        attempts.append(
            {
                "attempt": record.attempt,
                "start_ms": _ms(record.started - admitted_at),
                "slot_wait_ms": _ms(record.slot_wait),
                "duration_ms": _ms(record.duration),
                "outcome": record.outcome,
                "status": record.status,
                "backoff_ms": None if record.backoff is None else _ms(record.backoff),
                "remaining_ms": _ms(deadline - record.ended),
            }
        )
        if record.cut_short:
            attempts[-1]["cut_short"] = True  # not counted by the breaker
        if record.hedge:
            attempts[-1]["hedge"] = True  # sent while the first was still out
        if record.problem is not None:
            attempts[-1]["problem"] = record.problem  # what made it invalid_data
    bill: dict[str, Any] = {"attempts": attempts, "stopped": trace.stopped}
    if trace.gave_up_after is not None:
        bill["gave_up_after_ms"] = _ms(trace.gave_up_after)
    if trace.rate_wait is not None:
        bill["rate_wait_ms"] = _ms(trace.rate_wait)
    if trace.token_wait is not None:
        bill["token_wait_ms"] = _ms(trace.token_wait)
    if trace.probe:
        bill["probe"] = True
    if trace.won is not None:
        bill["won"] = trace.won  # a hedged call: whose quote came first
    if trace.hedge_refused is not None:
        bill["hedge_refused"] = trace.hedge_refused  # the delay asked; why none went
    # Present only when coalescing or the cache had a hand in the outcome.
    if trace.joined is not None:
        bill["joined"] = trace.joined
    if trace.handed_over is not None:
        bill["handed_over"] = trace.handed_over
    if trace.stale_if_error is not None:
        bill["stale_if_error"] = trace.stale_if_error
    return bill


def encode_cart_explain(report: CartReport) -> dict[str, Any]:
    """A cart's bill: every supplier call with its lines, and each line's outcome per supplier."""
    suppliers: dict[str, list[dict[str, Any]]] = {}
    for trace in report.traces:
        bill = _bill(trace, report.admitted_at, report.deadline)
        bill["lines"] = list(trace.lines)
        suppliers.setdefault(trace.supplier, []).append(bill)
    lines: dict[str, dict[str, str]] = {}
    asked = report.result.asked or (None,) * len(report.result.lines)
    for line, given in zip(report.result.lines, asked, strict=True):
        failed = {(f.sku or line.sku, f.supplier): f.code for f in line.failures}
        quoted = {(quote.sku, quote.supplier) for quote in line.quotes}
        # Each SKU asked, alternates too; a supplier in neither answered with too
        # little in stock: valid, not a failure.
        for sku in (line.sku,) if given is None else given.skus:
            lines[sku] = {
                name: OK if (sku, name) in quoted else failed.get((sku, name), INSUFFICIENT_STOCK)
                for name in report.suppliers
            }
    explained: dict[str, Any] = {
        "budget_ms": _ms(report.budget),
        "deadline_ms": _ms(report.deadline - report.admitted_at),
        "solve_ms": round(report.solve_ms, 3),
        "suppliers": {name: {"calls": calls} for name, calls in suppliers.items()},
        "lines": lines,
    }
    if report.caller is not None:
        explained["caller"] = report.caller
    return explained
