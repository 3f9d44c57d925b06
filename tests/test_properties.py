"""Property-based tests: whatever a supplier or a caller sends, QuoteFlow answers as designed.

- A supplier's body, any bytes or any JSON, is a valid quote or ``InvalidSupplierData``
  (``invalid_data`` on the wire) — never another exception.
- An inbound body, any bytes or any JSON, is answered 200 or 4xx — never 5xx.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from quoteflow.codec import decode_supplier_quote
from quoteflow.config import SCENARIOS
from quoteflow.errors import InvalidSupplierData
from quoteflow.models import SupplierQuote
from tests.conftest import StartQuoteFlow
from tests.fakes import CATALOGUE, FakeSuppliers, gzipped, json_body, payload, raw

FIELDS = ("supplier", "sku", "unit_cents", "shipping_cents", "stock")
COUNTS = ("unit_cents", "shipping_cents", "stock")

# Bounded on purpose: each property stays well under a second or two.
FAST = settings(max_examples=300, deadline=None, database=None)

ROOMY = {"budget": 2.0, "connect_timeout": 1.0}
"""Time limits no busy test machine reaches: these tests are about what a body is
classified as, and a loop slowed by the other tests must not turn it into
``timeout`` or ``transport_error`` (the fake suppliers share QuoteFlow's loop)."""
END_TO_END = settings(
    max_examples=40,
    deadline=None,
    database=None,
    # One QuoteFlow and one fake supplier server serve every example; each
    # example rescripts the fake, so sharing the function-scoped fixtures is the point.
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def near_quotes(draw: st.DrawFn) -> dict[str, Any]:
    """A valid boreal quote with some fields replaced, dropped or added: near misses."""
    obj: dict[str, Any] = payload("boreal")
    for key in draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=3)):
        obj[key] = draw(json_values | st.sampled_from(["boreal", "atlas", "KB-001", "kb-001"]))
    for key in draw(st.lists(st.sampled_from(FIELDS), unique=True, max_size=2)):
        if draw(st.booleans()):
            del obj[key]
    obj.update(draw(st.dictionaries(st.text(max_size=8), json_values, max_size=2)))
    return obj


def _is_valid_quote(obj: Any, supplier: str, sku: str) -> bool:
    """The contract's rule for a usable payload, written independently of the codec."""
    return (
        type(obj) is dict
        and set(obj) == set(FIELDS)
        and obj["supplier"] == supplier
        and obj["sku"] == sku
        and type(obj["supplier"]) is str
        and type(obj["sku"]) is str
        and all(type(obj[key]) is int and 0 <= obj[key] < 2**53 for key in COUNTS)
    )


def _decode_or_invalid(body: bytes) -> SupplierQuote | None:
    try:
        return decode_supplier_quote(body, supplier="boreal", sku="KB-001")
    except InvalidSupplierData:
        return None


# -- supplier payloads, at the codec ---------------------------------------------------


@FAST
@given(st.binary(max_size=200))
@example(b"[" * 100_000)  # deeper than the recursion limit
@example(b"1" * 5000)  # more digits than int() converts
@example(b'{"supplier": "boreal", "supplier": "boreal"}')
@example(b"\xef\xbb\xbf{}")  # a UTF-8 byte order mark
@example('{"supplier": "boreal"}'.encode("utf-16"))
@example(b'{"sku": "\\ud800"}')  # a lone surrogate
def test_any_bytes_are_a_quote_or_invalid_data(body: bytes) -> None:
    """Any byte string a supplier sends decodes to a quote or raises InvalidSupplierData."""
    _decode_or_invalid(body)


@FAST
@given(json_values | near_quotes())
@example(payload("boreal", unit_cents=True))
@example(payload("boreal", stock=1.0))
@example(payload("boreal", unit_cents="100"))
@example({**payload("boreal"), "sku": None})
@example(payload("boreal", shipping_cents=-1))
@example(payload("boreal", unit_cents=10**30))
@example(payload("boreal", stock=2**53 - 1))
@example(payload("boreal", shipping_cents=2**53))
def test_any_json_is_decoded_exactly_when_valid(obj: Any) -> None:
    """Any JSON value is a quote exactly when the contract calls it valid, else invalid_data."""
    quote = _decode_or_invalid(json.dumps(obj).encode())
    if _is_valid_quote(obj, "boreal", "KB-001"):
        assert quote == SupplierQuote(**obj)
    else:
        assert quote is None


