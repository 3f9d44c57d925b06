"""The foreign dialects on real sockets: reading, credentials, prices, every fault and scenario."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp.http_exceptions import ContentLengthError

from provider_lab import catalogue
from provider_lab.adapters import AdapterError, json_dialect, path_dialect
from provider_lab.catalogue import Offer, price_breaks
from provider_lab.faults import Kind
from provider_lab.handlers import DATA_KINDS
from tests.lab.conftest import (
    SLOW_MS,
    LabClient,
    StartLab,
    ask,
    ask_json,
    ask_path,
    fetch_token,
    raw_url,
    set_fault,
    stats,
    wait_idle,
)

ATLAS_KB_001 = (
    b'{"partNumber": "KB-001", "currency": "EUR", "priceBreaks": ['
    b'{"minQuantity": 1, "unitPrice": "12.00"}, {"minQuantity": 10, "unitPrice": "10.80"}, '
    b'{"minQuantity": 100, "unitPrice": "9.60"}], "shipping": "3.00", "available": 20}'
)
HOSTILE_SKUS = [
    "A/B?x",
    "..",
    ".",
    "%2F",
    "a b",
    "été/ü",
    "A&key=lab-key&qty=1000",
    "x#frag",
    "+plus+",
    "100%",
    "semi;colon",
    "日本語",
    "tab\there",
]


@pytest.fixture
async def token(lab: LabClient) -> str:
    """A token for the default lab."""
    return await fetch_token(lab)


Ask = Callable[..., Awaitable[tuple[int, bytes]]]


@pytest.fixture(params=["json", "path"])
async def dialect(request: pytest.FixtureRequest, lab: LabClient) -> tuple[str, Ask]:
    """Each foreign dialect's name and a way to ask it (credentials included)."""
    if request.param == "json":
        token = await fetch_token(lab)

        async def ask_json_dialect(*args: Any, **kwargs: Any) -> tuple[int, bytes]:
            return await ask_json(lab, *args, token=token, **kwargs)

        return "json", ask_json_dialect

    async def ask_path_dialect(*args: Any, **kwargs: Any) -> tuple[int, bytes]:
        return await ask_path(lab, *args, **kwargs)

    return "path", ask_path_dialect


def adapted(name: str, body: bytes, supplier: str, sku: str, quantity: int) -> dict[str, Any]:
    """A 200 body through that dialect's adapter, as QuoteFlow would call it, as the classic
    five keys: the ``json`` dialect's offer (its price list, passed through in euros) read at
    ``quantity``'s break, its decimal strings in whole cents (the lab's euros are its cents)."""
    asked = SimpleNamespace(supplier=supplier, sku=sku, quantity=quantity)
    if name == "path":
        return path_dialect(json.loads(body), asked)
    offer: Any = json_dialect(json.loads(body), asked)
    assert offer["currency"] == "EUR"
    unit = [b["unit_price"] for b in offer["breaks"] if b["quantity"] <= quantity][-1]
    return {
        "supplier": offer["supplier"],
        "sku": offer["sku"],
        "unit_cents": exact_cents(unit),
        "shipping_cents": exact_cents(offer["shipping"]),
        "stock": offer["stock"],
    }


def exact_cents(text: str) -> int:
    """A decimal string of euros in whole cents; it must be whole."""
    cents = Decimal(text) * 100
    assert cents == cents.to_integral_value(), text
    return int(cents)


# -- prices --------------------------------------------------------------------------------


def test_price_breaks_are_90_and_80_percent_rounded_half_up() -> None:
    """1+ is the unit price; 10+ is 90 % and 100+ 80 %, rounded to whole cents, half up."""
    assert price_breaks(Offer(1200, 300, 20)) == ((1, 1200), (10, 1080), (100, 960))
    assert price_breaks(Offer(1235, 0, 1)) == ((1, 1235), (10, 1112), (100, 988))  # 1111.5 up
    assert price_breaks(Offer(1234, 0, 1)) == ((1, 1234), (10, 1111), (100, 987))
    assert price_breaks(Offer(5, 0, 1)) == ((1, 5), (10, 5), (100, 4))  # 4.5 up, 4.0


