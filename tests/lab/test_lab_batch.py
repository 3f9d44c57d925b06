"""The batch dialect on real sockets: many parts per call, its own faults, its adapter."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.http_exceptions import ContentLengthError
from aiohttp.typedefs import Handler
from pytest_aiohttp import AiohttpClient

from provider_lab import catalogue, cli
from provider_lab.adapters import AdapterError, batch_dialect
from provider_lab.app import create_app
from provider_lab.control_client import LabControl
from provider_lab.faults import BatchKind, FaultError, Kind, parse_fault_spec
from provider_lab.handlers import DATA_KINDS
from provider_lab.state import LabConfig
from tests.lab.conftest import (
    SLOW_MS,
    LabClient,
    StartLab,
    ask,
    raw_url,
    set_fault,
    stats,
    wait_idle,
)

Parts = Sequence[tuple[str, int]]
THREE: Parts = (("KB-001", 10), ("MN-270", 1), ("HOT-01", 100))
"""Atlas sells all three: 10+ break of 1200, 1+ of 18900, 100+ of 1010 (808)."""
THREE_OFFERS = [
    {"unitCents": 1080, "shippingCents": 300, "stock": 20},
    {"unitCents": 18900, "shippingCents": 0, "stock": 5},
    {"unitCents": 808, "shippingCents": 300, "stock": 40},
]


@dataclass(frozen=True)
class Line:
    """A line of a call as QuoteFlow might pass it: any object with the three attributes."""

    supplier: str
    sku: str
    quantity: int


def lines(parts: Parts, supplier: str = "atlas") -> list[Line]:
    """The call's lines, one per part."""
    return [Line(supplier, mpn, qty) for mpn, qty in parts]


def quoted(parts: Parts, supplier: str = "atlas") -> dict[str, Any]:
    """Each part's five keys as the classic offer at its quantity's break."""
    found: dict[str, Any] = {}
    for mpn, qty in parts:
        offer = catalogue.lookup(supplier, mpn)
        assert offer is not None
        found[mpn] = {
            "supplier": supplier,
            "sku": mpn,
            "unit_cents": catalogue.break_price(offer, qty),
            "shipping_cents": offer.shipping_cents,
            "stock": offer.stock,
        }
    return found


class NotStrictJSON(ValueError):
    """A body QuoteFlow's decoder refuses: a repeated key, or ``NaN``/``Infinity``."""


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        raise NotStrictJSON("a key is repeated")
    return found


def _no_constant(name: str) -> Any:
    raise NotStrictJSON(f"{name} is not JSON")


def strict(body: bytes) -> Any:
    """A body decoded as QuoteFlow decodes a supplier's: no repeated keys, no NaN."""
    return json.loads(body, object_pairs_hook=_no_repeats, parse_constant=_no_constant)


async def ask_batch(
    lab: LabClient,
    supplier: str = "atlas",
    parts: Parts = THREE,
    /,
    *,
    scenario: str | None = None,
    request_id: str | None = None,
    **headers: str,
) -> tuple[int, bytes]:
    """``POST /batch/{supplier}/match`` for ``parts``; the status and the raw body."""
    order: dict[str, Any] = {"parts": [{"mpn": mpn, "qty": qty} for mpn, qty in parts]}
    if scenario is not None:
        order["scenario"] = scenario
    if request_id is not None:
        headers["X-Request-ID"] = request_id
    async with lab.post(f"/batch/{supplier}/match", json=order, headers=headers) as response:
        return response.status, await response.read()


async def ask_delimited(lab: LabClient, query: str, supplier: str = "atlas") -> tuple[int, bytes]:
    """``GET /batch/{supplier}/parts?QUERY``, the query sent exactly as written."""
    async with lab.session.get(raw_url(lab, f"/batch/{supplier}/parts?{query}")) as response:
        return response.status, await response.read()


def entries(body: bytes) -> list[dict[str, Any]]:
    """The ``results`` of a batch answer."""
    results: list[dict[str, Any]] = strict(body)["results"]
    return results


# -- good answers --------------------------------------------------------------------------


async def test_a_batch_is_priced_part_by_part_in_request_order(lab: LabClient) -> None:
    """One result per part, in order, each priced for its own quantity from the classic offer."""
    status, body = await ask_batch(lab)
    assert status == 200
    assert entries(body) == [
        {"mpn": mpn, "qty": qty, "offer": offer}
        for (mpn, qty), offer in zip(THREE, THREE_OFFERS, strict=True)
    ]
    assert body.startswith(b'{"results": [{"mpn": "KB-001", "qty": 10, "offer": {"unitCents": ')
    assert batch_dialect(strict(body), lines(THREE)) == quoted(THREE)


