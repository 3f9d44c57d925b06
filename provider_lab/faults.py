"""Fault kinds, their parameters, and the per-supplier fault table.

A fault is switched on for one supplier and applies to that supplier's next
``count`` requests, or to every request until it is cleared (``count`` null).
Each supplier has a queue: ``PUT`` replaces it, ``POST`` appends, so a script
such as "503, then a truncated body, then normal answers" is two ``POST``s with
``count: 1``. The table is plain data; how each kind is written onto the wire
lives in :mod:`provider_lab.answers`.

The same validation serves the control API (JSON values) and the CLI's
``--fault SUPPLIER:KIND[:KEY=VALUE,...]`` (text values converted first).

``latency`` takes an optional ``sigma``: each answer is then delayed by its own
lognormal draw whose median is ``ms`` (:func:`draw_latency_ms`), from a random
stream per supplier that the lab's ``--seed`` fixes (:meth:`LabState.latency_random
<provider_lab.state.LabState.latency_random>`).

The batch dialect's own faults (:class:`BatchKind`) are kinds of their own:
they spoil one entry of a batch answer, so a call of another dialect that
takes one from the queue uses it up and is answered as if it had none.
"""

from __future__ import annotations

import enum
import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Final, Protocol

import attrs

from provider_lab.catalogue import SUPPLIERS

QUOTE_KEYS: Final = ("supplier", "sku", "unit_cents", "shipping_cents", "stock")
INT_KEYS: Final = ("unit_cents", "shipping_cents", "stock")
MIB: Final = 1024 * 1024
EXTRA_KEY: Final = "warehouse"
EXTRA_VALUE: Final = "FRA-2"
"""What ``extra_key`` adds: a key no protocol knows (``currency`` is an offer's field now)."""
MAX_LATENCY_MS: Final = 600_000
"""The longest delay the lab keeps an answer back: a latency, a fault's ``ms``, or any one
lognormal draw of the ``latency`` fault."""
MAX_SIGMA: Final = 3.0
"""The largest ``sigma`` of the ``latency`` fault (its 99th percentile is then ~1000 × ``ms``)."""


class Kind(enum.StrEnum):
    """Every fault the lab can produce, grouped by what a client sees."""

    # A status other than 200.
    HTTP_404 = "http_404"
    HTTP_429 = "http_429"
    HTTP_500 = "http_500"
    HTTP_503 = "http_503"
    HTTP_STATUS = "http_status"
    # Bytes the client cannot decode, or far too many of them.
    BAD_GZIP = "bad_gzip"
    OVERSIZED = "oversized"
    GZIP_BOMB = "gzip_bomb"
    # The connection misbehaves.
    TRUNCATED = "truncated"
    RESET = "reset"
    CLOSE = "close"
    NOT_HTTP = "not_http"
    HANG = "hang"
    LATENCY = "latency"
    SLOW_BODY = "slow_body"
    # A 200 whose body is not a valid quote for this supplier and SKU.
    NOT_JSON = "not_json"
    WRONG_TYPES = "wrong_types"
    NEGATIVE = "negative"
    EXTRA_KEY = "extra_key"
    MISSING_KEY = "missing_key"
    DUPLICATE_KEY = "duplicate_key"
    WRONG_SUPPLIER = "wrong_supplier"
    WRONG_SKU = "wrong_sku"
    # A valid quote served in an unusual but legal way.
    WRONG_CONTENT_TYPE = "wrong_content_type"
    # A 503 once per request id with probability P (benchmarks).
    BLIP = "blip"


class BatchKind(enum.StrEnum):
    """Faults of the batch dialect only: a 200 whose results are wrong in one place.

    Each hits the entry of the call's last part (``provider_lab.dialects``), so
    a test can check that the other entries were kept.
    """

    MALFORMED_ENTRY = "batch_malformed_entry"
    MISSING_ENTRY = "batch_missing_entry"
    SHUFFLED = "batch_shuffled"
    WRONG_MPN = "batch_wrong_mpn"


AnyKind = Kind | BatchKind
"""A fault kind of any dialect."""


