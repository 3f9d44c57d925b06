"""A bill of materials as buyers keep it: a CSV file in, the basket as CSV out.

In (``decode_csv_cart``): RFC 4180, UTF-8 (a byte-order mark tolerated). The
header is the first row, within the first ``HEADER_ROWS``, that names both a
SKU column and a quantity column — KiCad's legacy exporter writes ``Source:``
and ``Date:`` lines above it — and its delimiter (comma, semicolon or tab) is
the file's. Names match ignoring case, spaces, ``_``, ``.`` and ``#``; an
``alternates`` column lists a line's approved alternates between bars. A row
with an empty SKU (mounting holes, fiducials) or a quantity of ``0`` or
``DNP`` is skipped and listed; every other problem is a 422 naming its line
and its physical row, all at once, as a JSON cart's are.

Out (``basket_csv``): the basket of a cart's JSON answer, one row per line,
per supplier's shipping and a total, amounts as decimal strings in the
answer's currency that add up to the total; a cell a spreadsheet would run
as a formula is written with a leading ``'``.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import attrs

from quoteflow.codec import line_alternates, repeated_skus
from quoteflow.errors import FieldError, InvalidRequest
from quoteflow.models import (
    MAX_LINE_QUANTITY,
    MAX_REF_LENGTH,
    MAX_SKU_LENGTH,
    CartLine,
    CartRequest,
)
from quoteflow.money import (
    MICROS_PER_MINOR,
    half_even,
    minor_unit,
    text_of_micros,
    text_of_minor,
)

HEADER_ROWS: Final = 20
"""Rows searched for the header: exporters write a few lines of their own above it."""
DELIMITERS: Final = (",", ";", "\t")
SKU_NAMES: Final = ("sku", "mpn", "partnumber", "manufacturerpartnumber")
"""Names of the SKU column, normalised; ``sku`` wins when another is there too."""
QUANTITY_NAMES: Final = ("quantity", "qty")
REF_NAMES: Final = ("ref", "reference", "designator")
ALTERNATES_NAMES: Final = ("alternates",)
ALTERNATES_SEPARATOR: Final = "|"
"""Between the SKUs of an ``alternates`` cell: a comma or semicolon may be the file's own."""
NOT_PLACED: Final = frozenset({"0", "dnp"})
"""Quantities that mean "not placed": the row is skipped and listed, not an error."""
_PLAIN_INTEGER: Final = re.compile(r"[0-9]+")


def csv_body_cap(max_lines: int) -> int:
    """Bytes a CSV cart may have: 4 KiB + 1 KiB per allowed line (real exports are wide)."""
    return 4096 + 1024 * max_lines


def _name(text: str) -> str:
    return re.sub(r"[\s_.#]", "", text).lower()


@attrs.frozen
class CsvCart:
    """A cart read from a CSV file, with what the answer says about the file."""

    cart: CartRequest
    refs: tuple[str | None, ...]
    """Each line's ``ref`` column, in line order (None: empty or no such column)."""
    ignored_columns: tuple[str, ...]
    skipped_rows: tuple[tuple[int, str], ...]
    """(physical row, why) of each row skipped: no SKU, or not placed."""


@attrs.frozen
class _Header:
    at: int
    """Index of the header's physical line (0-based)."""
    delimiter: str
    sku: int
    quantity: int
    ref: int | None
    alternates: int | None
    ignored: tuple[str, ...]