async def test_an_unknown_part_is_a_not_found_entry_of_a_200(lab: LabClient) -> None:
    """A part the supplier does not sell is its entry's error; the call is still a 200."""
    parts = (("KB-001", 1), ("MS-010", 2), ("NOPE", 3))
    status, body = await ask_batch(lab, "boreal", parts)
    assert status == 200
    assert entries(body)[1:] == [
        {
            "mpn": "MS-010",
            "qty": 2,
            "error": {"code": "not_found", "message": "boreal has no part MS-010"},
        },
        {
            "mpn": "NOPE",
            "qty": 3,
            "error": {"code": "not_found", "message": "boreal has no part NOPE"},
        },
    ]
    assert batch_dialect(strict(body), lines(parts, "boreal")) == {
        **quoted(parts[:1], "boreal"),
        "MS-010": "not_found",
        "NOPE": "not_found",
    }
    assert (await stats(lab))["answers"]["boreal"] == {"ok": 1}


@pytest.mark.parametrize("names", [None, ("north", "south")])
async def test_every_supplier_is_priced_as_the_classic_offer(
    start_lab: StartLab, names: tuple[str, ...] | None
) -> None:
    """Table and derived suppliers alike: the adapter's quotes are the classic offer's breaks."""
    lab = await start_lab() if names is None else await start_lab(suppliers=names)
    parts = (("KB-001", 1), ("HOT-50", 10), ("CB-404", 100), ("MN-270", 9))
    for supplier in names or catalogue.SUPPLIERS:
        status, body = await ask_batch(lab, supplier, parts)
        assert status == 200
        assert batch_dialect(strict(body), lines(parts, supplier)) == quoted(parts, supplier)


async def test_an_out_of_stock_part_has_an_alternate_in_stock_at_boreal(lab: LabClient) -> None:
    """CAP-100N: stock 0 everywhere; its alternate CAP-100N-B: boreal's alone, in stock."""
    parts = (("CAP-100N", 10), ("CAP-100N-B", 10))
    stocked = {}
    for supplier in catalogue.SUPPLIERS:
        status, body = await ask_batch(lab, supplier, parts)
        assert status == 200
        own, alternate = entries(body)
        assert own["offer"]["stock"] == 0
        stocked[supplier] = alternate.get("offer", {}).get("stock", 0)
        if supplier != "boreal":
            assert alternate["error"]["code"] == "not_found"
    assert stocked["boreal"] >= 10
    assert catalogue.derived_offer("north", "CAP-100N").stock == 0


async def test_the_delimited_variant_asks_one_quantity_for_every_part(lab: LabClient) -> None:
    """``?pn=A|B|C&qty=N``: the same results, each part at ``N``; ``%7C`` separates too."""
    parts = [(mpn, 10) for mpn in ("KB-001", "NOPE", "HOT-01")]
    status, body = await ask_delimited(lab, "pn=KB-001|NOPE%7CHOT-01&qty=10&scenario=normal")
    assert status == 200
    assert [entry["mpn"] for entry in entries(body)] == ["KB-001", "NOPE", "HOT-01"]
    assert batch_dialect(strict(body), lines(parts)) == {
        "KB-001": quoted(parts[:1])["KB-001"],
        "NOPE": "not_found",
        "HOT-01": quoted(parts[2:])["HOT-01"],
    }
    post_status, post_body = await ask_batch(lab, "atlas", parts)
    assert (post_status, post_body) == (200, body)  # one dialect, two ways to ask it


async def test_unknown_suppliers_and_methods(lab: LabClient) -> None:
    """An unknown supplier is a 404 in both variants; each takes its own method only."""
    for status, body in (
        await ask_batch(lab, "zephyr"),
        await ask_delimited(lab, "pn=KB-001&qty=1", "zephyr"),
    ):
        assert (status, json.loads(body)["error"]) == (404, "unknown_supplier")
    async with lab.get("/batch/atlas/match") as response:
        assert response.status == 405
    async with lab.post("/batch/atlas/parts?pn=KB-001&qty=1") as response:
        assert response.status == 405


