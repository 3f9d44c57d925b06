"""``?explain=svg`` on a real QuoteFlow, the console page, and its lab controls on a real lab.

Nothing is mocked: QuoteFlow runs from its factory against the fake suppliers or the
provider lab's own app, each on a real socket, and the lab routes forward to a real lab.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import re
import xml.etree.ElementTree as ET
from typing import Any

import pytest
from aiohttp import ClientTimeout, web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient, AiohttpServer

from provider_lab.app import create_app as create_lab
from provider_lab.state import LabConfig
from quoteflow.app import create_app
from quoteflow.auth import ApiKeys
from quoteflow.config import Settings
from quoteflow.console import LAB_LIMIT, LAB_ROUTES
from quoteflow.options import ConfigError, parse_settings
from tests.conftest import TEST_BUDGET, TEST_CONNECT_TIMEOUT, StartQuoteFlow
from tests.fakes import FakeSuppliers, first_time_per_request_id, status

SVG = "{http://www.w3.org/2000/svg}"
Client = TestClient[Any, Any]


def rows(svg: str) -> dict[str, ET.Element]:
    root = ET.fromstring(svg)
    return {
        g.get("data-supplier", ""): g for g in root.iter(f"{SVG}g") if "data-supplier" in g.attrib
    }


def outcomes(row: ET.Element) -> list[str]:
    return [g.get("data-outcome", "") for g in row.iter(f"{SVG}g") if "data-attempt" in g.attrib]


# -- ?explain=svg -------------------------------------------------------------------------


async def test_explain_svg_draws_the_answers_bill(
    start_quoteflow: StartQuoteFlow, suppliers: FakeSuppliers
) -> None:
    """A 503 then a quote: boreal's row shows both attempts, the deadline is the budget."""
    suppliers.always("boreal", first_time_per_request_id(status(503)))
    client = await start_quoteflow()
    response = await client.post(
        "/api/quotes?explain=svg", json={"quantity": 2}, headers={"X-Request-ID": "svg-1"}
    )
    assert response.status == 200
    assert response.content_type == "image/svg+xml"
    assert response.headers["X-Request-ID"] == "svg-1"
    svg = await response.text()
    root = ET.fromstring(svg)
    assert root.get("data-request-id") == "svg-1"
    found = rows(svg)
    assert list(found) == ["atlas", "boreal", "cedar"]
    assert outcomes(found["boreal"]) == ["http_503", "ok"]
    assert found["boreal"].get("data-stopped") == "success"
    backoffs = [g for g in found["boreal"].iter(f"{SVG}g") if "data-backoff-ms" in g.attrib]
    assert len(backoffs) == 1
    assert 20 <= float(backoffs[0].get("data-backoff-ms", "")) <= 30
    deadlines = [g.get("data-deadline-ms") for g in root.iter(f"{SVG}g")]
    assert [d for d in deadlines if d] == [repr(TEST_BUDGET * 1000)]


async def test_explain_svg_holds_the_same_numbers_as_explain_1(
    start_quoteflow: StartQuoteFlow,
) -> None:
    """Every attempt's attributes are the bill's values: the JSON and the picture agree."""
    client = await start_quoteflow()
    drawn = await (await client.post("/api/quotes?explain=svg", json={})).text()
    for name, row in rows(drawn).items():
        (tried,) = [g for g in row.iter(f"{SVG}g") if "data-attempt" in g.attrib]
        assert tried.get("data-outcome") == "ok", name
        assert float(tried.get("data-start-ms", "")) >= 0
        assert float(tried.get("data-duration-ms", "")) > 0
    answer = await (await client.post("/api/quotes?explain=1", json={})).json()
    assert set(answer["explain"]["suppliers"]) == set(rows(drawn))


@pytest.mark.parametrize("explain", ["1", "true"])
async def test_other_explain_values_are_unchanged(
    start_quoteflow: StartQuoteFlow, explain: str
) -> None:
    """``explain=1`` and ``true`` still answer JSON with the bill; a stray value, plain JSON."""
    client = await start_quoteflow()
    response = await client.post(f"/api/quotes?explain={explain}", json={})
    assert response.content_type == "application/json"
    assert "explain" in await response.json()
    plain = await client.post("/api/quotes?explain=SVG", json={})
    assert plain.content_type == "application/json"
    assert "explain" not in await plain.json()


