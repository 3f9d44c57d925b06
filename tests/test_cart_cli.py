"""``quoteflow cart FILE``: a BOM file quoted by a real QuoteFlow on a real socket.

The service is QuoteFlow built by its own factory against the fake suppliers,
listening on 127.0.0.1; the command's coroutine (``cart_cli.run``) runs in
this process against its URL, as ``quoteflow cart`` would from a shell. One
subprocess test checks the console entry (``python -m quoteflow cart``).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import socket
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from quoteflow import cart_cli
from quoteflow.app import create_app
from quoteflow.auth import ApiKeys
from quoteflow.config import Settings
from tests.conftest import TEST_BUDGET, TEST_CONNECT_TIMEOUT
from tests.fakes import FakeSuppliers, quote

BOM = (
    "\ufeff"
    '"Source:";"board.kicad_sch"\r\n'
    '"Reference";"Value";"Qty";"MPN"\r\n'
    '"R1,R2";"10k";"2";"KB-001"\r\n'
    '"FID1";"Fiducial";"1";""\r\n'
    '"U1";"MCU";"1";"MS-002"\r\n'
    '"U2";"LDO";"1";"MS-003"\r\n'
)
"""Three lines to buy, a fiducial: boreal sells 2 × KB-001 cheapest, cedar (one of each
in stock) the single parts; a line on its own would pay its own shipping."""


async def no_cb_404(request: web.Request) -> web.StreamResponse:
    """Every SKU quoted but CB-404, which nobody sells."""
    if request.query["sku"] == "CB-404":
        return web.json_response({"error": "unknown_sku"}, status=404)
    return await quote()(request)


async def quoteflow_url(
    aiohttp_server: AiohttpServer, suppliers: FakeSuppliers, **more: Any
) -> str:
    """A real QuoteFlow listening on 127.0.0.1, asking the fake suppliers; its base URL."""
    settings = Settings(
        provider_url=suppliers.url,
        budget=TEST_BUDGET,
        connect_timeout=TEST_CONNECT_TIMEOUT,
        **more,
    )
    server = await aiohttp_server(create_app(settings))
    return str(server.make_url("")).rstrip("/")


async def cart(*argv: str, environ: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``quoteflow cart ARGV`` in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    code = await cart_cli.run(list(argv), environ or {}, out, err)
    return code, out.getvalue(), err.getvalue()


async def test_a_complete_basket_prints_its_picks_and_total_and_exits_0(
    aiohttp_server: AiohttpServer, suppliers: FakeSuppliers, tmp_path: Path
) -> None:
    url = await quoteflow_url(aiohttp_server, suppliers)
    bom = tmp_path / "bom.csv"
    bom.write_text(BOM, encoding="utf-8")
    code, out, err = await cart(str(bom), environ={"QUOTEFLOW_URL": url})
    assert (code, err) == (0, ""), err
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip()}
    assert rows["R1,R2"] == ["R1,R2", "KB-001", "2", "2", "boreal", "22.00"]
    assert rows["U1"] == ["U1", "MS-002", "1", "1", "cedar", "9.00"]
    assert rows["U2"] == ["U2", "MS-003", "1", "1", "cedar", "9.00"]
    # the basket: 22.00 + 2 × 9.00 + boreal's 2.50 + cedar's 2.00 (once);
    # each line alone: 24.50 + 2 × 11.00
    assert "total           44.50 USD" in out
    assert "per-line total  46.50 USD" in out
    assert "saving           2.00 USD" in out
    assert "row 4: no SKU (not a part to buy)" in out
    assert "ignored columns: Value" in out
    assert len(suppliers.received) == 9  # one request: three lines, three suppliers


async def test_an_unquoted_line_is_listed_with_why_and_exits_1(
    aiohttp_server: AiohttpServer, suppliers: FakeSuppliers, tmp_path: Path
) -> None:
    for name in ("atlas", "boreal", "cedar"):
        suppliers.always(name, no_cb_404)
    url = await quoteflow_url(aiohttp_server, suppliers)
    bom = tmp_path / "bom.csv"
    bom.write_text("ref,sku,qty\nR1,KB-001,2\nJ1,CB-404,3\n")
    code, out, _ = await cart(str(bom), "--url", url)
    assert code == 1
    (row,) = [line.split() for line in out.splitlines() if line.startswith("J1")]
    assert row == ["J1", "CB-404", "3", "-", "-", "no", "quote"]
    assert "unquoted (1 of 2 lines):" in out
    assert "  CB-404 (J1): no quote: atlas http_404, boreal http_404, cedar http_404" in out


async def test_a_line_bought_as_its_alternate_shows_the_sku_bought(
    aiohttp_server: AiohttpServer, suppliers: FakeSuppliers, tmp_path: Path
) -> None:
    """KB-001 is out of stock everywhere, its alternate MS-002 is not: the table says so."""

    async def kb_001_gone(request: web.Request) -> web.StreamResponse:
        if request.query["sku"] in ("KB-001", "CB-404"):
            return web.json_response({"error": "unknown_sku"}, status=404)
        return await quote()(request)

    for name in ("atlas", "boreal", "cedar"):
        suppliers.always(name, kb_001_gone)
    url = await quoteflow_url(aiohttp_server, suppliers)
    bom = tmp_path / "bom.csv"
    bom.write_text("ref,sku,qty,alternates\nR1,KB-001,2,MS-002\nJ1,CB-404,1,\n")
    code, out, _ = await cart(str(bom), "--url", url)
    assert code == 1
    (row,) = [line.split() for line in out.splitlines() if line.startswith("R1")]
    assert row == ["R1", "KB-001", "->", "MS-002", "2", "2", "boreal", "22.00"]


async def test_out_writes_the_basket_csv_of_the_same_answer(
    aiohttp_server: AiohttpServer, suppliers: FakeSuppliers, tmp_path: Path
) -> None:
    url = await quoteflow_url(aiohttp_server, suppliers)
    bom, out_file = tmp_path / "bom.csv", tmp_path / "basket.csv"
    bom.write_text(BOM, encoding="utf-8")
    code, _, _ = await cart(str(bom), "--url", url, "--out", str(out_file), "--json")
    assert code == 0
    assert len(suppliers.received) == 9  # the CSV came from the one answer
    with out_file.open(newline="", encoding="utf-8-sig") as handle:
        rows = list(csv.DictReader(handle))
    (total,) = [row for row in rows if row["kind"] == "total"]
    parts = [Decimal(row["amount"]) for row in rows if row["kind"] in ("line", "shipping")]
    assert sum(parts) == Decimal(total["amount"]) == Decimal("44.50")
    assert [row["ref"] for row in rows if row["kind"] == "line"] == ["R1,R2", "U1", "U2"]


async def test_json_prints_the_answer_as_it_came(
    aiohttp_server: AiohttpServer, suppliers: FakeSuppliers, tmp_path: Path
) -> None:
    url = await quoteflow_url(aiohttp_server, suppliers)
    bom = tmp_path / "cart.json"
    bom.write_text(json.dumps({"lines": [{"sku": "KB-001", "quantity": 2}]}))
    code, out, _ = await cart(str(bom), "--url", url, "--json")
    assert code == 0
    answer = json.loads(out)
    assert answer["basket"]["total_cents"] == 2450
    assert answer["basket"]["picks"][0]["supplier"] == "boreal"


async def test_currency_converts_a_csv_and_a_json_bom(
    aiohttp_server: AiohttpServer, suppliers: FakeSuppliers, tmp_path: Path
) -> None:
    rates = tmp_path / "eurofxref-daily.xml"
    rates.write_text(
        "<gesmes:Envelope xmlns:gesmes='http://www.gesmes.org/xml/2002-08-01'"
        " xmlns='http://www.ecb.int/vocabulary/2002-08-01/eurofxref'><Cube>"
        f"<Cube time='{dt.datetime.now(dt.UTC).date()}'>"
        "<Cube currency='USD' rate='1.0000'/><Cube currency='JPY' rate='150'/>"
        "</Cube></Cube></gesmes:Envelope>"
    )
    url = await quoteflow_url(aiohttp_server, suppliers, fx_rates=str(rates))
    csv_bom, json_bom = tmp_path / "bom.csv", tmp_path / "bom.json"
    csv_bom.write_text("sku,qty\nKB-001,2\n")
    json_bom.write_text('\ufeff{"lines": [{"sku": "KB-001", "quantity": 2}]}', encoding="utf-8")
    for bom in (csv_bom, json_bom):
        code, out, err = await cart(str(bom), "--url", url, "--currency", "JPY")
        assert (code, err) == (0, "")
        assert "total           3675 JPY" in out  # 24.50 USD at 150 yen: no minor unit
    code, _, err = await cart(str(csv_bom), "--url", url, "--currency", "GBP")
    assert code == 4
    assert err.splitlines()[1] == "currency: GBP is neither USD (--currency) nor in the rates table"


async def test_a_csv_carts_currency_query_is_held_to_the_json_rule(
    aiohttp_server: AiohttpServer, suppliers: FakeSuppliers
) -> None:
    """``?currency=`` on a CSV cart: what a JSON body's ``currency`` would be refused for."""
    url = await quoteflow_url(aiohttp_server, suppliers)
    async with aiohttp.ClientSession() as session:
        for code in ("usd", "XAU", ""):
            async with session.post(
                f"{url}/api/carts",
                params={"currency": code},
                data=b"sku,qty\nKB-001,1\n",
                headers={"Content-Type": "text/csv"},
            ) as response:
                assert response.status == 422, code
                (error,) = (await response.json())["detail"]
                assert error["loc"] == ["currency"]
                assert error["msg"].startswith("must be an ISO 4217 currency code")
    assert suppliers.received == []