# -- reading: 400 and 413 ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "detail"),
    [
        (b"{not json", "body: not JSON"),
        (b'{"parts": [{"mpn": "KB-001", "qty": NaN}]}', "body: not JSON"),
        (b'{"parts": [], "parts": []}', "body: not JSON"),
        (b"[]", "body: must be a JSON object"),
        (b'{"parts": [{"mpn": "KB-001", "qty": 1}], "items": []}', "items: not a field"),
        (b"{}", "parts: must be a non-empty list"),
        (b'{"parts": []}', "parts: must be a non-empty list"),
        (b'{"parts": {"mpn": "KB-001", "qty": 1}}', "parts: must be a non-empty list"),
        (b'{"parts": ["KB-001"]}', "parts[0]: must be"),
        (b'{"parts": [{"mpn": "KB-001"}]}', "parts[0]: must be"),
        (b'{"parts": [{"mpn": "KB-001", "qty": 1, "x": 1}]}', "parts[0]: must be"),
        (b'{"parts": [{"mpn": "A", "qty": 1}, {"mpn": "", "qty": 1}]}', "parts[1].mpn"),
        (b'{"parts": [{"mpn": 7, "qty": 1}]}', "parts[0].mpn: must be a non-empty string"),
        (b'{"parts": [{"mpn": "KB-001", "qty": 0}]}', "parts[0].qty"),
        (b'{"parts": [{"mpn": "KB-001", "qty": "2"}]}', "parts[0].qty"),
        (b'{"parts": [{"mpn": "KB-001", "qty": true}]}', "parts[0].qty"),
        (b'{"parts": [{"mpn": "KB-001", "qty": 2.0}]}', "parts[0].qty"),
        (
            b'{"parts": [{"mpn": "KB-001", "qty": 1}, {"mpn": "KB-001", "qty": 2}]}',
            "parts[1].mpn: 'KB-001' repeats part 0",
        ),
        (b'{"parts": [{"mpn": "KB-001", "qty": 1}], "scenario": "x"}', "scenario"),
    ],
)
async def test_bodies_not_of_the_parts_shape_are_400_not_counted(
    lab: LabClient, body: bytes, detail: str
) -> None:
    """Anything but ``{"parts": [{"mpn", "qty"}, ...], "scenario"?}`` is a 400, not counted."""
    headers = {"Content-Type": "application/json"}
    async with lab.post("/batch/atlas/match", data=body, headers=headers) as response:
        assert response.status == 400
        answer = await response.json()
    assert answer["error"] == "bad_request"
    assert detail in answer["detail"], answer
    current = await stats(lab)
    assert current["total"] == 0
    assert "batch_sizes" not in current


async def test_the_body_must_be_labelled_json(lab: LabClient) -> None:
    """``Content-Type: text/plain`` is a 400; a charset is fine."""
    order = b'{"parts": [{"mpn": "KB-001", "qty": 1}]}'
    for content_type, status in (("text/plain", 400), ("application/json; charset=utf-8", 200)):
        headers = {"Content-Type": content_type}
        async with lab.post("/batch/atlas/match", data=order, headers=headers) as response:
            assert response.status == status


@pytest.mark.parametrize(
    ("query", "detail"),
    [
        ("qty=1", "pn: required"),
        ("pn=KB-001", "qty: required"),
        ("pn=KB-001&qty=0", "qty: required"),
        ("pn=KB-001&qty=1.5", "qty: required"),
        ("pn=KB-001||MN-270&qty=1", "pn[1].mpn: must be a non-empty string"),
        ("pn=KB-001|&qty=1", "pn[1].mpn"),
        ("pn=KB-001|MN-270|KB-001&qty=1", "pn[2]: 'KB-001' repeats part 0"),
        ("pn=KB-001&pn=MN-270&qty=1", "pn: given more than once"),
        ("pn=KB-001&qty=1&qty=2", "qty: given more than once"),
        ("pn=KB-001&qty=1&scenario=x", "scenario"),
        ("pn=KB-001&qty=1&key=lab-key", "key: not a parameter (pn, qty, scenario)"),
    ],
)
async def test_delimited_queries_it_cannot_read_are_400_not_counted(
    lab: LabClient, query: str, detail: str
) -> None:
    """``pn`` and ``qty`` once each, ``scenario`` at most once, nothing else: else a 400."""
    status, body = await ask_delimited(lab, query)
    assert status == 400
    answer = json.loads(body)
    assert answer["error"] == "bad_request"
    assert detail in answer["detail"], answer
    assert (await stats(lab))["total"] == 0


async def test_more_parts_than_max_items_is_a_413_counted_without_a_fault(
    start_lab: StartLab,
) -> None:
    """Past ``batch_max_items``: 413 in both variants, counted ``too_many_parts``, no fault used."""
    lab = await start_lab(batch_max_items=2)
    await set_fault(lab, "atlas", kind="http_503", count=1)
    too_many = {"error": "too_many_parts", "max_items": 2, "parts": 3}
    status, body = await ask_batch(lab, "atlas", THREE)
    assert (status, json.loads(body)) == (413, too_many)
    status, body = await ask_delimited(lab, "pn=A|B|C&qty=1")
    assert (status, json.loads(body)) == (413, too_many)
    assert (await ask_batch(lab, "atlas", THREE[:2]))[0] == 503  # the fault was still there
    assert (await ask_batch(lab, "atlas", THREE[:2]))[0] == 200
    current = await stats(lab)
    assert current["answers"]["atlas"] == {"too_many_parts": 2, "http_503": 1, "ok": 1}
    assert current["batch_sizes"] == {"atlas": {"2": 2, "3": 2}}