async def test_refusals_and_errors_stay_json(start_quoteflow: StartQuoteFlow) -> None:
    """Only a 200 is drawn: a bad request (422), bad JSON (400), a full house (503) are JSON."""
    client = await start_quoteflow(inbound_limit=1)
    bad = await client.post("/api/quotes?explain=svg", json={"quantity": "2"})
    assert (bad.status, bad.content_type) == (422, "application/json")
    assert (await bad.json())["error"] == "invalid_request"
    not_json = await client.post("/api/quotes?explain=svg", data=b"{")
    assert (not_json.status, not_json.content_type) == (400, "application/json")


async def test_a_hostile_sku_comes_back_as_text(start_quoteflow: StartQuoteFlow) -> None:
    """A SKU of markup is drawn as text: the answer parses as XML with no element of its own."""
    client = await start_quoteflow()
    sku = '<script>alert("x")</script>'
    response = await client.post("/api/quotes?explain=svg", json={"sku": sku})
    svg = await response.text()
    root = ET.fromstring(svg)
    assert not [e for e in root.iter() if e.tag.removeprefix(SVG) == "script"]
    assert any(t.text == f"{sku} × 2" for t in root.iter(f"{SVG}text"))


async def test_a_cart_is_drawn_one_row_per_call(
    start_quoteflow: StartQuoteFlow,
) -> None:
    """``POST /api/carts?explain=svg``: a row for each supplier call, the lines it asked."""
    client = await start_quoteflow()
    body = {"lines": [{"sku": "KB-001", "quantity": 2}, {"sku": "KB-002", "quantity": 2}]}
    response = await client.post("/api/carts?explain=svg", json=body)
    assert response.status == 200
    assert response.content_type == "image/svg+xml"
    root = ET.fromstring(await response.text())
    assert root.get("data-kind") == "cart"
    calls = [
        (g.get("data-supplier"), g.get("data-stopped"))
        for g in root.iter(f"{SVG}g")
        if "data-supplier" in g.attrib
    ]
    assert sorted(calls) == sorted(
        [(name, "success") for name in ("atlas", "boreal", "cedar") for _ in range(2)]
    )
    refused = await client.post("/api/carts?explain=svg", json={"lines": []})
    assert (refused.status, refused.content_type) == (422, "application/json")


# -- the console page -----------------------------------------------------------------------


async def test_no_console_without_the_flag(start_quoteflow: StartQuoteFlow) -> None:
    """Off by default: ``/console`` and the lab routes are 404."""
    client = await start_quoteflow()
    assert (await client.get("/console")).status == 404
    assert (await client.get("/api/console/lab/faults")).status == 404


async def test_the_console_page_is_static_and_locked_down(start_quoteflow: StartQuoteFlow) -> None:
    """The page's policy allows its own inline script and style by hash, nothing from outside."""
    client = await start_quoteflow(console=True)
    response = await client.get("/console")
    assert response.status == 200
    assert response.content_type == "text/html"
    html = await response.read()
    policy = response.headers["Content-Security-Policy"]
    assert policy.startswith("default-src 'self'")
    assert "frame-ancestors 'none'" in policy
    assert "unsafe" not in policy
    scripts = re.findall(rb"<script>(.*?)</script>", html, re.DOTALL)
    assert len(scripts) == 1
    digest = base64.b64encode(hashlib.sha256(scripts[0]).digest()).decode()
    assert f"'sha256-{digest}'" in policy
    # Nothing fetched from elsewhere: no URL with a scheme or a host in the page.
    assert not re.search(rb"(?:src|href)\s*=\s*[\"']?(?:https?:)?//", html)
    assert b"http://" not in html.replace(b"http://www.w3.org/2000/svg", b"")
    # Every field is labelled.
    ids = set(re.findall(rb'<(?:input|select|textarea)[^>]*\bid="([^"]+)"', html))
    labelled = set(re.findall(rb'<label[^>]*\bfor="([^"]+)"', html))
    assert ids
    assert ids <= labelled
    # Without --console-lab, the lab's routes are not there.
    assert (await client.get("/api/console/lab/faults")).status == 404