def decode_csv_cart(body: bytes, max_lines: int, scenario: str = "normal") -> CsvCart:
    """A CSV bill of materials as a cart; ``InvalidRequest`` with every problem."""
    text = _text(body)
    lines = text.splitlines(keepends=True)
    header = _header(lines)
    reader = csv.reader(io.StringIO("".join(lines[header.at + 1 :])), delimiter=header.delimiter)
    errors: list[FieldError] = []
    skipped: list[tuple[int, str]] = []
    found: list[tuple[int, str, str, str | None, str]] = []  # row, sku, quantity, ref, alternates
    while True:
        first_row = header.at + 2 + reader.line_num  # the record's first physical line
        try:
            record = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise InvalidRequest([FieldError((), f"row {first_row}: not CSV: {exc}")]) from None
        if not any(cell.strip() for cell in record):
            continue  # a blank row
        sku = _cell(record, header.sku)
        quantity = _cell(record, header.quantity)
        if not sku:
            skipped.append((first_row, "no SKU (not a part to buy)"))
            continue
        if quantity.lower() in NOT_PLACED:
            skipped.append((first_row, f"quantity {quantity}: not placed"))
            continue
        ref = _cell(record, header.ref) if header.ref is not None else ""
        found.append((first_row, sku, quantity, ref or None, _cell(record, header.alternates)))
    if not found and not errors:
        raise InvalidRequest([FieldError(("lines",), "no line to quote: every row was skipped")])
    if len(found) > max_lines:
        raise InvalidRequest(
            [FieldError(("lines",), f"must have 1 to {max_lines} lines, got {len(found)}")]
        )
    numbered: list[tuple[int, CartLine]] = []
    rows: dict[int, int] = {}
    # Every line's SKUs, valid or not: a repeat is named even on a row with other errors.
    named: list[tuple[int, tuple[str, ...]]] = []
    for index, (row, sku, quantity, designators, listed) in enumerate(found):
        rows[index] = row
        problems = len(errors)
        if len(sku) > MAX_SKU_LENGTH:
            errors.append(
                _row_error(index, "sku", row, f"must be 1 to {MAX_SKU_LENGTH} characters")
            )
        count = int(quantity) if _PLAIN_INTEGER.fullmatch(quantity) else None
        if count is None:
            errors.append(
                _row_error(index, "quantity", row, f"{quantity!r} is not a plain integer")
            )
        elif not 1 <= count <= MAX_LINE_QUANTITY:
            errors.append(
                _row_error(index, "quantity", row, f"must be from 1 to {MAX_LINE_QUANTITY}")
            )
        # Pieces between bars, blanks dropped: "B | C|" lists B and C.
        pieces = [piece.strip() for piece in listed.split(ALTERNATES_SEPARATOR)]
        alternates = line_alternates([p for p in pieces if p], sku, index, errors, row)
        named.append((index, (sku, *alternates)))
        if designators is not None and len(designators) > MAX_REF_LENGTH:
            problem = f"must be at most {MAX_REF_LENGTH} characters, got {len(designators)}"
            errors.append(_row_error(index, "ref", row, problem))
        if len(errors) == problems and count is not None:
            numbered.append((index, CartLine(sku, count, alternates, designators)))
    repeated = repeated_skus(named, errors, lambda i, k: _csv_place(rows[i], k), rows)
    if errors:
        raise InvalidRequest(errors)
    cart_lines = [line for index, line in numbered if index not in repeated]
    return CsvCart(
        cart=CartRequest(lines=tuple(cart_lines), scenario=scenario),
        refs=tuple(ref for _, _, _, ref, _ in found),
        ignored_columns=header.ignored,
        skipped_rows=tuple(skipped),
    )


def _csv_place(row: int, alternate: int | None) -> str:
    return f"row {row}" if alternate is None else f"an alternate on row {row}"