def test_max_items_defaults_to_50_and_comes_from_the_command_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``LabConfig.batch_max_items`` is 50 unless ``--batch-max-items`` (1–10 000) says."""
    assert LabConfig().batch_max_items == 50
    started: list[LabConfig] = []

    async def serve(config: LabConfig, host: str, port: int, *, access_log: bool) -> None:
        started.append(config)

    monkeypatch.setattr(cli, "serve", serve)
    assert cli.main(["--batch-max-items", "7"]) == 0
    assert cli.main([]) == 0
    assert [config.batch_max_items for config in started] == [7, 50]
    for bad in ("0", "10001", "x"):
        with pytest.raises(SystemExit):
            cli.build_parser().parse_args(["--batch-max-items", bad])


# -- the batch faults ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        (
            "batch_malformed_entry",
            [
                {"mpn": "KB-001", "qty": 10, "offer": THREE_OFFERS[0]},
                {"mpn": "MN-270", "qty": 1, "offer": THREE_OFFERS[1]},
                {"mpn": "HOT-01", "qty": 100, "offer": {**THREE_OFFERS[2], "unitCents": "808"}},
            ],
        ),
        (
            "batch_missing_entry",
            [
                {"mpn": "KB-001", "qty": 10, "offer": THREE_OFFERS[0]},
                {"mpn": "MN-270", "qty": 1, "offer": THREE_OFFERS[1]},
            ],
        ),
        (
            "batch_wrong_mpn",
            [
                {"mpn": "KB-001", "qty": 10, "offer": THREE_OFFERS[0]},
                {"mpn": "MN-270", "qty": 1, "offer": THREE_OFFERS[1]},
                {"mpn": "HOT-01-OTHER", "qty": 100, "offer": THREE_OFFERS[2]},
            ],
        ),
        (
            "batch_shuffled",
            [
                {"mpn": "HOT-01", "qty": 100, "offer": THREE_OFFERS[2]},
                {"mpn": "MN-270", "qty": 1, "offer": THREE_OFFERS[1]},
                {"mpn": "KB-001", "qty": 10, "offer": THREE_OFFERS[0]},
            ],
        ),
    ],
)
async def test_each_batch_fault_hits_the_last_part_and_keeps_the_others(
    lab: LabClient, kind: str, expected: list[dict[str, Any]]
) -> None:
    """The documented entry is spoiled, the others are exactly the good answer's."""
    good = await ask_batch(lab)
    await set_fault(lab, "atlas", kind=kind, count=1)
    status, body = await ask_batch(lab)
    assert status == 200
    assert entries(body) == expected
    read = batch_dialect(strict(body), lines(THREE))
    whole = quoted(THREE)
    if kind == "batch_shuffled":
        assert read == whole  # matched by mpn, never by position
    else:
        del whole["HOT-01"]
        assert read == whole  # HOT-01's line alone is invalid_data
    assert await ask_batch(lab) == good  # used up
    assert (await stats(lab))["answers"]["atlas"] == {"ok": 2, kind: 1}


async def test_a_malformed_not_found_entry_sends_its_code_as_a_number(lab: LabClient) -> None:
    """``batch_malformed_entry`` on an unknown last part: its error code is ``404``, not text."""
    await set_fault(lab, "atlas", kind="batch_malformed_entry")
    parts = (("KB-001", 1), ("NOPE", 1))
    status, body = await ask_batch(lab, "atlas", parts)
    assert status == 200
    assert entries(body)[1]["error"] == {"code": 404, "message": "atlas has no part NOPE"}
    assert batch_dialect(strict(body), lines(parts)) == quoted(parts[:1])


async def test_a_shuffled_single_part_call_is_unchanged(lab: LabClient) -> None:
    """One part cannot be out of order: ``batch_shuffled`` sends it as it is."""
    await set_fault(lab, "atlas", kind="batch_shuffled")
    assert await ask_batch(lab, "atlas", THREE[:1]) == await ask_delimited(lab, "pn=KB-001&qty=10")


async def test_batch_faults_are_used_up_by_other_dialects_as_no_fault(lab: LabClient) -> None:
    """A classic call takes a batch fault from the queue and is answered normally."""
    await set_fault(lab, "atlas", kind="batch_missing_entry", count=1)
    await set_fault(lab, "atlas", kind="http_500", count=1, append=True)
    status, body = await ask(lab, "atlas")
    assert (status, json.loads(body)["unit_cents"]) == (200, 1200)
    assert (await ask_batch(lab))[0] == 500
    assert len(entries((await ask_batch(lab))[1])) == 3
    assert (await stats(lab))["answers"]["atlas"] == {"ok": 2, "http_500": 1}


