"""``quoteflow cart FILE``: a bill of materials quoted by a running QuoteFlow, from a shell.

One file in (CSV as BOM tools export it, or a JSON cart), one ``POST
/api/carts`` out, and the basket printed as a table a person reads — or the
JSON answer as it came (``--json``) — with the basket's CSV written from that
same answer (``--out``). The exit code says how it went (``EXIT_CODES``), so a
script can tell an incomplete basket from a refused file from a service that
is down.

It talks HTTP to the service and never runs it: nothing here imports the
service's own modules, only ``bom`` (the CSV out) and ``money`` (amounts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, NoReturn, TextIO
from urllib.parse import urlsplit

import aiohttp

from quoteflow.bom import basket_csv
from quoteflow.money import minor_unit, text_of_minor

PROG: Final = "quoteflow cart"
DEFAULT_URL: Final = "http://127.0.0.1:9100"
TIMEOUT: Final = 30.0
"""Seconds for the whole request: a cart's own budget is 2 s unless the service says more."""

COMPLETE, UNQUOTED, USAGE, UNREACHABLE, REFUSED = 0, 1, 2, 3, 4
EXIT_CODES: Final = (
    (COMPLETE, "the basket is complete: every line quoted"),
    (UNQUOTED, "some line has no quote (the basket prices the rest)"),
    (USAGE, "usage or file error (a missing or unreadable file, a bad option)"),
    (UNREACHABLE, "the service is unreachable, timed out, or answered 5xx"),
    (REFUSED, "the service refused the BOM (4xx): its errors printed one a line, by row"),
)
CSV_TYPE: Final = "text/csv"
JSON_TYPE: Final = "application/json"


class _UsageError(Exception):
    """A bad command line: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so ``run`` returns its code."""

    def error(self, message: str) -> NoReturn:
        raise _UsageError(message)