class FaultError(ValueError):
    """A fault description that cannot be used; ``problems`` says why, one per field."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@attrs.frozen
class Param:
    """One parameter a kind accepts: its type, default and allowed values."""

    type: type[int] | type[float] | type[str]
    default: int | float | str | None
    doc: str
    low: float | None = None
    high: float | None = None
    choices: tuple[str, ...] = ()
    nullable: bool = False
    optional: bool = False
    """Left out of the fault (and of ``GET /faults``) unless given: no default is filled in."""


@attrs.frozen
class KindSpec:
    """What a kind does and which parameters it takes."""

    doc: str
    params: Mapping[str, Param] = attrs.field(factory=dict)


def _size(default: int, doc: str) -> Param:
    return Param(int, default, doc, low=0, high=256 * MIB)


_PAD = _size(0, "pad the error body to about this many bytes")
_RETRY_AFTER = Param(int, None, "Retry-After header in seconds", low=0, high=86_400, nullable=True)
_MS = Param(int, 1000, "milliseconds", low=0, high=MAX_LATENCY_MS)
_SIGMA = Param(
    float,
    None,
    "log-standard-deviation: each answer's delay is its own lognormal draw, "
    "ms * exp(sigma * N(0,1)), median ms (absent or 0: exactly ms)",
    low=0.0,
    high=MAX_SIGMA,
    optional=True,
)

SPECS: Final[Mapping[Kind, KindSpec]] = {
    Kind.HTTP_404: KindSpec("404 with a JSON error body", {"size": _PAD}),
    Kind.HTTP_429: KindSpec(
        "429 with a Retry-After header",
        {"retry_after": attrs.evolve(_RETRY_AFTER, default=1, nullable=False), "size": _PAD},
    ),
    Kind.HTTP_500: KindSpec("500 with a JSON error body", {"size": _PAD}),
    Kind.HTTP_503: KindSpec(
        "503, with Retry-After if retry_after is given", {"retry_after": _RETRY_AFTER, "size": _PAD}
    ),
    Kind.HTTP_STATUS: KindSpec(
        "any status 300-599 (a 3xx carries a Location to another supplier)",
        {"status": Param(int, 502, "HTTP status", low=300, high=599), "retry_after": _RETRY_AFTER},
    ),
    Kind.BAD_GZIP: KindSpec("200, Content-Encoding: gzip, body that is not gzip"),
    Kind.OVERSIZED: KindSpec(
        "200, a valid quote padded with JSON whitespace to `size` bytes",
        {"size": _size(10 * MIB, "body size in bytes")},
    ),
    Kind.GZIP_BOMB: KindSpec(
        "200, valid gzip (about 1000:1) of `size` bytes of whitespace, then the quote",
        {"size": _size(50 * MIB, "whitespace before the quote, in bytes")},
    ),
    Kind.TRUNCATED: KindSpec(
        "200 whose Content-Length promises the whole quote; half is sent, then a close"
    ),
    Kind.RESET: KindSpec(
        "TCP reset (RST) before any byte, or after the headers and part of the body",
        {"variant": Param(str, "before", "when to reset", choices=("before", "mid_body"))},
    ),
    Kind.CLOSE: KindSpec("the connection is closed without any answer"),
    Kind.NOT_HTTP: KindSpec("bytes that are not HTTP at all, then close"),
    Kind.HANG: KindSpec("no answer until the client goes away (or its deadline passes: 504)"),
    Kind.LATENCY: KindSpec(
        "the normal answer after `ms` milliseconds, or after a lognormal draw of median `ms` "
        "if `sigma` is given",
        {"ms": _MS, "sigma": _SIGMA},
    ),
    Kind.SLOW_BODY: KindSpec(
        "headers and half the body at once, the rest after `ms` milliseconds", {"ms": _MS}
    ),
    Kind.NOT_JSON: KindSpec(
        "200 whose body is not a JSON object",
        {
            "variant": Param(
                str,
                "html",
                "what is sent instead",
                choices=("html", "text", "empty", "array", "null", "partial"),
            )
        },
    ),
    Kind.WRONG_TYPES: KindSpec(
        "200 with one integer field sent as another JSON type",
        {
            "field": Param(str, "stock", "which field", choices=INT_KEYS),
            "variant": Param(
                str,
                "string",
                "how the integer is sent",
                choices=("string", "bool", "float", "integral_float", "null", "nan", "huge"),
            ),
        },
    ),
    Kind.NEGATIVE: KindSpec(
        "200 with one money or stock field negative",
        {"field": Param(str, "unit_cents", "which field", choices=INT_KEYS)},
    ),
    Kind.EXTRA_KEY: KindSpec('200 with an extra key "warehouse": "FRA-2"'),
    Kind.MISSING_KEY: KindSpec(
        "200 without one key",
        {"field": Param(str, "stock", "which key is left out", choices=QUOTE_KEYS)},
    ),
    Kind.DUPLICATE_KEY: KindSpec(
        "200 whose object repeats a key, the second time with the value 1",
        {"field": Param(str, "unit_cents", "which key is repeated", choices=INT_KEYS)},
    ),
    Kind.WRONG_SUPPLIER: KindSpec("200 naming the next supplier instead of this one"),
    Kind.WRONG_SKU: KindSpec('200 echoing the SKU with "-OTHER" appended'),
    Kind.WRONG_CONTENT_TYPE: KindSpec("200, a valid quote labelled Content-Type: text/plain"),
    Kind.BLIP: KindSpec(
        "the first request of each request id is a 503 with probability p, later ones succeed",
        {"probability": Param(float, 0.1, "chance of a 503", low=0.0, high=1.0)},
    ),
}

BATCH_SPECS: Final[Mapping[BatchKind, KindSpec]] = {
    BatchKind.MALFORMED_ENTRY: KindSpec(
        "batch calls only: 200 whose last part's entry has a value of the wrong type "
        "(its offer's unitCents as a string; a not_found entry's error code as a number)"
    ),
    BatchKind.MISSING_ENTRY: KindSpec("batch calls only: 200 leaving the last part's entry out"),
    BatchKind.SHUFFLED: KindSpec("batch calls only: 200 with the results in reverse request order"),
    BatchKind.WRONG_MPN: KindSpec(
        'batch calls only: 200 whose last part\'s entry names its mpn with "-OTHER" appended'
    ),
}
ALL_SPECS: Final[Mapping[AnyKind, KindSpec]] = {
    **{kind: spec for kind, spec in SPECS.items()},
    **{kind: spec for kind, spec in BATCH_SPECS.items()},
}
"""Every kind of every dialect: what ``PUT``/``POST /faults`` and ``--fault`` accept."""
_KIND_NAMES: Final = {str(kind): kind for kind in ALL_SPECS}


@attrs.frozen
class Fault:
    """One switched-on fault: a kind, how many requests it lasts, and its parameters."""

    kind: AnyKind
    count: int | None = None
    params: Mapping[str, int | float | str | None] = attrs.field(factory=dict)

    def int_param(self, name: str) -> int:
        """The integer parameter ``name`` (validated on construction)."""
        value = self.params[name]
        assert isinstance(value, int)
        return value

    def optional_int_param(self, name: str) -> int | None:
        """The integer parameter ``name``, which may be null."""
        value = self.params.get(name)
        assert value is None or isinstance(value, int)
        return value

    def str_param(self, name: str) -> str:
        """The text parameter ``name``."""
        value = self.params[name]
        assert isinstance(value, str)
        return value

    def float_param(self, name: str) -> float:
        """The number parameter ``name``."""
        value = self.params[name]
        assert isinstance(value, int | float)
        return float(value)

    def optional_float_param(self, name: str) -> float | None:
        """The number parameter ``name``, or ``None`` if it was not given."""
        value = self.params.get(name)
        assert value is None or isinstance(value, int | float)
        return None if value is None else float(value)

    def to_json(self) -> dict[str, object]:
        """The fault as the control API shows and accepts it."""
        return {"kind": str(self.kind), "count": self.count, **self.params}


def _check_value(name: str, param: Param, value: object, problems: list[str]) -> None:
    if value is None:
        if not param.nullable:
            problems.append(f"{name}: must not be null")
        return
    if param.type is int:
        if type(value) is not int:
            problems.append(f"{name}: must be an integer")
            return
    elif param.type is float:
        if not isinstance(value, int | float) or isinstance(value, bool):
            problems.append(f"{name}: must be a number")
            return
        if not math.isfinite(value):
            problems.append(f"{name}: must be finite")
            return
    elif type(value) is not str:
        problems.append(f"{name}: must be a string")
        return
    if param.choices and value not in param.choices:
        problems.append(f"{name}: must be one of {', '.join(param.choices)}")
    if isinstance(value, int | float):
        if param.low is not None and value < param.low:
            problems.append(f"{name}: must be >= {param.low:g}")
        if param.high is not None and value > param.high:
            problems.append(f"{name}: must be <= {param.high:g}")


def fault_from_json(data: object) -> Fault:
    """Validate a control-API fault object; raise :class:`FaultError` listing every problem."""
    if not isinstance(data, dict):
        raise FaultError(["body: must be a JSON object"])
    problems: list[str] = []
    raw_kind = data.get("kind")
    kind = _KIND_NAMES.get(raw_kind) if isinstance(raw_kind, str) else None
    if kind is None:
        choices = ", ".join(_KIND_NAMES)
        raise FaultError([f"kind: required, one of {choices}"])
    count = data.get("count")
    if count is not None and (type(count) is not int or count < 1):
        problems.append("count: must be a positive integer or null (until cleared)")
    spec = ALL_SPECS[kind]
    params: dict[str, int | float | str | None] = {}
    for name, param in spec.params.items():
        if name in data:
            _check_value(name, param, data[name], problems)
            params[name] = data[name]
        elif not param.optional:
            params[name] = param.default
    unknown = sorted(set(data) - {"kind", "count"} - set(spec.params))
    for name in unknown:
        allowed = ", ".join(spec.params) or "none"
        problems.append(f"{name}: not a parameter of {kind} (parameters: {allowed})")
    if problems:
        raise FaultError(problems)
    assert count is None or isinstance(count, int)
    return Fault(kind=kind, count=count, params=params)


def _convert_text(name: str, text: str, kind: AnyKind) -> object:
    if name == "count":
        return None if text.lower() in ("", "none", "null") else _to_int(name, text)
    param = ALL_SPECS[kind].params.get(name)
    if param is None or param.type is str:
        return text
    if param.nullable and text.lower() in ("none", "null"):
        return None
    if param.type is int:
        return _to_int(name, text)
    try:
        return float(text)
    except ValueError:
        raise FaultError([f"{name}: {text!r} is not a number"]) from None


def _to_int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise FaultError([f"{name}: {text!r} is not an integer"]) from None


def parse_fault_spec(spec: str, suppliers: Sequence[str] = SUPPLIERS) -> tuple[str, Fault]:
    """Parse the CLI form ``SUPPLIER:KIND[:KEY=VALUE,...]`` into a supplier and a fault."""
    supplier, sep, rest = spec.partition(":")
    if not sep or supplier not in suppliers:
        raise FaultError(
            [
                f"{spec!r}: expected SUPPLIER:KIND[:KEY=VALUE,...], supplier one of "
                f"{', '.join(suppliers)}"
            ]
        )
    kind_text, _, options = rest.partition(":")
    data: dict[str, object] = {"kind": kind_text}
    kind = _KIND_NAMES.get(kind_text)
    if kind is None:
        fault_from_json(data)  # raises the "unknown kind" error
        raise AssertionError(kind_text)  # pragma: no cover - it raised
    for item in filter(None, options.split(",")):
        name, eq, value = item.partition("=")
        if not eq:
            raise FaultError([f"{item!r}: expected KEY=VALUE"])
        data[name.strip()] = _convert_text(name.strip(), value.strip(), kind)
    return supplier, fault_from_json(data)


class _Normal(Protocol):
    """What a draw needs of :class:`random.Random`."""

    def normalvariate(self, mu: float = 0.0, sigma: float = 1.0) -> float: ...


def draw_latency_ms(ms: int, sigma: float, rng: _Normal) -> float:
    """One delay of the ``latency`` fault with ``sigma``: ``ms * exp(sigma * Z)``, Z ~ N(0, 1).

    Its median is ``ms``; one draw of ``rng`` per call. Capped at :data:`MAX_LATENCY_MS`
    (computed in logs, so no draw can overflow).
    """
    exponent = sigma * rng.normalvariate(0.0, 1.0)
    if ms <= 0:
        return 0.0
    if exponent >= math.log(MAX_LATENCY_MS / ms):
        return float(MAX_LATENCY_MS)
    return min(ms * math.exp(exponent), float(MAX_LATENCY_MS))


@attrs.define
class _Armed:
    fault: Fault
    remaining: int | None


class FaultTable:
    """The faults switched on for each supplier, consumed one per request."""

    def __init__(self, suppliers: Sequence[str] = SUPPLIERS) -> None:
        self._queues: dict[str, deque[_Armed]] = {s: deque() for s in suppliers}

    def replace(self, supplier: str, fault: Fault) -> None:
        """Make ``fault`` the only fault of ``supplier``."""
        self._queues[supplier].clear()
        self.append(supplier, fault)

    def append(self, supplier: str, fault: Fault) -> None:
        """Queue ``fault`` after the faults ``supplier`` already has."""
        self._queues[supplier].append(_Armed(fault, fault.count))

    def clear(self, supplier: str | None = None) -> None:
        """Clear one supplier's faults, or everybody's."""
        for name, queue in self._queues.items():
            if supplier is None or name == supplier:
                queue.clear()

    def take(self, supplier: str) -> Fault | None:
        """The fault for ``supplier``'s current request, using up one of its shots."""
        queue = self._queues[supplier]
        if not queue:
            return None
        head = queue[0]
        if head.remaining is not None:
            head.remaining -= 1
            if head.remaining <= 0:
                queue.popleft()
        return head.fault

    def snapshot(self) -> dict[str, list[dict[str, object]]]:
        """Every supplier's queue, with the shots each fault has left."""
        return {
            name: [{**armed.fault.to_json(), "remaining": armed.remaining} for armed in queue]
            for name, queue in self._queues.items()
        }