async def test_batch_kinds_are_listed_and_switched_like_the_others(lab: LabClient) -> None:
    """``GET /kinds/batch`` lists the four; the control API and ``--fault`` take them."""
    async with lab.get("/kinds/batch") as response:
        kinds = await response.json()
    assert (
        set(kinds)
        == {str(kind) for kind in BatchKind}
        == {
            "batch_malformed_entry",
            "batch_missing_entry",
            "batch_shuffled",
            "batch_wrong_mpn",
        }
    )
    async with lab.get("/kinds") as response:
        assert set(await response.json()) == {str(kind) for kind in Kind}
    async with lab.put("/faults/atlas", json={"kind": "batch_wrong_mpn", "count": 2}) as response:
        assert (await response.json())["faults"] == [
            {"kind": "batch_wrong_mpn", "count": 2, "remaining": 2}
        ]
    async with lab.put("/faults/atlas", json={"kind": "batch_shuffled", "n": 1}) as response:
        assert response.status == 422
    for kind in BatchKind:
        assert parse_fault_spec(f"atlas:{kind}:count=1")[1].kind is kind
    with pytest.raises(FaultError, match=r"kind: required, one of .*batch_shuffled"):
        parse_fault_spec("atlas:batch_nothing")


# -- the shared pipeline: faults, scenarios, contracts, once per call -------------------------


async def test_a_status_fault_answers_the_whole_call(lab: LabClient) -> None:
    """``http_503`` then ``http_429``: each one call, whatever its parts; then the results."""
    await set_fault(lab, "atlas", kind="http_503", count=1)
    await set_fault(lab, "atlas", kind="http_429", count=1, append=True)
    assert await ask_batch(lab) == (503, b'{"error": "injected_http_503"}')
    assert (await ask_delimited(lab, "pn=KB-001|MN-270&qty=1"))[0] == 429
    assert (await ask_batch(lab))[0] == 200


async def test_a_hang_ends_at_the_callers_deadline(lab: LabClient) -> None:
    """``hang`` with ``X-Deadline-Remaining-Ms``: the call's 504, as in every dialect."""
    await set_fault(lab, "atlas", kind="hang")
    status, body = await ask_batch(lab, **{"X-Deadline-Remaining-Ms": "20"})
    assert (status, json.loads(body)["error"]) == (504, "deadline_passed")


async def test_broken_bytes_faults_break_the_batch_body(lab: LabClient) -> None:
    """``reset`` and ``truncated`` cut the call's connection or its results."""
    await set_fault(lab, "atlas", kind="reset", count=1)
    await set_fault(lab, "atlas", kind="truncated", count=1, append=True)
    with pytest.raises(aiohttp.ClientConnectionError):
        await ask_batch(lab)
    with pytest.raises(aiohttp.ClientPayloadError) as caught:
        await ask_batch(lab)
    assert isinstance(caught.value.__cause__, ContentLengthError)
    assert (await ask_batch(lab))[0] == 200


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
async def test_faults_that_deliver_a_valid_answer_deliver_the_results(
    lab: LabClient, fault: dict[str, Any]
) -> None:
    """Late, slow, padded, compressed or mislabelled: still every part's result."""
    await set_fault(lab, "atlas", **fault)
    status, body = await ask_batch(lab)
    assert status == 200
    assert batch_dialect(strict(body.strip()), lines(THREE)) == quoted(THREE)


@pytest.mark.parametrize("kind", sorted(DATA_KINDS - {Kind.WRONG_CONTENT_TYPE}))
async def test_data_faults_spoil_every_offer_and_keep_not_found(lab: LabClient, kind: Kind) -> None:
    """No offered line stays readable (payload or every offer bad); ``not_found`` stays."""
    await set_fault(lab, "atlas", kind=str(kind))
    parts = (*THREE, ("NOPE", 1))
    status, body = await ask_batch(lab, "atlas", parts)
    assert status == 200
    if kind in (Kind.NOT_JSON, Kind.DUPLICATE_KEY):  # the whole payload: every line
        with pytest.raises((json.JSONDecodeError, NotStrictJSON, AdapterError)):
            batch_dialect(strict(body), lines(parts))
        return
    assert batch_dialect(strict(body), lines(parts)) == {"NOPE": "not_found"}
    assert strict(body)["results"][3]["error"]["code"] == "not_found"