def _parser() -> _Parser:
    codes = "\n".join(f"  {code}  {what}" for code, what in EXIT_CODES)
    parser = _Parser(
        prog=PROG,
        add_help=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Quote a bill of materials with a running QuoteFlow (POST /api/carts) and print\n"
            "the basket: each line's pick, each supplier's shipping, the total against the\n"
            "per-line total, the unquoted lines and the skipped rows."
        ),
        epilog=(
            "FILE: a CSV BOM (a .csv file, or any file that is not JSON) is sent as text/csv;\n"
            'a JSON cart ({"lines": [{"sku", "quantity"}, ...]}) as application/json.\n\n'
            "environment:\n"
            f"  QUOTEFLOW_URL      the service (default {DEFAULT_URL}; --url wins)\n"
            "  QUOTEFLOW_API_KEY  sent as Authorization: Bearer <key>\n\n"
            f"exit codes:\n{codes}"
        ),
    )
    parser.add_argument("file", metavar="FILE", help="the BOM: CSV or JSON")
    parser.add_argument(
        "--url", help=f"the QuoteFlow to ask (default: $QUOTEFLOW_URL, else {DEFAULT_URL})"
    )
    parser.add_argument(
        "--out", metavar="FILE.csv", help="also write the basket as CSV (from the same answer)"
    )
    parser.add_argument(
        "--json", action="store_true", help="print the JSON answer instead of the table"
    )
    parser.add_argument(
        "--currency", metavar="CODE", help="the answer's currency (ISO 4217, e.g. EUR)"
    )
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``quoteflow cart ARGS``: ``argv`` is what follows ``cart``."""
    return asyncio.run(run(sys.argv[2:] if argv is None else argv, os.environ, sys.stdout))


async def run(
    argv: Sequence[str],
    environ: Mapping[str, str],
    stdout: TextIO,
    stderr: TextIO | None = None,
) -> int:
    """Read the file, ask the service once, print; the exit code (``EXIT_CODES``)."""
    err = sys.stderr if stderr is None else stderr

    def fail(code: int, message: str) -> int:
        print(f"{PROG}: error: {message}", file=err)
        return code

    parser = _parser()
    if "-h" in argv or "--help" in argv:
        stdout.write(parser.format_help())
        return COMPLETE
    try:
        args = parser.parse_args(argv)
        url = args.url or environ.get("QUOTEFLOW_URL") or DEFAULT_URL
        _check_url(url)
        if args.currency is not None and minor_unit(args.currency) is None:
            raise _UsageError(f"--currency {args.currency}: not an ISO 4217 code (e.g. EUR)")
    except _UsageError as exc:
        return fail(USAGE, f"{exc} (see {PROG} --help)")
    try:
        raw = await asyncio.to_thread(Path(args.file).read_bytes)
    except OSError as exc:
        return fail(USAGE, f"cannot read {args.file}: {exc.strerror or exc}")
    content_type, body = _body(args.file, raw, args.currency)
    headers = {"Content-Type": content_type, "Accept": JSON_TYPE}
    key = environ.get("QUOTEFLOW_API_KEY")
    if key:
        headers["Authorization"] = f"Bearer {key}"
    params = {"currency": args.currency} if args.currency and content_type == CSV_TYPE else {}
    target = url.rstrip("/") + "/api/carts"
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT)) as session,
            session.post(target, data=body, headers=headers, params=params) as response,
        ):
            status = response.status
            text = (await response.read()).decode("utf-8", "replace")
    except TimeoutError:
        return fail(UNREACHABLE, f"{url} did not answer within {TIMEOUT:g} s")
    except (aiohttp.ClientError, OSError) as exc:
        return fail(UNREACHABLE, f"cannot reach {url}: {exc or type(exc).__name__}")
    answer = _json_or_none(text)
    if status >= 500:
        return fail(UNREACHABLE, f"the service answered {status}: {_what(answer, text)}")
    if status >= 400:
        print(f"{PROG}: the service refused {args.file} ({status}):", file=err)
        for line in _refusal(answer, text):
            print(line, file=err)
        return REFUSED
    if status != 200 or not isinstance(answer, dict) or "basket" not in answer:
        return fail(UNREACHABLE, f"{url} is not a QuoteFlow: {status} {text[:200]!r}")
    if args.json:
        stdout.write(text if text.endswith("\n") else text + "\n")
    else:
        stdout.write(table(answer))
    if args.out is not None:
        try:
            await asyncio.to_thread(Path(args.out).write_bytes, basket_csv(answer))
        except OSError as exc:
            return fail(USAGE, f"cannot write {args.out}: {exc.strerror or exc}")
    return COMPLETE if answer["basket"]["complete"] else UNQUOTED


def _check_url(url: str) -> None:
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _UsageError(f"{url}: not an http(s) URL (--url or QUOTEFLOW_URL)")


def _body(name: str, raw: bytes, currency: str | None) -> tuple[str, bytes]:
    """The request's content type and body: JSON when the file is JSON, else CSV as it is.

    A ``.csv`` file is CSV whatever it holds; a ``.json`` file is JSON even
    when broken (the service says where). A JSON cart's byte-order mark is
    dropped; ``currency`` becomes its ``currency`` key.
    """
    suffix = Path(name).suffix.lower()
    if suffix == ".csv":
        return CSV_TYPE, raw
    try:
        obj = json.loads(raw.decode("utf-8-sig"))
    except ValueError:  # not UTF-8, or not JSON
        return (JSON_TYPE, raw) if suffix == ".json" else (CSV_TYPE, raw)
    if currency is not None and isinstance(obj, dict):
        obj["currency"] = currency
        return JSON_TYPE, json.dumps(obj).encode("utf-8")
    return JSON_TYPE, raw.removeprefix(b"\xef\xbb\xbf")


def _json_or_none(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def _what(answer: Any, text: str) -> str:
    if isinstance(answer, dict) and "error" in answer:
        detail = answer.get("detail")
        return f"{answer['error']}: {detail}" if isinstance(detail, str) else str(answer["error"])
    return text[:200] or "(no body)"


def _refusal(answer: Any, text: str) -> list[str]:
    """A 4xx answer's errors, one a line: ``row 3: lines.1.quantity: '10.0' is not ...``."""
    detail = answer.get("detail") if isinstance(answer, dict) else None
    if not isinstance(detail, list):
        return [_what(answer, text)]
    lines = []
    for error in detail:
        if not isinstance(error, dict):
            lines.append(str(error))
            continue
        where = ".".join(str(part) for part in error.get("loc", []))
        text_of = f"{where}: {error.get('msg')}" if where else str(error.get("msg"))
        lines.append(f"row {error['row']}: {text_of}" if "row" in error else text_of)
    return lines


