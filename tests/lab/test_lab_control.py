"""The control API: loopback only, validated inputs, /stats and /reset."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from aiohttp.typedefs import Handler
from pytest_aiohttp import AiohttpClient

from provider_lab.app import create_app, is_loopback
from provider_lab.faults import Kind
from provider_lab.state import LabConfig
from tests.lab.conftest import (
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


async def put_json(lab: LabClient, path: str, body: Any) -> tuple[int, dict[str, Any]]:
    """``PUT`` a JSON body; the status and the JSON answer."""
    async with lab.put(path, json=body) as response:
        return response.status, await response.json()


# -- loopback only -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("remote", "allowed"),
    [
        ("127.0.0.1", True),
        ("127.10.0.3", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.7", False),
        ("192.168.1.20", False),
        ("::ffff:10.0.0.7", False),
        ("2001:db8::1", False),
        ("", False),
        (None, False),
    ],
)
def test_is_loopback(remote: str | None, allowed: bool) -> None:
    """Only loopback peers (v4, v6, v4-mapped) count as local; anything unparsable does not."""
    assert is_loopback(remote) is allowed


@pytest.fixture
async def remote_lab(aiohttp_client: AiohttpClient) -> TestClient[web.Request, web.Application]:
    """A lab whose peer looks like 203.0.113.9, as behind a proxy that rewrites ``remote``."""

    @web.middleware
    async def from_afar(request: web.Request, handler: Handler) -> web.StreamResponse:
        return await handler(request.clone(remote="203.0.113.9"))

    app = create_app(LabConfig())
    app.middlewares.insert(0, from_afar)
    return await aiohttp_client(app)


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/stats"),
        ("POST", "/reset"),
        ("GET", "/faults"),
        ("PUT", "/faults/boreal"),
        ("POST", "/faults/boreal"),
        ("DELETE", "/faults/boreal"),
        ("DELETE", "/faults"),
        ("GET", "/latency"),
        ("PUT", "/latency"),
        ("GET", "/kinds"),
        ("GET", "/cache-control"),
        ("PUT", "/cache-control/boreal"),
        ("DELETE", "/cache-control"),
        ("GET", "/oauth2"),
        ("PUT", "/oauth2"),
        ("DELETE", "/oauth2/tokens"),
        ("GET", "/oauth2/tokens"),
        ("GET", "/api-key"),
        ("PUT", "/api-key"),
        ("GET", "/contracts"),
        ("PUT", "/contracts/boreal"),
        ("DELETE", "/contracts/boreal"),
        ("DELETE", "/contracts"),
        ("GET", "/no-such-path"),
    ],
)
async def test_control_api_refuses_non_loopback_peers(
    remote_lab: LabClient, method: str, path: str
) -> None:
    """Every control path answers 403 JSON to a non-loopback peer, headers notwithstanding."""
    async with remote_lab.request(
        method, path, json={"kind": "close"}, headers={"X-Forwarded-For": "127.0.0.1"}
    ) as response:
        assert response.status == 403
        assert await response.json() == {"error": "loopback_only", "remote": "203.0.113.9"}
    assert (await ask(remote_lab))[0] == 200  # and nothing was switched on


async def test_suppliers_and_health_serve_any_peer(remote_lab: LabClient) -> None:
    """The suppliers in every dialect, the token endpoint and ``/health`` answer anyone."""
    assert (await ask(remote_lab, "atlas"))[0] == 200
    async with remote_lab.get("/health") as response:
        assert response.status == 200
    token = await fetch_token(remote_lab)
    assert (await ask_json(remote_lab, "atlas", token=token))[0] == 200
    assert (await ask_path(remote_lab, "atlas"))[0] == 200


@pytest.mark.parametrize(
    "path",
    [
        "/json/../faults",
        "/path/../stats",
        "/path/%2E%2E/stats",
        "/quotes/../oauth2",
        "/json/./../api-key",
    ],
)
async def test_public_prefixes_lead_to_no_control_path(remote_lab: LabClient, path: str) -> None:
    """Dot segments after a public prefix are not resolved into a control path."""
    async with remote_lab.session.get(raw_url(remote_lab, path)) as response:
        assert response.status in (403, 404)  # no route, or refused: never the control answer


# -- faults ----------------------------------------------------------------------------------


async def test_faults_listing_shows_queues_and_remaining_shots(lab: LabClient) -> None:
    """``GET /faults`` lists each supplier's queue with the shots left."""
    await set_fault(lab, "boreal", kind="http_429", count=2, retry_after=3)
    await set_fault(lab, "boreal", kind="hang", append=True)
    await ask(lab)
    async with lab.get("/faults") as response:
        assert await response.json() == {
            "atlas": [],
            "boreal": [
                {"kind": "http_429", "count": 2, "retry_after": 3, "size": 0, "remaining": 1},
                {"kind": "hang", "count": None, "remaining": None},
            ],
            "cedar": [],
        }


