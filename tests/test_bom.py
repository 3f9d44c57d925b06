"""A bill of materials as a CSV file: read as a cart, and the basket written back as CSV.

Every answer is read back with Python's ``csv`` module and held to the JSON
basket of the same cart; the fake suppliers answer on real sockets.
"""

from __future__ import annotations

import csv
import io
from decimal import Decimal
from typing import Any

from aiohttp import web

from tests.conftest import StartQuoteFlow
from tests.fakes import FakeSuppliers, json_body, payload, quote, status

KICAD = (
    "\ufeff"
    '"Source:";"/home/kb/board.kicad_sch"\r\n'
    '"Date:";"2026-12-01"\r\n'
    '"Tool:";"Eeschema 6"\r\n'
    "\r\n"
    '"Reference";"Value";"Footprint";"Qty";"MPN";"Mfr #"\r\n'
    '"R1,R2";"10k";"R_0402";"2";"KB-001";"Yageo"\r\n'
    '"FID1";"Fiducial";"Fid_1mm";"1";"";""\r\n'
    '"C1";"100n";"C_0402";"DNP";"MS-002";"Murata"\r\n'
    '"U1";"MCU";"LQFP-48";"1";"=HYPERLINK(""x"")";"ST"\r\n'
    '"J1";"Header\nlong";"PinHeader";"3";"CB-404";"Amphenol"\r\n'
)
"""A KiCad-style export: lines of its own above the header, semicolons, a byte-order mark,
a fiducial with no part, a part not placed, a quoted cell over two lines, and a SKU a
spreadsheet would run as a formula."""


async def no_cb_404(request: web.Request) -> web.StreamResponse:
    """Every SKU quoted but CB-404, which nobody sells."""
    if request.query["sku"] == "CB-404":
        return web.json_response({"error": "unknown_sku"}, status=404)
    return await quote()(request)


async def post_csv(client: Any, body: str | bytes, path: str = "/api/carts", **headers: str) -> Any:
    data = body.encode("utf-8") if isinstance(body, str) else body
    return await client.post(path, data=data, headers={"Content-Type": "text/csv", **headers})


async def test_a_kicad_export_is_quoted_as_a_cart(
    suppliers: FakeSuppliers, start_quoteflow: StartQuoteFlow
) -> None:
    for name in ("atlas", "boreal", "cedar"):
        suppliers.always(name, no_cb_404)
    client = await start_quoteflow()
    response = await post_csv(client, KICAD)
    assert response.status == 200, await response.text()
    answer = await response.json()
    assert [line["sku"] for line in answer["lines"]] == ["KB-001", '=HYPERLINK("x")', "CB-404"]
    assert [line["quantity"] for line in answer["lines"]] == [2, 1, 3]
    assert [line.get("ref") for line in answer["lines"]] == ["R1,R2", "U1", "J1"]
    assert answer["ignored_columns"] == ["Value", "Footprint", "Mfr #"]
    assert answer["skipped_rows"] == [
        {"row": 7, "reason": "no SKU (not a part to buy)"},
        {"row": 8, "reason": "quantity DNP: not placed"},
    ]


async def test_the_basket_as_csv_adds_up_to_the_json_basket(
    suppliers: FakeSuppliers, start_quoteflow: StartQuoteFlow
) -> None:
    for name in ("atlas", "boreal", "cedar"):
        suppliers.always(name, no_cb_404)
    client = await start_quoteflow()
    answer = await (await post_csv(client, KICAD)).json()
    for how in ({"path": "/api/carts?format=csv"}, {"Accept": "text/csv"}):
        path = how.pop("path", "/api/carts")
        response = await post_csv(client, KICAD, path, **how)
        assert response.status == 200
        assert response.content_type == "text/csv"
        raw = await response.read()
        assert raw.startswith("\ufeff".encode())
        assert b"\r\n" in raw
        rows = list(csv.DictReader(io.StringIO(raw.decode("utf-8-sig"))))
        lines = [row for row in rows if row["kind"] == "line"]
        shipping = [row for row in rows if row["kind"] == "shipping"]
        (total,) = [row for row in rows if row["kind"] == "total"]
        assert [row["ref"] for row in lines] == ["R1,R2", "U1", "J1"]
        assert lines[1]["sku"] == '\'=HYPERLINK("x")'  # never run as a formula
        amounts = [Decimal(row["amount"]) for row in lines + shipping if row["amount"]]
        assert sum(amounts) == Decimal(total["amount"])
        assert Decimal(total["amount"]) * 100 == answer["basket"]["total_cents"]
        unquoted = lines[2]
        assert (unquoted["supplier"], unquoted["amount"]) == ("", "")
        assert unquoted["reason"] == ("no quote (atlas http_404; boreal http_404; cedar http_404)")
        assert total["reason"] == "incomplete"
        assert {row["currency"] for row in rows} == {"USD"}
        bought = lines[0]
        assert (bought["bought_sku"], bought["buy_quantity"]) == ("KB-001", "2")
        assert Decimal(bought["unit_price"]) * 2 == Decimal(bought["amount"])
    explained = await post_csv(client, KICAD, "/api/carts?format=csv&explain=1")
    assert explained.content_type == "application/json"  # the bill stays JSON