def table(answer: Mapping[str, Any]) -> str:
    """A cart's answer as a person reads it: picks, shipping, totals, unquoted, skipped."""
    currency = str(answer.get("currency", "USD"))
    places = minor_unit(currency)
    places = 2 if places is None else places
    basket = answer["basket"]
    picks = {pick["sku"]: pick for pick in basket["picks"]}

    def money(cents: int) -> str:
        return text_of_minor(cents, places)

    rows = [("ref", "sku", "qty", "buy", "supplier", f"amount {currency}")]
    unquoted = []
    for line in answer["lines"]:
        ref = line.get("ref") or ""
        pick = picks.get(line["sku"])
        if pick is None:
            rows.append((ref, line["sku"], str(line["quantity"]), "-", "-", "no quote"))
            unquoted.append(line)
            continue
        bought = pick.get("bought_sku", pick["sku"])
        sku = line["sku"] if bought == line["sku"] else f"{line['sku']} -> {bought}"
        buy = pick.get("buy_quantity", pick["quantity"])
        rows.append(
            (ref, sku, str(line["quantity"]), str(buy), pick["supplier"], money(pick["line_cents"]))
        )
    for item in basket["shipping"]:
        rows.append(("", "shipping", "", "", item["supplier"], money(item["shipping_cents"])))
    widths = [max(len(row[column]) for row in rows) for column in range(6)]
    right = (False, False, True, True, False, True)

    def render(row: Sequence[str]) -> str:
        cells = [
            cell.rjust(width) if is_right else cell.ljust(width)
            for cell, width, is_right in zip(row, widths, right, strict=True)
        ]
        return "  ".join(cells).rstrip()

    out = [render(row) for row in rows[:1]]
    out.append("  ".join("-" * width for width in widths))
    out.extend(render(row) for row in rows[1:])
    total, per_line = basket["total_cents"], basket["per_line_total_cents"]
    label = max(len("total"), len("per-line total"))
    number = max(len(money(total)), len(money(per_line)))
    out.append("")
    out.append(f"{'total':<{label}}  {money(total):>{number}} {currency}")
    out.append(
        f"{'per-line total':<{label}}  {money(per_line):>{number}} {currency}"
        "  (each line's best, shipped on its own)"
    )
    if per_line > total:
        out.append(f"{'saving':<{label}}  {money(per_line - total):>{number}} {currency}")
    if not basket.get("optimal", True):
        out.append("the basket is the best found, not proven the cheapest (the deadline came)")
    if unquoted:
        out.append("")
        out.append(f"unquoted ({len(unquoted)} of {len(answer['lines'])} lines):")
        for line in unquoted:
            ref = f" ({line['ref']})" if line.get("ref") else ""
            out.append(f"  {line['sku']}{ref}: {_why_unquoted(line)}")
    skipped = answer.get("skipped_rows") or []
    if skipped:
        out.append("")
        out.append("skipped rows:")
        out.extend(f"  row {item['row']}: {item['reason']}" for item in skipped)
    ignored = answer.get("ignored_columns") or []
    if ignored:
        out.append("")
        out.append("ignored columns: " + ", ".join(ignored))
    return "\n".join(out) + "\n"


def _why_unquoted(line: Mapping[str, Any]) -> str:
    failures = line.get("failures") or []
    if not failures:
        return "no supplier has enough in stock"
    # On a line with alternates each failure names its SKU: which one failed where.
    return "no quote: " + ", ".join(
        " ".join(filter(None, (f["supplier"], f.get("sku"), f["code"]))) for f in failures
    )