def test_console_lab_needs_the_console_and_a_url() -> None:
    """``--console-lab`` alone, or with something other than an http(s) URL, is refused."""
    with pytest.raises(ConfigError, match="--console"):
        parse_settings(["--console-lab", "http://127.0.0.1:9101"], {})
    with pytest.raises(ConfigError, match="console_lab"):
        parse_settings(["--console", "--console-lab", "ftp://lab"], {})
    settings = parse_settings(
        [], {"QUOTEFLOW_CONSOLE": "1", "QUOTEFLOW_CONSOLE_LAB": "http://127.0.0.1:9101"}
    )
    assert (settings.console, settings.console_lab) == (True, "http://127.0.0.1:9101")


# -- the lab's controls, forwarded ------------------------------------------------------------


@pytest.fixture
async def lab_url(aiohttp_server: AiohttpServer) -> str:
    """The provider lab's real app on a real socket."""
    server = await aiohttp_server(create_lab(LabConfig(slow_ms=200, seed=1)))
    return str(server.make_url("")).rstrip("/")


async def _console(aiohttp_client: AiohttpClient, lab_url: str, **overrides: Any) -> Client:
    values: dict[str, Any] = {
        "budget": TEST_BUDGET,
        "connect_timeout": TEST_CONNECT_TIMEOUT,
        "provider_url": lab_url,
        "console": True,
        "console_lab": lab_url,
    }
    values.update(overrides)
    return await aiohttp_client(create_app(Settings(**values)))


async def test_a_fault_switched_through_the_console_reaches_the_next_quote(
    aiohttp_client: AiohttpClient, lab_url: str
) -> None:
    """PUT boreal's fault through QuoteFlow: the lab has it, the next quote shows it; DELETE
    brings the quote back."""
    client = await _console(aiohttp_client, lab_url)
    kinds = await client.get("/api/console/lab/kinds")
    assert kinds.status == 200
    assert "http_503" in await kinds.json()
    put = await client.put("/api/console/lab/faults/boreal", json={"kind": "http_503"})
    assert put.status == 200, await put.text()
    assert (await put.json())["faults"][0]["kind"] == "http_503"
    faults = await (await client.get("/api/console/lab/faults")).json()
    assert faults["boreal"][0]["kind"] == "http_503"
    drawn = await (await client.post("/api/quotes?explain=svg", json={})).text()
    boreal = rows(drawn)["boreal"]
    assert outcomes(boreal) == ["http_503", "http_503"]
    assert boreal.get("data-stopped") == "attempts_exhausted"
    cleared = await client.delete("/api/console/lab/faults/boreal", json={})
    assert cleared.status == 200
    drawn = await (await client.post("/api/quotes?explain=svg", json={})).text()
    assert outcomes(rows(drawn)["boreal"]) == ["ok"]


async def test_latency_through_the_console(aiohttp_client: AiohttpClient, lab_url: str) -> None:
    """GET and PUT ``/latency`` reach the lab; the lab's own 422 comes back as it is."""
    client = await _console(aiohttp_client, lab_url)
    put = await client.put("/api/console/lab/latency", json={"ms": 5})
    assert (put.status, await put.json()) == (200, {"ms": 5})
    assert await (await client.get("/api/console/lab/latency")).json() == {"ms": 5}
    bad = await client.put("/api/console/lab/latency", json={"ms": -1})
    assert bad.status == 422
    assert (await bad.json())["error"] == "invalid_latency"
    cleared = await client.delete("/api/console/lab/faults", json={})
    assert cleared.status == 200


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/api/console/lab/stats"),
        ("POST", "/api/console/lab/reset"),
        ("PUT", "/api/console/lab/oauth2"),
        ("PUT", "/api/console/lab/api-key"),
        ("GET", "/api/console/lab/quotes/boreal"),
        ("PUT", "/api/console/lab/contracts/boreal"),
        ("PUT", "/api/console/lab/faults/..%2Fapi-key"),
        ("GET", "/api/console/lab/faults/boreal/x"),
        ("GET", "/api/console/lab/"),
    ],
)
async def test_only_the_labs_fault_and_latency_calls_are_forwarded(
    aiohttp_client: AiohttpClient, lab_url: str, method: str, path: str
) -> None:
    """Any other path under ``/api/console/lab/`` is a JSON 404, and nothing reaches the lab."""
    client = await _console(aiohttp_client, lab_url)
    response = await client.request(method, path, json={"value": "x"})
    assert response.status == 404
    assert (await response.json())["error"] == "not_found"