@pytest.mark.parametrize(
    ("fault", "spoiled"),
    [
        (
            {"kind": "wrong_types", "field": "shipping_cents", "variant": "float"},
            ("offer", "shippingCents", 300.5),
        ),
        ({"kind": "negative", "field": "stock"}, ("offer", "stock", -20)),
        ({"kind": "missing_key", "field": "unit_cents"}, ("offer", "unitCents", ...)),
        ({"kind": "missing_key", "field": "sku"}, ("mpn", ...)),
        ({"kind": "missing_key", "field": "supplier"}, ("offer", ...)),
        ({"kind": "extra_key"}, ("offer", "warehouse", "FRA-2")),
        ({"kind": "wrong_supplier"}, ("supplier", "boreal")),
        ({"kind": "wrong_sku"}, ("mpn", "KB-001-OTHER")),
    ],
)
async def test_field_faults_change_each_offered_entry_as_documented(
    lab: LabClient, fault: dict[str, Any], spoiled: tuple[Any, ...]
) -> None:
    """A kind that changes one field changes it in every offered entry (the batch keys)."""
    await set_fault(lab, "atlas", **fault)
    status, body = await ask_batch(lab, "atlas", THREE[:1])
    assert status == 200
    expected: dict[str, Any] = {"mpn": "KB-001", "qty": 10, "offer": dict(THREE_OFFERS[0])}
    target = expected
    for step in spoiled[:-2]:
        target = target[step]
    if spoiled[-1] is ...:
        del target[spoiled[-2]]
    else:
        target[spoiled[-2]] = spoiled[-1]
    assert entries(body) == [expected]


async def test_flaky_fails_each_chunk_of_a_request_once(lab: LabClient) -> None:
    """``flaky`` keys on request id and first part: each chunk of a cart 503s once, then 200."""
    first = (("KB-001", 1), ("MN-270", 1))
    second = (("HOT-01", 1), ("HOT-02", 1))
    for chunk in (first, second):
        assert await ask_batch(lab, "boreal", chunk, scenario="flaky", request_id="cart-1") == (
            503,
            b'{"error": "scenario_flaky"}',
        )
    for chunk in (first, second):
        status, body = await ask_batch(lab, "boreal", chunk, scenario="flaky", request_id="cart-1")
        assert status == 200
        assert batch_dialect(strict(body), lines(chunk, "boreal")) == quoted(chunk, "boreal")
    reordered = (first[1], first[0])  # another first part: another first sight
    assert (await ask_batch(lab, "boreal", reordered, scenario="flaky", request_id="cart-1"))[
        0
    ] == 503
    assert (await ask_batch(lab, "boreal", first, scenario="flaky"))[0] == 503  # no id: always
    assert (await ask_batch(lab, "atlas", first, scenario="flaky", request_id="x"))[0] == 200
    assert (await ask(lab, "boreal", scenario="flaky", request_id="cart-1"))[0] == 503


async def test_scenarios_slow_broken_and_malformed(lab: LabClient) -> None:
    """Boreal's ``slow`` is late, ``broken`` a 503, ``malformed`` every ``unitCents`` a string."""
    parts = (("KB-001", 1), ("MS-010", 1))
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert (await ask_batch(lab, "boreal", parts, scenario="slow"))[0] == 200
    assert loop.time() - started >= SLOW_MS / 1000
    assert await ask_batch(lab, "boreal", parts, scenario="broken") == (
        503,
        b'{"error": "scenario_broken"}',
    )
    status, body = await ask_batch(lab, "boreal", parts, scenario="malformed")
    assert status == 200
    assert entries(body)[0]["offer"]["unitCents"] == "1100"
    assert batch_dialect(strict(body), lines(parts, "boreal")) == {"MS-010": "not_found"}
    assert (await ask_batch(lab, "atlas", parts, scenario="broken"))[0] == 200


async def test_a_redirect_is_the_same_call_at_the_next_supplier(lab: LabClient) -> None:
    """A 3xx's ``Location`` is the same variant at the next supplier, the query as sent."""
    await set_fault(lab, "boreal", kind="http_status", status=307, count=2)
    order = {"parts": [{"mpn": "KB-001", "qty": 2}]}
    async with lab.post("/batch/boreal/match", json=order, allow_redirects=False) as response:
        assert response.headers["Location"] == "/batch/cedar/match"
    url = raw_url(lab, "/batch/boreal/parts?pn=A%7CB&qty=2")
    async with lab.session.get(url, allow_redirects=False) as response:
        assert response.headers["Location"] == "/batch/cedar/parts?pn=A%7CB&qty=2"