async def test_a_refused_bom_prints_every_error_by_row_and_exits_4(
    aiohttp_server: AiohttpServer, suppliers: FakeSuppliers, tmp_path: Path
) -> None:
    url = await quoteflow_url(aiohttp_server, suppliers, api_keys=ApiKeys(["k-1"]))
    bom = tmp_path / "bom.csv"
    bom.write_text("ref,sku,qty\nR1,KB-001,1\nR2,MS-002,10.0\nR3,KB-001,2\n")
    environ = {"QUOTEFLOW_URL": url, "QUOTEFLOW_API_KEY": "k-1"}
    code, out, err = await cart(str(bom), environ=environ)
    assert (code, out) == (4, "")
    assert err.splitlines()[1:] == [
        "row 3: lines.1.quantity: '10.0' is not a plain integer",
        "row 4: lines.2.sku: repeats row 2: ask a SKU once",
    ]
    code, _, err = await cart(str(bom), environ={"QUOTEFLOW_URL": url})  # no key: 401
    assert code == 4
    assert err.splitlines()[1].startswith("unauthorized: ")
    assert suppliers.received == []


async def test_an_unreachable_service_exits_3(tmp_path: Path) -> None:
    with socket.socket() as listener:  # a port nobody listens on once it is closed
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    bom = tmp_path / "bom.csv"
    bom.write_text("sku,qty\nKB-001,1\n")
    code, out, err = await cart(str(bom), "--url", f"http://127.0.0.1:{port}")
    assert (code, out) == (3, "")
    assert err.startswith(f"quoteflow cart: error: cannot reach http://127.0.0.1:{port}")