@FAST
@given(near_quotes(), st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400"]))
def test_non_finite_numbers_are_invalid_data(obj: dict[str, Any], number: str) -> None:
    """NaN, Infinity and overflowing numbers anywhere in a payload are never a quote."""
    body = json.dumps({**obj, "unit_cents": "__N__"}).replace('"__N__"', number)
    assert _decode_or_invalid(body.encode()) is None


# -- supplier payloads, end to end through a fake supplier ------------------------------


async def _boreal_code(start_quoteflow: StartQuoteFlow) -> tuple[int, dict[str, Any]]:
    client = await start_quoteflow(**ROOMY)
    response = await client.post("/api/quotes", json={})
    return response.status, await response.json()


@END_TO_END
@given(body=st.binary(max_size=100) | json_values.map(lambda v: json.dumps(v).encode()))
async def test_any_supplier_body_end_to_end(
    body: bytes, start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A supplier answering 200 with any bytes costs only its own quote: ``invalid_data``."""
    suppliers.always("boreal", raw(body))
    client = await start_quoteflow(**ROOMY)
    response = await client.post("/api/quotes", json={})
    assert response.status == 200
    result = await response.json()
    assert result["failures"] == [{"supplier": "boreal", "code": "invalid_data"}]
    assert [q["supplier"] for q in result["quotes"]] == ["atlas"]


@END_TO_END
@given(obj=near_quotes(), compress=st.booleans())
async def test_near_miss_quotes_end_to_end(
    obj: dict[str, Any],
    compress: bool,
    start_quoteflow: StartQuoteFlow,
    suppliers: FakeSuppliers,
) -> None:
    """Near-miss payloads, plain or gzipped, give boreal's quote exactly when valid."""
    suppliers.always("boreal", gzipped(obj) if compress else json_body(obj))
    client = await start_quoteflow(**ROOMY)
    response = await client.post("/api/quotes", json={})
    assert response.status == 200
    result = await response.json()
    boreal = [q for q in result["quotes"] if q["supplier"] == "boreal"]
    failures = [f for f in result["failures"] if f["supplier"] == "boreal"]
    if _is_valid_quote(obj, "boreal", "KB-001"):
        assert failures == []
        assert len(boreal) == (1 if obj["stock"] >= 2 else 0)
    else:
        assert failures == [{"supplier": "boreal", "code": "invalid_data"}]
        assert boreal == []


# -- inbound bodies ---------------------------------------------------------------------

request_values = json_values | st.sampled_from(["KB-001", 2, "normal", "flaky", 100, 0, 101])
inbound_objects = st.dictionaries(
    st.sampled_from(["sku", "quantity", "scenario"]) | st.text(max_size=10),
    request_values,
    max_size=4,
)
valid_requests = st.fixed_dictionaries(
    {},
    optional={
        "sku": st.text(min_size=1, max_size=64),
        "quantity": st.integers(min_value=1, max_value=100),
        "scenario": st.sampled_from(SCENARIOS),
    },
)


@END_TO_END
@given(
    body=st.binary(max_size=300)
    | json_values.map(lambda v: json.dumps(v).encode())
    | inbound_objects.map(lambda v: json.dumps(v).encode())
)
@example(body=b"")
@example(body=b'{"quantity": 2, "quantity": 3}')
@example(body=b'{"quantity": NaN}')
@example(body=b'{"quantity": 1e400}')
@example(body=b'{"sku": "\\ud800"}')
@example(body=b"[" * 100_000)
async def test_any_inbound_body_is_200_or_4xx(body: bytes, start_quoteflow: StartQuoteFlow) -> None:
    """Whatever body a caller posts, the answer is a JSON 200 or 4xx, never a 5xx."""
    client = await start_quoteflow(**ROOMY)
    response = await client.post("/api/quotes", data=body)
    assert response.status in (200, 400, 413, 422)
    answer = await response.json()
    if response.status != 200:
        assert answer["error"] in ("invalid_json", "invalid_request", "request_too_large")


@END_TO_END
@given(request=valid_requests)
async def test_any_valid_request_is_answered(
    request: dict[str, Any], start_quoteflow: StartQuoteFlow
) -> None:
    """Every request the contract allows is answered 200 for the SKU and quantity asked."""
    client = await start_quoteflow(**ROOMY)
    response = await client.post("/api/quotes", json=request)
    assert response.status == 200
    result = await response.json()
    assert result["sku"] == request.get("sku", "KB-001")
    assert result["quantity"] == request.get("quantity", 2)
    assert len(result["quotes"]) + len(result["failures"]) <= len(CATALOGUE)


async def test_lone_surrogate_sku_is_refused(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A SKU with a lone surrogate is a 422: no URL can carry it to a supplier unchanged."""
    client = await start_quoteflow(**ROOMY)
    response = await client.post("/api/quotes", data=b'{"sku": "KB-001\\ud800"}')
    assert response.status == 422
    assert [e["loc"] for e in (await response.json())["detail"]] == [["sku"]]
    assert suppliers.received == []