async def test_a_contract_counts_a_call_once_whatever_its_parts(lab: LabClient) -> None:
    """A rate of 2 calls: two calls of three parts each pass, the third is a 429."""
    async with lab.put("/contracts/atlas", json={"rate": "2/60s"}) as response:
        assert response.status == 200
    assert [(await ask_batch(lab))[0] for _ in range(3)] == [200, 200, 429]
    assert (await stats(lab))["rate_refused"]["atlas"] == 1


async def test_stats_count_one_call_and_its_size(lab: LabClient) -> None:
    """A call counts once, with its size per supplier and per id; no batch call, no batch keys."""
    assert (await ask(lab, "atlas", request_id="r0"))[0] == 200
    assert not {"batch_sizes", "batch_sizes_per_id"} & set(await stats(lab))
    await ask_batch(lab, "atlas", THREE, request_id="cart", **{"X-Attempt": "1"})
    await ask_batch(lab, "atlas", THREE[:1], request_id="cart")
    await ask_delimited(lab, "pn=KB-001|MN-270&qty=1", "cedar")
    current = await wait_idle(lab)
    assert current["total"] == 4
    assert current["per_supplier"] == {"atlas": 3, "boreal": 0, "cedar": 1}
    assert current["attempts_per_supplier"]["cart"] == {"atlas": 2}
    assert current["headers"]["cart"][0]["x_attempt"] == "1"
    assert current["max_in_flight"]["atlas"] == 1
    assert current["batch_sizes"] == {"atlas": {"1": 1, "3": 1}, "cedar": {"2": 1}}
    assert current["batch_sizes_per_id"] == {"cart": {"atlas": [3, 1]}}
    async with lab.get("/stats", params={"summary": "1"}) as response:
        summary = await response.json()
    assert (summary["batch_sizes"]["cedar"], summary["batch_sizes_per_id"]) == ({"2": 1}, {})
    async with lab.post("/reset") as response:
        assert response.status == 200
    assert "batch_sizes" not in await stats(lab)


async def test_the_control_client_reads_batch_sizes(lab: LabClient) -> None:
    """``LabControl.batch_sizes`` and ``batch_sizes_of`` read them, empty before any call."""
    control = LabControl(lab.session, str(lab.make_url("/")))
    assert (await control.batch_sizes("atlas"), await control.batch_sizes_of("c1")) == ({}, {})
    for chunk in (THREE, THREE[:2], THREE):
        await ask_batch(lab, "atlas", chunk, request_id="c1")
    assert await control.batch_sizes("atlas") == {2: 1, 3: 2}
    assert await control.batch_sizes("cedar") == {}
    assert await control.batch_sizes_of("c1") == {"atlas": [3, 2, 3]}


async def test_the_batch_dialect_serves_anyone_and_hides_no_control_path(
    aiohttp_client: AiohttpClient,
) -> None:
    """A peer off this machine may ask ``/batch/``; dot segments after it reach no control path."""

    @web.middleware
    async def from_afar(request: web.Request, handler: Handler) -> web.StreamResponse:
        return await handler(request.clone(remote="203.0.113.9"))

    app = create_app(LabConfig())
    app.middlewares.insert(0, from_afar)
    remote = await aiohttp_client(app)
    assert (await ask_batch(remote))[0] == 200
    assert (await ask_delimited(remote, "pn=KB-001&qty=1"))[0] == 200
    for path in ("/batch/../faults", "/batch/%2E%2E/stats", "/batch/atlas/../../kinds/batch"):
        async with remote.session.get(raw_url(remote, path)) as response:
            assert response.status in (403, 404)
    async with remote.get("/kinds/batch") as response:
        assert response.status == 403


# -- the adapter ---------------------------------------------------------------------------

GOOD: dict[str, Any] = {
    "results": [
        {
            "mpn": "KB-001",
            "qty": 10,
            "offer": {"unitCents": 1080, "shippingCents": 300, "stock": 20},
        },
        {"mpn": "NOPE", "qty": 1, "error": {"code": "not_found", "message": "no such part"}},
    ]
}
GOOD_LINES = [Line("atlas", "KB-001", 10), Line("atlas", "NOPE", 1)]
KB_001 = {
    "supplier": "atlas",
    "sku": "KB-001",
    "unit_cents": 1080,
    "shipping_cents": 300,
    "stock": 20,
}


def with_entry(index: int, change: dict[str, Any], *, drop: Sequence[str] = ()) -> dict[str, Any]:
    """``GOOD`` with entry ``index`` updated by ``change`` and ``drop``'s keys removed."""
    payload = copy.deepcopy(GOOD)
    entry = payload["results"][index]
    entry.update(change)
    for key in drop:
        del entry[key]
    return payload