async def test_every_problem_of_a_file_is_named_by_row(start_quoteflow: StartQuoteFlow) -> None:
    client = await start_quoteflow()
    body = (
        'ref,sku,qty\nR1,KB-001,10.0\nR2,MS-002,"1,000"\nR3,KB-001,2\nR4,HOT-01,0\nR5,HOT-02,-3\n'
    )
    response = await post_csv(client, body)
    assert response.status == 422
    detail = (await response.json())["detail"]
    assert detail == [
        {"loc": ["lines", 0, "quantity"], "msg": "'10.0' is not a plain integer", "row": 2},
        {"loc": ["lines", 1, "quantity"], "msg": "'1,000' is not a plain integer", "row": 3},
        {"loc": ["lines", 2, "sku"], "msg": "repeats row 2: ask a SKU once", "row": 4},
        {"loc": ["lines", 3, "quantity"], "msg": "'-3' is not a plain integer", "row": 6},
    ]


async def test_a_file_without_a_header_or_not_utf8_is_one_clear_422(
    start_quoteflow: StartQuoteFlow,
) -> None:
    client = await start_quoteflow()
    response = await post_csv(client, "part,count\nKB-001,2\n")
    assert response.status == 422
    (error,) = (await response.json())["detail"]
    assert "names a SKU column (sku, mpn" in error["msg"]
    assert "quantity column (quantity or qty)" in error["msg"]
    response = await post_csv(client, b"sku;qty\nKB-001;2\nM\xe9-002;1\n")
    assert response.status == 422
    (error,) = (await response.json())["detail"]
    assert error["msg"].startswith("row 3: not UTF-8")


async def test_a_tab_separated_file_with_sku_and_mpn_reads_the_sku_column(
    suppliers: FakeSuppliers, start_quoteflow: StartQuoteFlow
) -> None:
    client = await start_quoteflow()
    body = "Part Number\tSKU\tQTY\nXX-1\tKB-001\t 3 \n\t\t\nXX-2\tMS-002\t1\n"
    response = await post_csv(client, body)
    assert response.status == 200, await response.text()
    answer = await response.json()
    assert [(line["sku"], line["quantity"]) for line in answer["lines"]] == [
        ("KB-001", 3),
        ("MS-002", 1),
    ]
    assert answer["ignored_columns"] == ["Part Number"]
    assert answer["skipped_rows"] == []


async def test_a_cart_is_read_from_json_types_and_anything_else_is_415(
    suppliers: FakeSuppliers, start_quoteflow: StartQuoteFlow
) -> None:
    client = await start_quoteflow()
    body = b'{"lines": [{"sku": "KB-001", "quantity": 1}]}'
    for content_type in (
        "application/json",
        "application/json; charset=utf-8",
        "application/x-www-form-urlencoded",
    ):
        response = await client.post(
            "/api/carts", data=body, headers={"Content-Type": content_type}
        )
        assert response.status == 200, content_type
    response = await client.post("/api/carts", data=body, skip_auto_headers=["Content-Type"])
    assert response.status == 200
    response = await client.post("/api/carts", data=body, headers={"Content-Type": "text/plain"})
    assert response.status == 415
    refused = await response.json()
    assert refused["error"] == "unsupported_media_type"
    assert refused["accepted"] == [
        "application/json",
        "application/x-www-form-urlencoded",
        "text/csv",
    ]