async def test_put_answers_the_suppliers_queue(lab: LabClient) -> None:
    """``PUT /faults/{supplier}`` answers the supplier's new queue, defaults filled in."""
    status, body = await put_json(lab, "/faults/cedar", {"kind": "latency", "count": 3})
    assert status == 200
    assert body == {
        "supplier": "cedar",
        "faults": [{"kind": "latency", "count": 3, "ms": 1000, "remaining": 3}],
    }


async def test_delete_all_faults(lab: LabClient) -> None:
    """``DELETE /faults`` clears every supplier's faults."""
    for supplier in ("atlas", "boreal", "cedar"):
        await set_fault(lab, supplier, kind="http_500")
    async with lab.delete("/faults") as response:
        assert await response.json() == {"atlas": [], "boreal": [], "cedar": []}
    assert [(await ask(lab, s))[0] for s in ("atlas", "boreal", "cedar")] == [200, 200, 200]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"kind": "meteor"}, "kind: required, one of"),
        ({}, "kind: required"),
        ({"kind": "close", "count": 0}, "count: must be a positive integer"),
        ({"kind": "close", "count": True}, "count: must be a positive integer"),
        ({"kind": "close", "count": "2"}, "count: must be a positive integer"),
        ({"kind": "close", "count": 1.0}, "count: must be a positive integer"),
        ({"kind": "close", "ms": 5}, "ms: not a parameter of close"),
        ({"kind": "latency", "ms": "5"}, "ms: must be an integer"),
        ({"kind": "latency", "ms": -1}, "ms: must be >= 0"),
        ({"kind": "latency", "ms": True}, "ms: must be an integer"),
        ({"kind": "http_429", "retry_after": None}, "retry_after: must not be null"),
        ({"kind": "http_status", "status": 200}, "status: must be >= 300"),
        ({"kind": "blip", "probability": 1.5}, "probability: must be <= 1"),
        ({"kind": "blip", "probability": True}, "probability: must be a number"),
        ({"kind": "wrong_types", "variant": "emoji"}, "variant: must be one of"),
        ({"kind": "missing_key", "field": "price"}, "field: must be one of"),
        (["close"], "body: must be a JSON object"),
    ],
)
async def test_invalid_faults_are_422_with_a_reason(
    lab: LabClient, body: Any, problem: str
) -> None:
    """An unusable fault is refused with 422 ``invalid_fault`` saying which field and why."""
    status, answer = await put_json(lab, "/faults/boreal", body)
    assert status == 422
    assert answer["error"] == "invalid_fault"
    assert any(problem in detail for detail in answer["detail"]), answer
    async with lab.get("/faults") as response:
        assert (await response.json())["boreal"] == []


async def test_every_problem_is_listed(lab: LabClient) -> None:
    """A fault with several problems lists each of them."""
    status, answer = await put_json(
        lab, "/faults/boreal", {"kind": "latency", "count": -1, "ms": "x", "colour": "red"}
    )
    assert status == 422
    assert len(answer["detail"]) == 3


async def test_fault_body_that_is_not_json_is_400(lab: LabClient) -> None:
    """A control body that is not JSON answers 400 ``invalid_json``."""
    async with lab.put("/faults/boreal", data=b"{kind: close") as response:
        assert response.status == 400
        assert (await response.json())["error"] == "invalid_json"


async def test_fault_for_unknown_supplier_is_404(lab: LabClient) -> None:
    """Faults for a supplier the lab does not have answer 404."""
    status, answer = await put_json(lab, "/faults/zephyr", {"kind": "close"})
    assert status == 404
    assert answer["error"] == "unknown_supplier"
    async with lab.delete("/faults/zephyr") as response:
        assert response.status == 404


async def test_kinds_lists_every_kind_with_parameters(lab: LabClient) -> None:
    """``GET /kinds`` documents every kind and its parameters."""
    async with lab.get("/kinds") as response:
        kinds = await response.json()
    assert set(kinds) == {str(k) for k in Kind}
    assert kinds["http_429"]["params"]["retry_after"]["default"] == 1
    assert "string" in kinds["wrong_types"]["params"]["variant"]["choices"]


