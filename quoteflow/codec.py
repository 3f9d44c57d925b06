"""The edges where bytes become models and models become JSON.

Two private, strict cattrs converters. cattrs' defaults are lenient on purpose
(``int("100")``, ``int(True)``, ``int(1.5)`` and ``str(None)`` all succeed, and
unknown keys are dropped); on both edges that would turn a wrong value into a
plausible one, so every primitive hook here checks the exact type and every
unknown key is an error.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

import cattrs
import orjson
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from quoteflow.config import SCENARIOS
from quoteflow.errors import (
    BadRequestBody,
    FieldError,
    InvalidRequest,
    InvalidSupplierData,
)
from quoteflow.models import (
    MAX_QUANTITY,
    MAX_SKU_LENGTH,
    MAX_SUPPLIED_NUMBER,
    Failure,
    QuoteReport,
    QuoteRequest,
    QuoteResult,
    RankedQuote,
    SupplierQuote,
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
    if isinstance(value, float):
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


def _quantity(value: Any, _: type) -> int:
    if type(value) is not int:
        raise _wrong_type(value, "an integer")
    if not 1 <= value <= MAX_QUANTITY:
        raise ValueError(f"must be from 1 to {MAX_QUANTITY}, got {value}")
    return value


def _scenario(value: Any, _: type) -> str:
    if type(value) is not str:
        raise _wrong_type(value, "a string")
    if value not in SCENARIOS:
        raise ValueError(f"must be one of {', '.join(SCENARIOS)}")
    return value


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
)
"""Called directly, not through ``_requests.structure``: no dispatch per request."""


def decode_request(body: bytes) -> QuoteRequest:
    """Parse an inbound body; ``{}`` asks for every default.

    Raises ``BadRequestBody`` when it is not JSON and ``InvalidRequest``, with
    every field error, when it is JSON but not a valid request.
    """
    try:
        obj = _loads(body)
    except _UnusableJSON as exc:
        raise InvalidRequest([FieldError((), str(exc))]) from exc
    except ValueError as exc:
        raise BadRequestBody(str(exc)) from exc
    if type(obj) is not dict:
        raise InvalidRequest([FieldError((), f"must be a JSON object, not {_json_type(obj)}")])
    try:
        return _structure_request(obj, QuoteRequest)
    except ClassValidationError as exc:
        raise InvalidRequest(_field_errors(exc)) from exc


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
    cache_control=override(omit=True),
    age_s=override(omit=True),
)


def decode_supplier_quote(body: bytes, *, supplier: str, sku: str) -> SupplierQuote:
    """Parse one supplier's 200 body as its quote for ``sku``.

    Raises ``InvalidSupplierData`` for anything else: not JSON, not an object,
    wrong or missing or extra keys, wrong types, negative numbers, or a quote
    that names another supplier or SKU.
    """
    return supplier_quote_from(decode_supplier_json(body), supplier=supplier, sku=sku)


def decode_supplier_json(body: bytes) -> Any:
    """A supplier's 200 body as strict JSON (an adapter's input); ``InvalidSupplierData`` if not."""
    try:
        return _loads(body)
    except ValueError as exc:
        raise InvalidSupplierData(f"not JSON: {exc}") from exc


def supplier_quote_from(obj: Any, *, supplier: str, sku: str) -> SupplierQuote:
    """Check decoded JSON (or an adapter's output) as ``supplier``'s quote for ``sku``."""
    if type(obj) is not dict:
        raise InvalidSupplierData(f"not a JSON object but {_json_type(obj)}")
    try:
        quote = _structure_quote(obj, SupplierQuote)
    except ClassValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e.loc)) or '$'}: {e.msg}" for e in _field_errors(exc)
        )
        raise InvalidSupplierData(problems) from exc
    if quote.supplier != supplier or quote.sku != sku:
        raise InvalidSupplierData(f"quote is for {quote.supplier!r}/{quote.sku!r}")
    return quote


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
_unstructure_quote = make_dict_unstructure_fn(
    RankedQuote,
    _results,
    # ``age_s`` only for a quote from the cache: every other answer is unchanged.
    age_s=override(omit_if_default=True),
)
_unstructure_failure = _results.get_unstructure_hook(Failure)


def encode_result(result: QuoteResult) -> dict[str, Any]:
    """The contract's JSON shape of a result (``best`` is the first quote or null)."""
    quotes = [_unstructure_quote(quote) for quote in result.quotes]
    return {
        "sku": result.sku,
        "quantity": result.quantity,
        "quotes": quotes,
        "failures": [_unstructure_failure(failure) for failure in result.failures],
        "best": quotes[0] if quotes else None,
        "elapsed_ms": round(result.elapsed_ms, 3),
        "request_id": result.request_id,
    }


def encode_errors(errors: tuple[FieldError, ...]) -> list[dict[str, Any]]:
    """Field errors as the contract's ``detail`` list."""
    return [{"loc": list(error.loc), "msg": error.msg} for error in errors]


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


def encode_explain(report: QuoteReport) -> dict[str, Any]:
    """The budget bill: every attempt of every supplier, in milliseconds from admission."""
    deadline = report.deadline
    suppliers: dict[str, Any] = {}
    for trace in report.traces:
        attempts: list[dict[str, Any]] = []
        for record in trace.attempts:
            attempts.append(
                {
                    "attempt": record.attempt,
                    "start_ms": _ms(record.started - report.admitted_at),
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
        bill: dict[str, Any] = {"attempts": attempts, "stopped": trace.stopped}
        suppliers[trace.supplier] = bill
        if trace.gave_up_after is not None:
            bill["gave_up_after_ms"] = _ms(trace.gave_up_after)
        if trace.rate_wait is not None:
            bill["rate_wait_ms"] = _ms(trace.rate_wait)
        if trace.token_wait is not None:
            bill["token_wait_ms"] = _ms(trace.token_wait)
        if trace.probe:
            bill["probe"] = True
        # Present only when coalescing or the cache had a hand in the outcome.
        if trace.joined is not None:
            bill["joined"] = trace.joined
        if trace.handed_over is not None:
            bill["handed_over"] = trace.handed_over
        if trace.stale_if_error is not None:
            bill["stale_if_error"] = trace.stale_if_error
    explained: dict[str, Any] = {"budget_ms": _ms(report.budget), "suppliers": suppliers}
    if report.caller is not None:
        explained["caller"] = report.caller
    return explained