def test_the_forwarded_calls_are_the_labs_fault_and_latency_calls() -> None:
    """The list is short and names only faults and latency (and the kinds to choose from)."""
    assert {path.split("/")[1] for _, path in LAB_ROUTES} == {"kinds", "faults", "latency"}


async def test_a_cross_site_call_is_refused(aiohttp_client: AiohttpClient, lab_url: str) -> None:
    """Another origin, a cross-site fetch, or a change without a JSON body cannot switch a fault."""
    client = await _console(aiohttp_client, lab_url)
    foreign = await client.put(
        "/api/console/lab/faults/boreal",
        json={"kind": "hang"},
        headers={"Origin": "http://evil.example"},
    )
    assert foreign.status == 403
    cross = await client.put(
        "/api/console/lab/faults/boreal",
        json={"kind": "hang"},
        headers={"Sec-Fetch-Site": "cross-site"},
    )
    assert cross.status == 403
    form = await client.put(
        "/api/console/lab/faults/boreal",
        data={"kind": "hang"},  # a form's urlencoded body
    )
    assert form.status == 415
    not_json = await client.put(
        "/api/console/lab/faults/boreal",
        data=b"{",
        headers={"Content-Type": "application/json"},
    )
    assert not_json.status == 400
    own = str(client.make_url("")).rstrip("/")
    same = await client.put(
        "/api/console/lab/faults/boreal", json={"kind": "hang"}, headers={"Origin": own}
    )
    assert same.status == 200
    faults = await (await client.get("/api/console/lab/faults")).json()
    assert [f["kind"] for f in faults["boreal"]] == ["hang"]
    assert (await client.delete("/api/console/lab/faults", json={})).status == 200


async def test_not_on_loopback_the_lab_routes_need_keys(
    aiohttp_client: AiohttpClient, lab_url: str, tmp_path: Any
) -> None:
    """Listening beyond loopback without keys: 403; with keys, a key opens them (401 without)."""
    wide = await _console(aiohttp_client, lab_url, host="0.0.0.0")
    refused = await wide.get("/api/console/lab/faults")
    assert refused.status == 403
    assert (await refused.json())["error"] == "console_lab_forbidden"
    keys = tmp_path / "keys"
    keys.write_text("a-long-enough-console-key-0123456789\n")
    keyed = await _console(
        aiohttp_client, lab_url, host="0.0.0.0", api_keys=ApiKeys.from_file(str(keys))
    )
    assert (await keyed.get("/api/console/lab/faults")).status == 401
    opened = await keyed.get(
        "/api/console/lab/faults",
        headers={"Authorization": "Bearer a-long-enough-console-key-0123456789"},
    )
    assert opened.status == 200


async def test_a_lab_that_is_down_is_a_502_not_a_hang(
    aiohttp_client: AiohttpClient, aiohttp_server: AiohttpServer
) -> None:
    """A lab that refuses connections: 502 at once, JSON like every other error."""
    gone = await aiohttp_server(web.Application())
    url = str(gone.make_url("")).rstrip("/")
    await gone.close()
    client = await _console(aiohttp_client, url)
    down = await client.get("/api/console/lab/faults")
    assert down.status == 502
    assert (await down.json())["error"] == "lab_unreachable"


async def test_a_slow_lab_is_cut_by_the_forwarding_timeout(
    aiohttp_client: AiohttpClient, aiohttp_server: AiohttpServer
) -> None:
    """A lab that never answers: 504 at the call's time limit, and its connection is closed."""
    closed = asyncio.Event()

    async def never(request: web.Request) -> web.Response:
        # The lab's side of the socket: it sees QuoteFlow hang up (no socket is kept).
        # A transport has no event for its closing: look every 10 ms (or be cancelled
        # with the connection, if the server cancels handlers).
        try:
            while request.transport is not None and not request.transport.is_closing():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        finally:
            closed.set()
        return web.Response()

    stuck = web.Application()
    stuck.router.add_get("/faults", never)
    server = await aiohttp_server(stuck)
    url = str(server.make_url("")).rstrip("/")
    app = create_app(Settings(budget=TEST_BUDGET, provider_url=url, console=True, console_lab=url))
    app[LAB_LIMIT] = ClientTimeout(total=0.2)
    client = await aiohttp_client(app)
    response = await client.get("/api/console/lab/faults")
    assert response.status == 504
    assert (await response.json())["error"] == "lab_timeout"
    await asyncio.wait_for(closed.wait(), 5)
