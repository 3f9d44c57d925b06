"""The lab's rates feed, ``GET /fx/eurofxref-daily.xml``: the ECB's shape, its controls, its faults.

Real sockets: the lab from its factory behind pytest-aiohttp's server, asked by a client.
"""

from __future__ import annotations

import asyncio
import datetime
import xml.etree.ElementTree as ET
from typing import Any
from xml.parsers import expat

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from pytest_aiohttp import AiohttpClient, AiohttpServer

from provider_lab import cli
from provider_lab.app import create_app
from provider_lab.fx import DEFAULT_RATES, FEED_PATH, FX, FxFault, frankfurt_today
from provider_lab.state import LabConfig

LabClient = TestClient[web.Request, web.Application]
GESMES = "{http://www.gesmes.org/xml/2002-08-01}"
ECB = "{http://www.ecb.int/vocabulary/2002-08-01/eurofxref}"


@pytest.fixture
async def lab(aiohttp_client: AiohttpClient) -> LabClient:
    """A lab with the default config."""
    return await aiohttp_client(create_app(LabConfig(seed=1)))


async def fetch(lab: LabClient) -> tuple[int, str, bytes]:
    """The feed: status, Content-Type and body."""
    async with lab.get(FEED_PATH) as response:
        return response.status, response.content_type, await response.read()


def table(document: bytes) -> tuple[str, dict[str, str]]:
    """The date and the rates of an ECB daily document, read as a consumer would."""
    root = ET.fromstring(document)
    assert root.tag == f"{GESMES}Envelope"
    assert root.findtext(f"{GESMES}subject") == "Reference rates"
    assert root.findtext(f"{GESMES}Sender/{GESMES}name") == "European Central Bank"
    days = root.findall(f"{ECB}Cube/{ECB}Cube")
    assert len(days) == 1
    rows = days[0].findall(f"{ECB}Cube")
    return days[0].attrib["time"], {row.attrib["currency"]: row.attrib["rate"] for row in rows}


async def control(lab: LabClient, method: str, body: Any = None) -> tuple[int, Any]:
    """``/fx`` of the control API."""
    async with lab.request(method, "/fx", json=body) as response:
        return response.status, await response.json()


async def test_the_feed_is_the_ecb_daily_document_for_today(lab: LabClient) -> None:
    """EUR base (not listed), today's date in Frankfurt, the default rates in order."""
    status, content_type, body = await fetch(lab)
    assert (status, content_type) == (200, "text/xml")
    assert body.startswith(b'<?xml version="1.0" encoding="UTF-8"?>\n<gesmes:Envelope ')
    assert b"<Cube currency='USD' rate='1.0850'/>" in body
    date, rates = table(body)
    assert date == frankfurt_today().isoformat()
    assert rates == dict(DEFAULT_RATES)
    assert list(rates) == [code for code, _ in DEFAULT_RATES]
    assert "EUR" not in rates
    assert "KWD" not in rates
    assert {"USD", "JPY", "GBP", "CNY", "CHF", "SEK"} <= set(rates)
    assert all(float(rate) > 0 for rate in rates.values())


async def test_rates_and_date_change_through_the_control_api(lab: LabClient) -> None:
    """``PUT /fx``: rates merged (null drops one), a pinned date; ``DELETE /fx`` undoes both."""
    status, shown = await control(
        lab, "PUT", {"rates": {"USD": "0.9000", "CNY": None, "NZD": "1.7"}, "date": "2026-03-02"}
    )
    assert status == 200
    assert shown["rates"]["USD"] == "0.9000"
    assert "CNY" not in shown["rates"]
    assert (shown["date"], shown["pinned_date"]) == ("2026-03-02", "2026-03-02")
    date, rates = table((await fetch(lab))[2])
    assert date == "2026-03-02"
    expected = {code: rate for code, rate in DEFAULT_RATES if code != "CNY"}
    assert rates == {**expected, "USD": "0.9000", "NZD": "1.7"}
    status, shown = await control(lab, "DELETE")
    assert status == 200
    assert (shown["fault"], shown["pinned_date"]) == (None, None)
    assert table((await fetch(lab))[2]) == (frankfurt_today().isoformat(), dict(DEFAULT_RATES))


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"rates": {"USD": 0.9}}, "rates.USD: must be null or a decimal string"),
        ({"rates": {"USD": "-1"}}, "rates.USD: must be null or a decimal string"),
        ({"rates": {"USD": "0"}}, "rates.USD: must be null or a decimal string"),
        ({"rates": {"USD": "1e3"}}, "rates.USD: must be null or a decimal string"),
        ({"rates": {"usd": "1.0"}}, "rates.usd: not a three-letter upper-case code"),
        ({"rates": {"EUR": "1.0"}}, "rates.EUR: not a three-letter upper-case code"),
        ({"rates": ["USD"]}, "rates: must be an object"),
        ({"date": "04/12/2026"}, 'date: must be null or "YYYY-MM-DD"'),
        ({"date": 20261204}, 'date: must be null or "YYYY-MM-DD"'),
        ({"fault": {"kind": "meteor"}}, "fault.kind: must be one of stale"),
        ({"fault": {"kind": "stale", "days": 0}}, "fault.days: must be an integer"),
        ({"fault": {"kind": "malformed", "variant": "x"}}, "fault.variant: must be one of"),
        ({"fault": {"kind": "down", "days": 3}}, "fault.days: not a parameter of down"),
        ({"colour": "red"}, "colour: not a setting"),
    ],
)
async def test_a_bad_change_is_422_and_changes_nothing(
    lab: LabClient, body: dict[str, Any], problem: str
) -> None:
    """Every problem named; the feed stays as it was."""
    before = (await control(lab, "GET"))[1]
    status, answer = await control(lab, "PUT", {**body, "rates": body.get("rates", {})})
    assert (status, answer["error"]) == (422, "invalid_fx")
    assert any(line.startswith(problem) for line in answer["detail"]), answer
    assert (await control(lab, "GET"))[1] == before