# -- latency ---------------------------------------------------------------------------------


async def test_latency_round_trip(lab: LabClient) -> None:
    """``PUT /latency`` sets and ``GET /latency`` reads the lab-wide latency."""
    assert await put_json(lab, "/latency", {"ms": 25}) == (200, {"ms": 25})
    async with lab.get("/latency") as response:
        assert await response.json() == {"ms": 25}


@pytest.mark.parametrize("body", [{"ms": -1}, {"ms": "5"}, {"ms": True}, {"ms": 1.5}, {}, [5]])
async def test_invalid_latency_is_422(lab: LabClient, body: Any) -> None:
    """A latency that is not ``{"ms": <integer 0–600000>}`` is refused with 422."""
    status, answer = await put_json(lab, "/latency", body)
    assert status == 422
    assert answer["error"] == "invalid_latency"


async def test_cli_latency_is_the_starting_value(start_lab: StartLab) -> None:
    """The configured latency is what ``GET /latency`` shows at start."""
    lab = await start_lab(latency_ms=15)
    async with lab.get("/latency") as response:
        assert await response.json() == {"ms": 15}


# -- stats and reset -------------------------------------------------------------------------


async def test_stats_count_suppliers_and_attempts_per_request_id(lab: LabClient) -> None:
    """``/stats`` counts requests per supplier and attempts per request id and supplier."""
    await ask(lab, "atlas", request_id="r1")
    await ask(lab, "boreal", scenario="flaky", request_id="r1")
    await ask(lab, "boreal", scenario="flaky", request_id="r1")
    await ask(lab, "cedar", request_id="r2")
    await ask(lab, "cedar")
    current = await stats(lab)
    assert current["per_supplier"] == {"atlas": 1, "boreal": 2, "cedar": 2}
    assert current["total"] == 5
    assert current["attempts"] == {"r1": 3, "r2": 1}
    assert current["attempts_per_supplier"] == {"r1": {"atlas": 1, "boreal": 2}, "r2": {"cedar": 1}}
    assert current["answers"]["boreal"] == {"scenario_flaky": 1, "ok": 1}
    assert current["active"] == 0
    assert current["max_active"] == 1


async def test_stats_record_attempt_deadline_and_trace_headers(lab: LabClient) -> None:
    """``X-Attempt``, ``X-Deadline-Remaining-Ms`` and ``traceparent`` are kept per request id."""
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    await ask(
        lab,
        "boreal",
        request_id="r9",
        **{"X-Attempt": "1", "X-Deadline-Remaining-Ms": "780", "traceparent": parent},
    )
    await ask(lab, "boreal", request_id="r9", **{"X-Attempt": "2"})
    assert (await stats(lab))["headers"]["r9"] == [
        {
            "supplier": "boreal",
            "x_attempt": "1",
            "x_deadline_remaining_ms": "780",
            "traceparent": parent,
        },
        {
            "supplier": "boreal",
            "x_attempt": "2",
            "x_deadline_remaining_ms": None,
            "traceparent": None,
        },
    ]


async def test_stats_memory_is_bounded(start_lab: StartLab) -> None:
    """Only the most recent request ids are kept."""
    lab = await start_lab(id_limit=3)
    for request_id in "abcde":
        await ask(lab, "atlas", request_id=request_id)
    current = await stats(lab)
    assert list(current["attempts"]) == ["c", "d", "e"]
    assert current["per_supplier"]["atlas"] == 5


async def test_active_and_max_active_count_hanging_requests(lab: LabClient) -> None:
    """``active`` counts every in-flight request, hanging ones included; ``max_active`` peaks."""
    await set_fault(lab, "atlas", kind="hang")
    await set_fault(lab, "cedar", kind="hang")
    tasks = [asyncio.create_task(ask(lab, s)) for s in ("atlas", "cedar", "atlas")]
    await asyncio.sleep(0.1)
    current = await stats(lab)
    assert (current["active"], current["max_active"]) == (3, 3)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    current = await wait_idle(lab)
    assert (current["active"], current["max_active"]) == (0, 3)


async def test_reset_is_refused_while_requests_are_active(lab: LabClient) -> None:
    """``POST /reset`` answers 409 while a request is in flight, and works once it is gone."""
    await set_fault(lab, "boreal", kind="hang")
    task = asyncio.create_task(ask(lab))
    await asyncio.sleep(0.05)
    async with lab.post("/reset") as response:
        assert response.status == 409
        assert await response.json() == {"error": "requests_active", "active": 1}
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await wait_idle(lab)
    async with lab.post("/reset") as response:
        assert response.status == 200