async def test_a_5xx_exits_3(aiohttp_server: AiohttpServer, tmp_path: Path) -> None:
    broken = web.Application()

    async def boom(request: web.Request) -> web.Response:
        return web.json_response({"error": "internal_error"}, status=500)

    broken.router.add_post("/api/carts", boom)
    server = await aiohttp_server(broken)
    bom = tmp_path / "bom.csv"
    bom.write_text("sku,qty\nKB-001,1\n")
    code, _, err = await cart(str(bom), "--url", str(server.make_url("")))
    assert code == 3
    assert err == "quoteflow cart: error: the service answered 500: internal_error\n"


async def test_usage_and_file_errors_exit_2(tmp_path: Path) -> None:
    for argv in (
        [str(tmp_path / "absent.csv")],
        [str(tmp_path)],
        [],
        ["bom.csv", "--url", "ftp://x"],
        ["bom.csv", "--currency", "usd"],
    ):
        code, out, err = await cart(*argv)
        assert (code, out) == (2, ""), argv
        assert len(err.splitlines()) == 1
        assert err.startswith("quoteflow cart: error: ")


def test_python_m_quoteflow_cart_runs_the_command(tmp_path: Path) -> None:
    """The console entry dispatches ``cart`` before the service's own options."""
    helped = subprocess.run(
        [sys.executable, "-m", "quoteflow", "cart", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert helped.returncode == 0
    assert "exit codes:" in helped.stdout
    assert "QUOTEFLOW_API_KEY" in helped.stdout
    missing = subprocess.run(
        [sys.executable, "-m", "quoteflow", "cart", "missing.csv"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        cwd=tmp_path,
    )
    assert missing.returncode == 2
    assert missing.stdout == ""
    assert missing.stderr.splitlines() == [
        "quoteflow cart: error: cannot read missing.csv: No such file or directory"
    ]