async def settled(lab: LabClient) -> dict[str, Any]:
    """``GET /fx`` once no fetch is in flight (within 2 s)."""
    async with asyncio.timeout(2):
        while True:
            shown: dict[str, Any] = (await control(lab, "GET"))[1]
            if not shown["active"]:
                return shown
            await asyncio.sleep(0.02)


async def set_fault(lab: LabClient, **fault: Any) -> None:
    status, shown = await control(lab, "PUT", {"fault": fault})
    assert status == 200, shown
    assert shown["fault"]["kind"] == fault["kind"]


async def test_stale_dates_the_table_days_ago(lab: LabClient) -> None:
    """``stale``: 10 days before today by default, ``days`` otherwise; the rates unchanged."""
    today = frankfurt_today()
    await set_fault(lab, kind="stale")
    assert table((await fetch(lab))[2]) == (
        (today - datetime.timedelta(days=10)).isoformat(),
        dict(DEFAULT_RATES),
    )
    await set_fault(lab, kind="stale", days=30)
    assert table((await fetch(lab))[2])[0] == (today - datetime.timedelta(days=30)).isoformat()
    await control(lab, "PUT", {"fault": None})
    assert table((await fetch(lab))[2])[0] == today.isoformat()


async def test_malformed_variants_are_not_a_usable_table(lab: LabClient) -> None:
    """A rate that is no number; half the document; no date; an HTML page — all 200."""
    await set_fault(lab, kind="malformed")
    status, _, body = await fetch(lab)
    assert status == 200
    rates = table(body)[1]
    assert (rates["USD"], rates["JPY"]) == ("n/a", "162.50")
    await set_fault(lab, kind="malformed", variant="truncated")
    status, _, body = await fetch(lab)
    assert status == 200
    with pytest.raises(ET.ParseError):
        ET.fromstring(body)
    await set_fault(lab, kind="malformed", variant="no_time")
    root = ET.fromstring((await fetch(lab))[2])
    assert "time" not in root.findall(f"{ECB}Cube/{ECB}Cube")[0].attrib
    await set_fault(lab, kind="malformed", variant="html")
    status, content_type, body = await fetch(lab)
    assert (status, content_type) == (200, "text/html")
    assert body.startswith(b"<html>")


async def test_entity_bomb_declares_nested_entities(lab: LabClient) -> None:
    """A billion-laughs DOCTYPE: ten levels of entities, each ten of the one before."""
    await set_fault(lab, kind="entity_bomb")
    status, _, body = await fetch(lab)
    assert status == 200
    assert len(body) < 10_000  # small on the wire
    declared: dict[str, str | None] = {}
    parser = expat.ParserCreate()
    parser.EntityDeclHandler = lambda name, is_parameter, value, *rest: declared.__setitem__(
        name, value
    )
    parser.SetParamEntityParsing(expat.XML_PARAM_ENTITY_PARSING_NEVER)
    # Stop at the DOCTYPE: nothing here expands an entity.
    parser.Parse(body.split(b"]>", 1)[0] + b"]><x/>", True)
    assert declared["lol"] == "lol"
    assert declared["lol9"] == "&lol8;" * 10
    assert len(declared) == 10
    assert b"<gesmes:subject>&lol9;</gesmes:subject>" in body
    # A parser that expands entities (expat's own guard aside) cannot take it as a table.
    with pytest.raises(ET.ParseError):
        ET.fromstring(body)


async def test_down_is_503(lab: LabClient) -> None:
    """``down``: a 503 with a small text body."""
    await set_fault(lab, kind="down")
    assert (await fetch(lab))[0] == 503