async def test_json_answer_is_byte_for_byte_the_documented_one(lab: LabClient, token: str) -> None:
    """atlas ``KB-001``: the price list exactly as docs/provider-lab.md shows it."""
    for quantity in (1, 10, 100):  # the quantity does not change the list, only its use
        assert await ask_json(lab, "atlas", quantity=quantity, token=token) == (200, ATLAS_KB_001)


@pytest.mark.parametrize(("quantity", "unit"), [(1, 1200), (9, 1200), (10, 1080), (100, 960)])
async def test_path_answer_is_priced_for_the_quantity(
    lab: LabClient, quantity: int, unit: int
) -> None:
    """``unitPriceCents`` is the break for ``qty``, from the same breaks as the json dialect."""
    status, body = await ask_path(lab, "atlas", qty=quantity)
    assert status == 200
    assert (
        body
        == (
            f'{{"part": "KB-001", "qty": {quantity}, "unitPriceCents": {unit}, '
            f'"freightCents": 300, "onHand": 20}}'
        ).encode()
    )


@pytest.mark.parametrize("names", [None, ("north", "south")])
async def test_both_dialects_price_every_offer_as_the_classic_one(
    start_lab: StartLab, names: tuple[str, ...] | None
) -> None:
    """Every supplier and SKU, at 1, 10 and 100 units: the adapters' quotes are the classic
    offer at that quantity's break (the table's suppliers and derived ones alike)."""
    lab = await start_lab() if names is None else await start_lab(suppliers=names)
    token = await fetch_token(lab)
    suppliers = names or catalogue.SUPPLIERS
    for supplier in suppliers:
        for sku in ("KB-001", "MS-010", "MN-270", "CB-404", "HOT-01", "HOT-50"):
            status, classic = await ask(lab, supplier, sku)
            if status == 404:
                assert (await ask_json(lab, supplier, sku, token=token))[0] == 404
                assert (await ask_path(lab, supplier, sku))[0] == 404
                continue
            offer = json.loads(classic)
            for quantity, percent in ((1, 100), (10, 90), (100, 80)):
                expected = {
                    **offer,
                    "unit_cents": (offer["unit_cents"] * percent + 50) // 100,
                }
                status, body = await ask_json(lab, supplier, sku, quantity, token=token)
                assert adapted("json", body, supplier, sku, quantity) == expected
                status, body = await ask_path(lab, supplier, sku, quantity)
                assert adapted("path", body, supplier, sku, quantity) == expected


# -- json: reading and the bearer ----------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token", "Bearer ", "Basic cXVvdGVmbG93OmxhYi1zZWNyZXQ=", "Bearer"],
)
async def test_json_without_a_valid_token_is_401_invalid_token(
    lab: LabClient, authorization: str | None
) -> None:
    """Missing, unknown or another scheme: 401, RFC 6750's challenge, counted ``invalid_token``."""
    headers = {} if authorization is None else {"Authorization": authorization}
    order = {"items": [{"partNumber": "KB-001", "quantity": 1}]}
    async with lab.post("/json/boreal/quote", json=order, headers=headers) as response:
        assert response.status == 401
        assert response.headers["WWW-Authenticate"] == 'Bearer error="invalid_token"'
        assert await response.json() == {"error": "invalid_token"}
    current = await stats(lab)
    assert (current["total"], current["answers"]["boreal"]) == (1, {"invalid_token": 1})


async def test_the_bearer_scheme_is_case_insensitive(lab: LabClient, token: str) -> None:
    """``bearer`` and ``BEARER`` name the same scheme (RFC 7235)."""
    for scheme in ("bearer", "BEARER"):
        headers = {"Authorization": f"{scheme} {token}"}
        order = {"items": [{"partNumber": "KB-001", "quantity": 1}]}
        async with lab.post("/json/boreal/quote", json=order, headers=headers) as response:
            assert response.status == 200