def _text(body: bytes) -> str:
    """UTF-8 text without its byte-order mark; ``InvalidRequest`` naming the first bad row."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        row = body[: exc.start].count(b"\n") + 1
        raise InvalidRequest(
            [FieldError((), f"row {row}: not UTF-8 (save the file as UTF-8 CSV)")]
        ) from None
    return text.removeprefix("\ufeff")


def _header(lines: Sequence[str]) -> _Header:
    """The first line among the first ``HEADER_ROWS`` naming a SKU and a quantity column."""
    for at, line in enumerate(lines[:HEADER_ROWS]):
        for delimiter in DELIMITERS:
            if delimiter not in line:
                continue
            try:
                cells = next(csv.reader([line], delimiter=delimiter), [])
            except csv.Error:
                continue
            names = [_name(cell) for cell in cells]
            sku = _column(names, SKU_NAMES)
            quantity = _column(names, QUANTITY_NAMES)
            if sku is None or quantity is None:
                continue
            ref = _column(names, REF_NAMES)
            alternates = _column(names, ALTERNATES_NAMES)
            used = {sku, quantity, ref, alternates}
            ignored = tuple(
                cell.strip()
                for index, cell in enumerate(cells)
                if index not in used and cell.strip()
            )
            return _Header(at, delimiter, sku, quantity, ref, alternates, ignored)
    raise InvalidRequest(
        [
            FieldError(
                (),
                f"no header row in the first {HEADER_ROWS} rows names a SKU column "
                "(sku, mpn, part number or manufacturer part number) and a quantity column "
                "(quantity or qty)",
            )
        ]
    )


def _column(names: Sequence[str], wanted: Sequence[str]) -> int | None:
    """The first column named by the first of ``wanted`` present (``sku`` before ``mpn``)."""
    for name in wanted:
        if name in names:
            return names.index(name)
    return None


def _cell(record: Sequence[str], index: int | None) -> str:
    if index is None or index >= len(record):
        return ""
    return record[index].strip()


def _row_error(index: int, field: str, row: int, message: str) -> FieldError:
    return FieldError(("lines", index, field), message, row=row)


# -- out -------------------------------------------------------------------------

COLUMNS: Final = (
    "kind",
    "ref",
    "sku",
    "bought_sku",
    "quantity",
    "buy_quantity",
    "supplier",
    "unit_price",
    "amount",
    "currency",
    "reason",
)
_FORMULA_STARTS: Final = ("=", "+", "-", "@")


def basket_csv(answer: Mapping[str, Any], refs: Sequence[str | None] = ()) -> bytes:
    """A cart's JSON answer's basket as CSV: a row per line, per shipping, and the total.

    CRLF, UTF-8 with a byte-order mark (spreadsheets then read it as UTF-8).
    ``amount`` cells are the answer's own minor units written in major units,
    so the ``line`` and ``shipping`` rows add up to the ``total`` row exactly;
    ``unit_price`` is the price a unit of the line cost, in the answer's
    currency (for a converted offer, its converted line over the units bought,
    to six places).
    """
    currency = str(answer.get("currency", "USD"))
    places = minor_unit(currency)
    assert places is not None
    basket = answer["basket"]
    picks = {pick["sku"]: pick for pick in basket["picks"]}
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\r\n")
    writer.writerow(COLUMNS)
    for index, line in enumerate(answer["lines"]):
        ref = line.get("ref") or (refs[index] if index < len(refs) else None) or ""
        pick = picks.get(line["sku"])
        if pick is None:
            reason = _why_unquoted(line)
            row = ["line", ref, line["sku"], "", line["quantity"], "", "", "", "", currency, reason]
        else:
            bought = pick.get("buy_quantity", pick["quantity"])
            row = [
                "line",
                ref,
                line["sku"],
                pick.get("bought_sku", pick["sku"]),
                pick["quantity"],
                bought,
                pick["supplier"],
                _unit_price(pick, bought, places),
                text_of_minor(pick["line_cents"], places),
                currency,
                "",
            ]
        writer.writerow([_safe(cell) for cell in row])
    for item in basket["shipping"]:
        amount = text_of_minor(item["shipping_cents"], places)
        row = ["shipping", "", "", "", "", "", item["supplier"], "", amount, currency, ""]
        writer.writerow([_safe(cell) for cell in row])
    reasons = []
    if not basket["complete"]:
        reasons.append("incomplete")
    if not basket["optimal"]:
        reasons.append("not_proven_optimal")
    total = text_of_minor(basket["total_cents"], places)
    writer.writerow(["total", "", "", "", "", "", "", "", total, currency, " ".join(reasons)])
    return ("\ufeff" + out.getvalue()).encode("utf-8")


def _unit_price(pick: Mapping[str, Any], bought: int, places: int) -> str:
    """A unit's price in the answer's currency: today's ``unit_cents``, or the converted
    line over the units bought, to the micro (indicative: the line's amount is exact)."""
    if "unit_cents" in pick:
        return text_of_minor(pick["unit_cents"], places)
    micros = half_even(pick["line_cents"] * MICROS_PER_MINOR[places], bought)
    return text_of_micros(micros, places)


def _why_unquoted(line: Mapping[str, Any]) -> str:
    failures = line.get("failures", [])
    named = "; ".join(
        " ".join(filter(None, (failure["supplier"], failure.get("sku"), failure["code"])))
        for failure in failures
    )
    return f"no quote ({named})" if named else "no quote (too little stock everywhere)"


def _safe(cell: object) -> object:
    """A text cell a spreadsheet would run as a formula, with a leading ``'``."""
    if isinstance(cell, str) and cell.startswith(_FORMULA_STARTS):
        return "'" + cell
    return cell