def test_the_adapter_maps_offers_and_not_found_by_mpn() -> None:
    """Five keys of exact types for an offer, ``"not_found"`` for the error, in any order."""
    assert batch_dialect(GOOD, GOOD_LINES) == {"KB-001": KB_001, "NOPE": "not_found"}
    reversed_payload = {"results": GOOD["results"][::-1]}
    assert batch_dialect(reversed_payload, GOOD_LINES[::-1]) == batch_dialect(GOOD, GOOD_LINES)
    quote = batch_dialect(GOOD, GOOD_LINES)["KB-001"]
    assert isinstance(quote, dict)
    assert [type(value) for value in quote.values()] == [str, str, int, int, int]


@pytest.mark.parametrize(
    ("change", "drop"),
    [
        ({"qty": 1}, ()),
        ({"qty": "10"}, ()),
        ({}, ("qty",)),
        ({"offer": {"unitCents": "1080", "shippingCents": 300, "stock": 20}}, ()),
        ({"offer": {"unitCents": 1080.0, "shippingCents": 300, "stock": 20}}, ()),
        ({"offer": {"unitCents": True, "shippingCents": 300, "stock": 20}}, ()),
        ({"offer": {"unitCents": 1080, "shippingCents": -1, "stock": 20}}, ()),
        ({"offer": {"unitCents": 1080, "shippingCents": 300, "stock": None}}, ()),
        ({"offer": {"unitCents": 1080, "shippingCents": 300}}, ()),
        ({"offer": {"unitCents": 1080, "shippingCents": 300, "stock": 20, "warehouse": "F"}}, ()),
        ({"offer": {"unitCents": 1080, "shippingCents": 300, "stock": 20, "currency": "eur"}}, ()),
        ({"offer": {"unitCents": 1080, "shippingCents": 300, "stock": 20, "moq": 0}}, ()),
        ({"offer": [1080, 300, 20]}, ()),
        ({}, ("offer",)),
        ({"supplier": "boreal"}, ()),
        ({"error": {"code": "not_found", "message": "both"}}, ()),
    ],
)
def test_an_unreadable_entry_is_left_out_and_the_others_kept(
    change: dict[str, Any], drop: Sequence[str]
) -> None:
    """A wrong quantity, key set or number type drops that line alone (its ``invalid_data``)."""
    assert batch_dialect(with_entry(0, change, drop=drop), GOOD_LINES) == {"NOPE": "not_found"}


@pytest.mark.parametrize(
    "error",
    [
        {"code": "discontinued", "message": "gone"},
        {"code": 404, "message": "no such part"},
        {"code": "not_found"},
        {"code": "not_found", "message": 7},
        {"code": "not_found", "message": "x", "retry": True},
        "not_found",
    ],
)
def test_an_error_other_than_not_found_is_left_out(error: Any) -> None:
    """Only ``{"code": "not_found", "message": "..."}`` says the supplier has no such part."""
    assert batch_dialect(with_entry(1, {"error": error}), GOOD_LINES) == {"KB-001": KB_001}


def test_missing_repeated_and_unasked_entries() -> None:
    """A line no entry answers, or answered twice, is left out; a part not asked is ignored."""
    payload = copy.deepcopy(GOOD)
    payload["results"].append({"mpn": "EXTRA", "qty": 1, "error": "anything"})
    payload["results"].append(7)
    asked = [*GOOD_LINES, Line("atlas", "MN-270", 1)]
    assert batch_dialect(payload, asked) == {"KB-001": KB_001, "NOPE": "not_found"}
    payload["results"].append(copy.deepcopy(GOOD["results"][0]))
    assert batch_dialect(payload, asked) == {"NOPE": "not_found"}


@pytest.mark.parametrize(
    "payload",
    [
        None,
        [GOOD],
        "results",
        {},
        {"results": {}},
        {"results": None},
        {"results": [], "next": None},
        {"parts": GOOD["results"]},
    ],
)
def test_an_unreadable_payload_raises(payload: Any) -> None:
    """Not exactly ``{"results": [...]}``: ``AdapterError``, every line ``invalid_data``."""
    with pytest.raises(AdapterError, match=r"payload|results"):
        batch_dialect(payload, GOOD_LINES)


def test_lines_it_cannot_tell_apart_raise() -> None:
    """A SKU asked twice in one call (or not a string) cannot be matched by mpn."""
    with pytest.raises(AdapterError, match="asked"):
        batch_dialect(GOOD, [*GOOD_LINES, Line("atlas", "NOPE", 2)])


def test_the_adapter_is_pure_and_duck_typed() -> None:
    """Any objects with the three attributes, in a list or tuple; the payload is left alone."""
    payload = copy.deepcopy(GOOD)
    first = batch_dialect(payload, tuple(GOOD_LINES))
    assert batch_dialect(payload, GOOD_LINES) == first
    assert payload == GOOD