async def test_credentials_are_checked_before_latency_and_faults(
    lab: LabClient, token: str
) -> None:
    """A refused request is counted but neither waits the latency nor uses up a fault."""
    await set_fault(lab, "boreal", kind="http_503", count=1)
    async with lab.put("/latency", json={"ms": 300}) as response:
        assert response.status == 200
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await ask_json(lab, token=None))[0] == 401
    assert (await ask_path(lab, key="wrong"))[0] == 403
    assert loop.time() - started < 0.3
    assert (await ask_json(lab, token=token))[0] == 503  # the fault was still there
    assert (await ask_json(lab, token=token))[0] == 200


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b"{not json", "body: not JSON"),
        (b"\xff\xfe", "body: not JSON"),
        (b'{"items": [{"partNumber": "KB-001", "quantity": NaN}]}', "body: not JSON"),
        (b'{"items": [], "items": []}', "body: not JSON"),
        (b"[]", "body: must be a JSON object"),
        (b'{"items": []}', "items: must be a list of exactly one item"),
        (b'{"items": {"partNumber": "KB-001", "quantity": 1}}', "items: must be a list"),
        (
            b'{"items": [{"partNumber": "KB-001", "quantity": 1}, '
            b'{"partNumber": "MN-270", "quantity": 1}]}',
            "items: must be a list of exactly one item",
        ),
        (b'{"items": [{"partNumber": "KB-001"}]}', "items[0]: must be"),
        (b'{"items": [{"partNumber": "KB-001", "quantity": 1, "x": 1}]}', "items[0]: must be"),
        (b'{"items": ["KB-001"]}', "items[0]: must be"),
        (b'{"items": [{"partNumber": 1, "quantity": 1}]}', "items[0].partNumber"),
        (b'{"items": [{"partNumber": "KB-001", "quantity": "2"}]}', "items[0].quantity"),
        (b'{"items": [{"partNumber": "KB-001", "quantity": 2.0}]}', "items[0].quantity"),
        (b'{"items": [{"partNumber": "KB-001", "quantity": true}]}', "items[0].quantity"),
        (b'{"items": [{"partNumber": "KB-001", "quantity": 0}]}', "items[0].quantity"),
        (b'{"items": [{"partNumber": "KB-001", "quantity": -3}]}', "items[0].quantity"),
        (b'{"items": [{"partNumber": "KB-001", "quantity": 1}], "scenario": "x"}', "scenario"),
        (b'{"items": [{"partNumber": "KB-001", "quantity": 1}], "scenario": 1}', "scenario"),
        (b'{"items": [{"partNumber": "KB-001", "quantity": 1}], "sku": "x"}', "sku: not a field"),
    ],
)
async def test_json_bodies_not_of_the_order_shape_are_400(
    lab: LabClient, token: str, body: bytes, detail: str
) -> None:
    """Anything but ``{"items": [one item], "scenario"?}`` is 400 ``bad_request``, not counted."""
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    async with lab.post("/json/boreal/quote", data=body, headers=headers) as response:
        assert response.status == 400
        answer = await response.json()
    assert answer["error"] == "bad_request"
    assert detail in answer["detail"], answer
    assert (await stats(lab))["total"] == 0


async def test_json_wants_a_json_content_type(lab: LabClient, token: str) -> None:
    """The order must be labelled ``application/json`` (a charset is fine)."""
    order = b'{"items": [{"partNumber": "KB-001", "quantity": 1}]}'
    for content_type, status in (("text/plain", 400), ("application/json; charset=utf-8", 200)):
        headers = {"Authorization": f"Bearer {token}", "Content-Type": content_type}
        async with lab.post("/json/boreal/quote", data=order, headers=headers) as response:
            assert response.status == status