async def test_cut_sends_part_of_the_body_then_closes(lab: LabClient) -> None:
    """``cut``: the whole Content-Length promised, half sent, then the connection closed."""
    await set_fault(lab, kind="cut")
    async with lab.get(FEED_PATH) as response:
        assert response.status == 200
        assert (response.content_length or 0) > 1000
        with pytest.raises(aiohttp.ClientPayloadError):
            await response.read()


async def test_hang_answers_nothing_until_the_client_gives_up(lab: LabClient) -> None:
    """``hang``: the client's timeout fires; the handler then ends (nothing left in flight)."""
    await set_fault(lab, kind="hang")
    with pytest.raises(asyncio.TimeoutError):
        async with lab.get(FEED_PATH, timeout=aiohttp.ClientTimeout(total=0.2)):
            pass  # pragma: no cover - never answered
    shown = await settled(lab)
    assert shown["active"] == 0
    assert shown["answers"] == {"hang": 1}


async def test_a_hanging_fetch_does_not_outlive_the_lab(aiohttp_server: AiohttpServer) -> None:
    """Stopping the lab ends a hanging fetch: the client sees the connection go, no task stays."""
    app = create_app(LabConfig(fx_fault=FxFault("hang")))
    server = await aiohttp_server(app)
    before = asyncio.all_tasks()
    async with aiohttp.ClientSession() as session:
        fetching = asyncio.create_task(session.get(server.make_url(FEED_PATH)))
        loop = asyncio.get_running_loop()
        end = loop.time() + 2
        while not app[FX].active:
            assert loop.time() < end
            await asyncio.sleep(0.01)
        await asyncio.wait_for(server.close(), 3)
        with pytest.raises(aiohttp.ClientError):
            await asyncio.wait_for(fetching, 3)
    assert app[FX].active == 0
    left = {task for task in asyncio.all_tasks() - before if not task.done()}
    assert left <= {asyncio.current_task()}


async def test_fetches_are_counted_and_reset(lab: LabClient) -> None:
    """``GET /fx``'s ``fetches`` and ``answers``; ``/stats``' ``fx_fetches`` once fetched."""
    async with lab.get("/stats") as response:
        assert "fx_fetches" not in await response.json()
    await fetch(lab)
    await set_fault(lab, kind="down")
    await fetch(lab)
    shown = (await control(lab, "GET"))[1]
    assert (shown["fetches"], shown["answers"]) == (2, {"ok": 1, "down": 1})
    async with lab.get("/stats") as response:
        assert (await response.json())["fx_fetches"] == 2
    async with lab.post("/reset") as response:
        assert response.status == 200
    shown = (await control(lab, "GET"))[1]
    assert (shown["fetches"], shown["answers"], shown["fault"]) == (0, {}, {"kind": "down"})


async def test_the_feed_serves_anyone_and_its_control_only_loopback(
    aiohttp_client: AiohttpClient,
) -> None:
    """The feed is public like a supplier; ``/fx`` (and the feed path's neighbours) are not."""

    @web.middleware
    async def from_afar(request: web.Request, handler: Any) -> web.StreamResponse:
        response: web.StreamResponse = await handler(request.clone(remote="203.0.113.9"))
        return response

    app = create_app(LabConfig())
    app.middlewares.insert(0, from_afar)
    remote = await aiohttp_client(app)
    assert (await fetch(remote))[0] == 200
    for method, path in [("GET", "/fx"), ("PUT", "/fx"), ("DELETE", "/fx"), ("GET", "/fx/")]:
        async with remote.request(method, path, json={"fault": None}) as response:
            assert response.status == 403, path


def test_cli_flags_set_rates_and_a_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--fx-rate CODE=RATE`` (repeatable) and ``--fx-fault KIND[:KEY=VALUE]`` reach the lab."""
    seen: list[LabConfig] = []

    async def serve(config: LabConfig, host: str, port: int, *, access_log: bool) -> None:
        seen.append(config)

    monkeypatch.setattr(cli, "serve", serve)
    argv = ["--fx-rate", "USD=0.9000", "--fx-rate", "JPY=150", "--fx-fault", "stale:days=30"]
    assert cli.main(argv) == 0
    assert seen[0].fx_rates == (("USD", "0.9000"), ("JPY", "150"))
    assert seen[0].fx_fault == FxFault("stale", days=30)


@pytest.mark.parametrize(
    "argv",
    [
        ["--fx-rate", "USD"],
        ["--fx-rate", "USD=-1"],
        ["--fx-rate", "EUR=1"],
        ["--fx-fault", "meteor"],
        ["--fx-fault", "stale:days=0"],
        ["--fx-fault", "malformed:variant=x"],
    ],
)
def test_bad_fx_flags_are_one_line_and_exit_2(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A bad ``--fx-*`` flag stops the lab with exit code 2 and one error line."""
    with pytest.raises(SystemExit) as caught:
        cli.main(argv)
    assert caught.value.code == 2
    assert capsys.readouterr().err.count("\n") == 1