async def test_a_csv_body_is_capped_for_real_exports(start_quoteflow: StartQuoteFlow) -> None:
    """4 KiB + 1 KiB per allowed line: a wide export fits, a larger body is a 413."""
    client = await start_quoteflow(max_cart_lines=2)
    wide = "sku,qty,notes\nKB-001,1," + "x" * 5000 + "\n"
    assert (await post_csv(client, wide)).status == 200
    assert (await post_csv(client, wide + "y" * 2000)).status == 413


async def only_cap_1b(request: web.Request) -> web.StreamResponse:
    """CAP-1 out of stock everywhere, its alternate CAP-1B in stock, the rest as usual."""
    if request.query["sku"] == "CAP-1":
        return await quote(stock=0)(request)
    if request.query["sku"] == "CAP-1Z":
        return web.json_response({"error": "unknown_sku"}, status=404)
    return await quote()(request)


async def test_an_alternates_column_lets_a_line_be_bought_as_its_alternate(
    suppliers: FakeSuppliers, start_quoteflow: StartQuoteFlow
) -> None:
    """SKUs between bars; the CSV basket's bought_sku is what is bought, its sums still exact."""
    for name in ("atlas", "boreal", "cedar"):
        suppliers.always(name, only_cap_1b)
    client = await start_quoteflow()
    body = "ref;sku;qty;alternates\nR1;KB-001;2;\nC1;CAP-1;2;CAP-1Z | CAP-1B|\n"
    answer = await (await post_csv(client, body)).json()
    assert answer["lines"][1]["alternates"] == ["CAP-1Z", "CAP-1B"]
    response = await post_csv(client, body, "/api/carts?format=csv")
    assert response.status == 200
    rows = list(csv.DictReader(io.StringIO((await response.read()).decode("utf-8-sig"))))
    assert [(r["kind"], r["ref"], r["sku"], r["bought_sku"]) for r in rows[:2]] == [
        ("line", "R1", "KB-001", "KB-001"),
        ("line", "C1", "CAP-1", "CAP-1B"),
    ]
    assert rows[1]["supplier"] == "boreal"
    amounts = sum(Decimal(r["amount"]) for r in rows if r["kind"] != "total")
    assert amounts == Decimal(rows[-1]["amount"]) == Decimal(answer["basket"]["total_cents"]) / 100


async def test_a_sku_listed_twice_across_lines_and_alternates_is_named_by_row(
    start_quoteflow: StartQuoteFlow,
) -> None:
    """The same rules as a JSON cart's, each error at its row and naming the earlier one."""
    client = await start_quoteflow()
    body = "sku,qty,alternates\nKB-001,1,MS-002|KB-001\nMS-002,1,\nHOT-01,1,A|B|C|D|E\n"
    response = await post_csv(client, body)
    assert response.status == 422
    detail = (await response.json())["detail"]
    assert detail == [
        {
            "loc": ["lines", 0, "alternates", 1],
            "msg": "is the line's own SKU: list only the SKUs that may replace it",
            "row": 2,
        },
        {
            "loc": ["lines", 1, "sku"],
            "msg": "repeats an alternate on row 2: ask a SKU once",
            "row": 3,
        },
        {"loc": ["lines", 2, "alternates"], "msg": "must have at most 4 SKUs, got 5", "row": 4},
    ]


async def test_an_offer_bought_in_a_larger_quantity_shows_both_quantities(
    suppliers: FakeSuppliers, start_quoteflow: StartQuoteFlow
) -> None:
    reel = {**payload("boreal", "RES-1"), "unit_price": "0.0034", "moq": 10, "multiple": 10}
    del reel["unit_cents"]
    suppliers.always("boreal", json_body(reel))
    suppliers.always("atlas", status(404))
    suppliers.always("cedar", status(404))
    client = await start_quoteflow()
    response = await post_csv(client, "sku,qty\nRES-1,7\n", "/api/carts?format=csv")
    rows = list(csv.DictReader(io.StringIO((await response.read()).decode("utf-8-sig"))))
    line = rows[0]
    assert (line["quantity"], line["buy_quantity"], line["supplier"]) == ("7", "10", "boreal")
    assert line["amount"] == "0.03"  # 10 × 0.0034, rounded half-even to the cent
    assert line["unit_price"] == "0.003"  # the converted line over the units bought