async def test_json_unknown_supplier_sku_and_method(lab: LabClient, token: str) -> None:
    """An unknown supplier or SKU is 404; the dialect takes ``POST`` only."""
    status, body = await ask_json(lab, "zephyr", token=token)
    assert (status, json.loads(body)["error"]) == (404, "unknown_supplier")
    assert await ask_json(lab, "boreal", "MS-010", token=token) == (
        404,
        b'{"error": "unknown_sku"}',
    )
    async with lab.get("/json/boreal/quote") as response:
        assert response.status == 405


@pytest.mark.parametrize("sku", HOSTILE_SKUS)
async def test_json_skus_arrive_intact(
    lab: LabClient, token: str, sku: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whatever a SKU holds, the body carries it and the answer echoes it."""
    monkeypatch.setitem(catalogue.CATALOGUE, sku, catalogue.CATALOGUE["KB-001"])
    status, body = await ask_json(lab, "atlas", sku, 10, token=token)
    assert status == 200, body
    assert adapted("json", body, "atlas", sku, 10)["unit_cents"] == 1080


# -- path: the SKU segment and the key -----------------------------------------------------


@pytest.mark.parametrize("sku", HOSTILE_SKUS)
async def test_path_hostile_skus_arrive_intact(
    lab: LabClient, sku: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A percent-encoded segment is one SKU, decoded by the lab: ``A%2FB%3Fx`` is ``A/B?x``,
    ``%2E%2E`` is ``..``, ``%252F`` is ``%2F``; none of them moves the path or the query."""
    monkeypatch.setitem(catalogue.CATALOGUE, sku, catalogue.CATALOGUE["KB-001"])
    status, body = await ask_path(lab, "atlas", sku, 10)
    assert status == 200, body
    assert json.loads(body)["part"] == sku
    assert adapted("path", body, "atlas", sku, 10)["unit_cents"] == 1080


@pytest.mark.parametrize(
    ("segment", "sku"),
    [("A%2FB%3Fx", "A/B?x"), ("%2E%2E", ".."), ("%252F", "%2F"), ("a%20b", "a b"), ("a+b", "a+b")],
)
async def test_path_segment_decoding(
    lab: LabClient, segment: str, sku: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The raw segments, as sent: ``%2F`` decoded inside the segment, ``+`` stays a plus."""
    monkeypatch.setitem(catalogue.CATALOGUE, sku, catalogue.CATALOGUE["KB-001"])
    status, body = await ask_path(lab, "cedar", segment=segment)
    assert (status, json.loads(body)["part"]) == (200, sku)


@pytest.mark.parametrize(
    ("segment", "detail"),
    [
        ("..", "dot segment"),
        (".", "dot segment"),
        ("100%", "'%' not followed by two hex digits"),
        ("%ZZ", "'%' not followed by two hex digits"),
        ("%FF", "not UTF-8"),
    ],
)
async def test_path_segments_no_client_should_send_are_400(
    lab: LabClient, segment: str, detail: str
) -> None:
    """An unencoded dot segment or a broken escape is refused, not guessed at."""
    status, body = await ask_path(lab, segment=segment)
    assert status == 400
    assert json.loads(body)["error"] == "bad_request"
    assert detail in json.loads(body)["detail"]


@pytest.mark.parametrize("qty", [None, "", "0", "-1", "1.5", "2 ", "+2", "abc", "١", "99999999999"])
async def test_path_missing_or_invalid_qty_is_400(lab: LabClient, qty: str | None) -> None:
    """``qty`` is required, an integer 1–10⁹ in ASCII digits; else 400, not counted."""
    status, body = await ask_path(lab, qty=qty)
    assert status == 400
    assert json.loads(body) == {
        "error": "bad_request",
        "detail": "qty: required, an integer 1–1000000000",
    }
    assert (await stats(lab))["total"] == 0


async def test_path_repeated_parameters_and_bad_scenario_are_400(lab: LabClient) -> None:
    """``qty``, ``key`` or ``scenario`` given twice, or an unknown scenario: 400."""
    for query in (
        "qty=1&qty=2&key=lab-key",
        "qty=1&key=lab-key&key=x",
        "qty=1&key=lab-key&scenario=x",
    ):
        async with lab.session.get(raw_url(lab, f"/path/boreal/parts/KB-001/price?{query}")) as r:
            assert r.status == 400
            assert (await r.json())["error"] == "bad_request"


@pytest.mark.parametrize("key", [None, "", "wrong", "LAB-KEY", "lab-key "])
async def test_path_wrong_or_missing_key_is_403(lab: LabClient, key: str | None) -> None:
    """Not exactly the lab's key: 403 ``invalid_api_key``, counted as such."""
    assert await ask_path(lab, key=key) == (403, b'{"error": "invalid_api_key"}')
    current = await stats(lab)
    assert (current["total"], current["answers"]["boreal"]) == (1, {"invalid_api_key": 1})


async def test_api_key_changes_live_and_is_never_shown(lab: LabClient) -> None:
    """``PUT /api-key`` replaces the key at once; ``GET /api-key`` says only whether one is set."""
    async with lab.get("/api-key") as response:
        assert await response.text() == '{"set": true}'
    async with lab.put("/api-key", json={"value": "k/é y"}) as response:
        assert (response.status, await response.text()) == (200, '{"set": true}')
    assert (await ask_path(lab, key="lab-key"))[0] == 403
    assert (await ask_path(lab, key="k/é y"))[0] == 200
    async with lab.put("/api-key", json={"value": None}) as response:
        assert await response.json() == {"set": False}
    assert (await ask_path(lab, key="k/é y"))[0] == 403
    async with lab.get("/api-key") as response:
        assert await response.json() == {"set": False}


@pytest.mark.parametrize("body", [{"value": ""}, {"value": 5}, {"value": "a\nb"}, {"key": "x"}, []])
async def test_invalid_api_key_settings_are_422(lab: LabClient, body: Any) -> None:
    """The key must be 1–256 printable characters (or null); nothing changes otherwise."""
    async with lab.put("/api-key", json=body) as response:
        assert (response.status, (await response.json())["error"]) == (422, "invalid_api_key")
    assert (await ask_path(lab))[0] == 200


async def test_start_up_api_key_comes_from_the_config(start_lab: StartLab) -> None:
    """``LabConfig(api_key=...)`` (the CLI's ``--api-key``) is the key."""
    lab = await start_lab(api_key="from-cli")
    assert (await ask_path(lab))[0] == 403
    assert (await ask_path(lab, key="from-cli"))[0] == 200


async def test_path_unknown_supplier_and_sku(lab: LabClient) -> None:
    """An unknown supplier or SKU is 404."""
    status, body = await ask_path(lab, "zephyr")
    assert (status, json.loads(body)["error"]) == (404, "unknown_supplier")
    assert await ask_path(lab, "boreal", "MS-010") == (404, b'{"error": "unknown_sku"}')


# -- every fault and scenario, through each dialect ----------------------------------------


async def test_status_faults(lab: LabClient, dialect: tuple[str, Ask]) -> None:
    """``http_503`` and ``http_429`` answer as they do for the classic dialect."""
    _, ask_it = dialect
    await set_fault(lab, "boreal", kind="http_503", count=1)
    await set_fault(lab, "boreal", kind="http_429", count=1, append=True)
    assert await ask_it() == (503, b'{"error": "injected_http_503"}')
    assert (await ask_it())[0] == 429
    assert (await ask_it())[0] == 200


async def test_truncated_is_a_content_length_error(
    lab: LabClient, dialect: tuple[str, Ask]
) -> None:
    """``truncated``: half the dialect's body, then a close."""
    _, ask_it = dialect
    await set_fault(lab, "boreal", kind="truncated", count=1)
    with pytest.raises(aiohttp.ClientPayloadError) as caught:
        await ask_it()
    assert isinstance(caught.value.__cause__, ContentLengthError)
    assert (await ask_it())[0] == 200


async def test_reset_is_a_connection_error(lab: LabClient, dialect: tuple[str, Ask]) -> None:
    """``reset``: a TCP RST instead of an answer."""
    _, ask_it = dialect
    await set_fault(lab, "boreal", kind="reset", count=1)
    with pytest.raises(aiohttp.ClientConnectionError):
        await ask_it()


@pytest.mark.parametrize(
    "fault",
    [
        {"kind": "latency", "ms": 30},
        {"kind": "slow_body", "ms": 30},
        {"kind": "oversized", "size": 20_000},
        {"kind": "gzip_bomb", "size": 100_000},
        {"kind": "wrong_content_type"},
        {"kind": "blip", "probability": 0.0},
    ],
)
async def test_faults_that_deliver_a_valid_quote_deliver_the_dialects(
    lab: LabClient, dialect: tuple[str, Ask], fault: dict[str, Any]
) -> None:
    """Late, slow, padded, compressed or mislabelled: still the dialect's own valid quote."""
    name, ask_it = dialect
    await set_fault(lab, "atlas", **fault)
    status, body = await ask_it("atlas", "KB-001", 10)
    assert status == 200
    quote = adapted(name, body.strip(), "atlas", "KB-001", 10)
    assert (quote["unit_cents"], quote["shipping_cents"], quote["stock"]) == (1080, 300, 20)


@pytest.mark.parametrize("kind", sorted(DATA_KINDS - {Kind.WRONG_CONTENT_TYPE}))
async def test_data_faults_give_bodies_the_dialects_adapter_refuses(
    lab: LabClient, dialect: tuple[str, Ask], kind: Kind
) -> None:
    """Each data-corrupting kind is a 200 that no strict adapter of the dialect accepts."""
    name, ask_it = dialect
    await set_fault(lab, "atlas", kind=str(kind))
    status, body = await ask_it("atlas", "KB-001", 10)
    assert status == 200
    with pytest.raises((json.JSONDecodeError, AdapterError)):
        adapted(name, body, "atlas", "KB-001", 10)


async def test_a_redirect_points_at_the_next_supplier_in_the_same_dialect(
    lab: LabClient, dialect: tuple[str, Ask]
) -> None:
    """A 3xx's ``Location`` is the same question to the next supplier, in this dialect."""
    name, _ = dialect
    await set_fault(lab, "boreal", kind="http_status", status=307)
    if name == "json":
        headers = {"Authorization": f"Bearer {await fetch_token(lab)}"}
        order = {"items": [{"partNumber": "KB-001", "quantity": 2}]}
        async with lab.post(
            "/json/boreal/quote", json=order, headers=headers, allow_redirects=False
        ) as response:
            location = response.headers["Location"]
        assert location == "/json/cedar/quote"
    else:
        url = raw_url(lab, "/path/boreal/parts/A%2FB/price?qty=2&key=lab-key")
        async with lab.session.get(url, allow_redirects=False) as response:
            location = response.headers["Location"]
        assert location == "/path/cedar/parts/A%2FB/price?qty=2&key=lab-key"


async def test_a_passed_deadline_is_a_504(lab: LabClient, dialect: tuple[str, Ask]) -> None:
    """``X-Deadline-Remaining-Ms`` stops a hanging answer as in the classic dialect."""
    _, ask_it = dialect
    await set_fault(lab, "boreal", kind="hang")
    status, body = await ask_it(**{"X-Deadline-Remaining-Ms": "20"})
    assert (status, json.loads(body)["error"]) == (504, "deadline_passed")


async def test_scenario_flaky(lab: LabClient, dialect: tuple[str, Ask]) -> None:
    """``flaky``: 503 at the first sight of a request id, the dialect's quote afterwards."""
    name, ask_it = dialect
    assert (await ask_it(scenario="flaky", request_id="f1"))[0] == 503
    status, body = await ask_it("boreal", "KB-001", 10, scenario="flaky", request_id="f1")
    assert status == 200
    assert adapted(name, body, "boreal", "KB-001", 10)["unit_cents"] == 990
    assert (await ask_it(scenario="flaky"))[0] == 503  # no id: always a first sight


async def test_scenario_slow(lab: LabClient, dialect: tuple[str, Ask]) -> None:
    """``slow``: the dialect's quote after the slow time."""
    name, ask_it = dialect
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, body = await ask_it(scenario="slow")
    assert (status, loop.time() - started >= SLOW_MS / 1000) == (200, True)
    assert adapted(name, body, "boreal", "KB-001", 1)["unit_cents"] == 1100


async def test_scenarios_broken_and_malformed(lab: LabClient, dialect: tuple[str, Ask]) -> None:
    """``broken`` is a 503; ``malformed`` a 200 the dialect's adapter refuses."""
    name, ask_it = dialect
    assert await ask_it(scenario="broken") == (503, b'{"error": "scenario_broken"}')
    status, body = await ask_it(scenario="malformed")
    assert status == 200
    with pytest.raises(AdapterError, match="unitPrice"):
        adapted(name, body, "boreal", "KB-001", 1)
    assert (await ask_it("atlas", scenario="broken"))[0] == 200  # boreal's scenarios only


async def test_cache_control_goes_on_dialect_answers_too(
    lab: LabClient, dialect: tuple[str, Ask]
) -> None:
    """A supplier's ``Cache-Control`` is on its answers in every dialect."""
    name, _ = dialect
    async with lab.put("/cache-control/boreal", json={"value": "max-age=5"}) as response:
        assert response.status == 200
    if name == "json":
        headers = {"Authorization": f"Bearer {await fetch_token(lab)}"}
        order = {"items": [{"partNumber": "KB-001", "quantity": 1}]}
        async with lab.post("/json/boreal/quote", json=order, headers=headers) as response:
            assert response.headers["Cache-Control"] == "max-age=5"
    else:
        url = raw_url(lab, "/path/boreal/parts/KB-001/price?qty=1&key=lab-key")
        async with lab.session.get(url) as response:
            assert response.headers["Cache-Control"] == "max-age=5"


# -- /stats --------------------------------------------------------------------------------


async def test_stats_count_every_dialect_alike(lab: LabClient, token: str) -> None:
    """Requests in all three dialects count per supplier, per request id, with their headers."""
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    trace = {"X-Attempt": "1", "X-Deadline-Remaining-Ms": "780", "traceparent": parent}
    await ask(lab, "boreal", request_id="r1")
    await ask_json(lab, "boreal", "KB-001", 1, token=token, request_id="r1", **trace)
    await ask_json(lab, "boreal", token=None, request_id="r1")
    await ask_path(lab, "atlas", request_id="r1", **{"X-Attempt": "2"})
    await ask_path(lab, "atlas", key="nope", request_id="r2")
    await ask_path(lab, "cedar", "MS-010", scenario="flaky", request_id="r2")
    current = await wait_idle(lab)
    assert current["total"] == 6
    assert current["per_supplier"] == {"atlas": 2, "boreal": 3, "cedar": 1}
    assert current["answers"] == {
        "atlas": {"ok": 1, "invalid_api_key": 1},
        "boreal": {"ok": 2, "invalid_token": 1},
        "cedar": {"ok": 1},  # flaky is boreal's
    }
    assert current["attempts_per_supplier"] == {
        "r1": {"boreal": 3, "atlas": 1},
        "r2": {"atlas": 1, "cedar": 1},
    }
    assert current["headers"]["r1"][1] == {
        "supplier": "boreal",
        "x_attempt": "1",
        "x_deadline_remaining_ms": "780",
        "traceparent": parent,
    }
    assert current["headers"]["r1"][3]["x_attempt"] == "2"


async def test_the_dialects_serve_any_names(start_lab: StartLab) -> None:
    """A lab serving other names answers them in every dialect, with their scenarios."""
    lab = await start_lab(suppliers=("north", "south"))
    token = await fetch_token(lab)
    assert (await ask_json(lab, "north", token=token))[0] == 200
    assert (await ask_path(lab, "south", scenario="broken"))[0] == 503
    assert (await ask_path(lab, "boreal"))[0] == 404