async def test_reset_zeroes_stats_and_flaky_memory(lab: LabClient) -> None:
    """``POST /reset`` zeroes the counters and forgets flaky ids, but keeps the faults."""
    await set_fault(lab, "atlas", kind="http_500")
    await ask(lab, "boreal", scenario="flaky", request_id="same")
    assert (await ask(lab, "boreal", scenario="flaky", request_id="same"))[0] == 200
    async with lab.post("/reset") as response:
        assert response.status == 200
    assert await stats(lab) == {
        "active": 0,
        "max_active": 0,
        "total": 0,
        "per_supplier": {"atlas": 0, "boreal": 0, "cedar": 0},
        "answers": {"atlas": {}, "boreal": {}, "cedar": {}},
        "deadline_expired": 0,
        "attempts": {},
        "attempts_per_supplier": {},
        "headers": {},
        "in_flight": {"atlas": 0, "boreal": 0, "cedar": 0},
        "max_in_flight": {"atlas": 0, "boreal": 0, "cedar": 0},
        "rate_refused": {"atlas": 0, "boreal": 0, "cedar": 0},
        "concurrency_refused": {"atlas": 0, "boreal": 0, "cedar": 0},
        "admitted_per_second": {},
    }
    assert (await ask(lab, "boreal", scenario="flaky", request_id="same"))[0] == 503
    assert (await ask(lab, "atlas"))[0] == 500


async def test_stats_can_be_limited_to_request_ids(lab: LabClient) -> None:
    """``?request_id=`` keeps only those ids in the per-id maps; ``?summary=1`` keeps none."""
    for request_id in ("a", "b", "c"):
        await ask(lab, "atlas", request_id=request_id)
    async with lab.get("/stats", params=[("request_id", "a"), ("request_id", "c")]) as response:
        chosen = await response.json()
    assert chosen["attempts"] == {"a": 1, "c": 1}
    assert set(chosen["headers"]) == {"a", "c"}
    assert chosen["total"] == 3
    async with lab.get("/stats", params={"summary": "1"}) as response:
        summary = await response.json()
    assert (summary["attempts"], summary["attempts_per_supplier"], summary["headers"]) == (
        {},
        {},
        {},
    )
    assert summary["per_supplier"]["atlas"] == 3


# -- Cache-Control -----------------------------------------------------------------------


async def test_cache_control_goes_on_every_answer_of_that_supplier(lab: LabClient) -> None:
    """``PUT /cache-control/boreal`` puts the header on boreal's answers (errors too), no others."""
    header = "max-age=5, stale-if-error=60"
    assert await put_json(lab, "/cache-control/boreal", {"value": header}) == (
        200,
        {"supplier": "boreal", "value": header},
    )
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        assert (response.status, response.headers["Cache-Control"]) == (200, header)
    async with lab.get("/quotes/boreal", params={"sku": "KB-001", "scenario": "broken"}) as broken:
        assert (broken.status, broken.headers["Cache-Control"]) == (503, header)
    async with lab.get("/quotes/atlas", params={"sku": "KB-001"}) as other:
        assert "Cache-Control" not in other.headers
    async with lab.get("/cache-control") as listed:
        assert await listed.json() == {"boreal": header}
    async with lab.delete("/cache-control/boreal") as cleared:
        assert cleared.status == 200
    async with lab.get("/quotes/boreal", params={"sku": "KB-001"}) as response:
        assert "Cache-Control" not in response.headers


@pytest.mark.parametrize(
    "body",
    [{"value": ""}, {"value": "max-age=5\r\nSet-Cookie: x=1"}, {"value": 5}, {"ms": 5}, []],
)
async def test_invalid_cache_control_is_422(lab: LabClient, body: Any) -> None:
    """Anything but ``{"value": <1-256 printable ASCII characters>}`` is refused: nothing forged."""
    status, answer = await put_json(lab, "/cache-control/boreal", body)
    assert (status, answer["error"]) == (422, "invalid_cache_control")
    async with lab.get("/cache-control") as listed:
        assert await listed.json() == {}


async def test_cache_control_for_an_unknown_supplier_is_404(lab: LabClient) -> None:
    """Only the lab's suppliers have answers to put a header on."""
    status, answer = await put_json(lab, "/cache-control/nobody", {"value": "max-age=5"})
    assert (status, answer["error"]) == (404, "unknown_supplier")
