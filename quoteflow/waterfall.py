"""The budget bill as a picture: an SVG waterfall drawn from an answer and its bill.

The bill (``?explain=1``) is the truth of a request, but a tree of
milliseconds is hard to read; the people QuoteFlow is for read a browser's
network waterfall every day. So the same numbers are drawn the same way:
time across from admission, the deadline as a line, one row per supplier
(per supplier call, for a cart), each attempt's slot wait and time on the
wire, the backoff between attempts, and why the supplier ``stopped``.

The picture is for tools as much as for eyes: every row, attempt, backoff
and the deadline carries ``data-*`` attributes holding the bill's own
values verbatim, so a test or a script reads the SVG as it would the JSON.

Pure functions of the JSON answer (``codec.encode_result`` /
``codec.encode_cart`` with the bill under ``explain``): no I/O, no clock,
no aiohttp. Every string that came from a caller or a supplier (a SKU, a
caller's name, a request id) reaches the SVG only through ``_text`` or
``_attr``, which escape it; a SKU of ``<script>`` is text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

WIDTH = 980
LABEL_X = 10
PLOT_X0 = 150.0
PLOT_X1 = 770.0
STOPPED_X = 786
BAR_H = 14
LANE_H = 18
TEXT_H = 12
HEADER_H = 58
AXIS_H = 22
CHAR_W = 6.2
"""Rough width of one character of the 11 px labels: enough to keep labels apart."""
FONT = "system-ui, -apple-system, 'Segoe UI', sans-serif"

_COLOURS = {
    "ok": "#2f855a",
    "timeout": "#c05621",
    "transport_error": "#c53030",
    "invalid_data": "#6b46c1",
    "cancelled": "#a0aec0",
    "circuit_open": "#4a5568",
}
_HTTP_COLOUR = "#c53030"
_OTHER_COLOUR = "#718096"
_SLOT_COLOUR = "#cbd5e0"
_BACKOFF_COLOUR = "#d69e2e"

_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
"""Characters XML 1.0 cannot carry at all, even escaped (a JSON SKU may hold \\u0001)."""


def _clean(value: object) -> str:
    return _NOT_XML.sub(lambda m: f"\\u{ord(m.group()):04x}", str(value))


def _text(value: object) -> str:
    """``value`` as the text of an element: markup in it stays text."""
    return _clean(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _attr(value: object) -> str:
    """``value`` as the inside of a double-quoted attribute."""
    return _text(value).replace('"', "&quot;").replace("\n", "&#10;").replace("\r", "&#13;")


def _num(value: float) -> str:
    """A number of the bill, as the bill gives it (``28.496``, ``800.0``)."""
    return repr(value)


def _px(value: float) -> str:
    return f"{value:.1f}"


def _ms_words(value: float) -> str:
    return f"{value:.1f} ms" if value < 100 else f"{value:.0f} ms"


def _colour(outcome: str) -> str:
    if outcome.startswith("http_"):
        return _HTTP_COLOUR
    return _COLOURS.get(outcome, _OTHER_COLOUR)


class _Scale:
    """Milliseconds to x. Answers far shorter than the deadline are drawn zoomed in.

    A 30 ms answer on an 800 ms axis is a few pixels wide and unreadable; then
    the axis ends a little past the last event and the deadline is drawn at
    the right edge beyond a visible break, still labelled with its value.
    """

    def __init__(self, deadline_ms: float, last_ms: float) -> None:
        self.deadline_ms = deadline_ms
        self.broken = 0 < last_ms < deadline_ms / 3
        end = last_ms * 1.15 if self.broken else max(deadline_ms, last_ms) * 1.02
        self.end_ms = max(end, 1.0)
        self.x1 = PLOT_X1 - 40 if self.broken else PLOT_X1

    def x(self, ms: float) -> float:
        return PLOT_X0 + (self.x1 - PLOT_X0) * max(0.0, min(ms, self.end_ms)) / self.end_ms

    def deadline_x(self) -> float:
        return PLOT_X1 - 8 if self.broken else self.x(self.deadline_ms)

    def width(self, start_ms: float, ms: float) -> float:
        return max(self.x(start_ms + ms) - self.x(start_ms), 1.0)

    def ticks(self) -> list[float]:
        raw = self.end_ms / 6
        magnitude = 10 ** math.floor(math.log10(raw))
        step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
        return [i * step for i in range(int(self.end_ms / step) + 1)]


class _Labels:
    """Two lines of small labels under a row's bars, each label placed where it fits."""

    def __init__(self) -> None:
        self.free = [0.0, 0.0]

    def place(self, x: float, text: str) -> tuple[float, int]:
        width = len(text) * CHAR_W
        for line, free in enumerate(self.free):
            if x >= free:
                self.free[line] = x + width + 8
                return x, line
        line = 0 if self.free[0] <= self.free[1] else 1
        at = self.free[line]
        self.free[line] = at + width + 8
        return at, line


def _events_end(bills: Iterable[Mapping[str, Any]]) -> float:
    """The last millisecond any attempt, backoff or give-up of ``bills`` reaches."""
    last = 0.0
    for bill in bills:
        end = 0.0
        for attempt in bill.get("attempts", ()):
            end = attempt["start_ms"] + attempt["slot_wait_ms"] + attempt["duration_ms"]
            end += attempt.get("backoff_ms") or 0.0
            last = max(last, end)
        if bill.get("gave_up_after_ms") is not None:
            last = max(last, end + bill["gave_up_after_ms"])
    return last


def _lanes(attempts: Sequence[Mapping[str, Any]]) -> list[int]:
    """A lane for each attempt: a hedge that overlaps the first goes below it."""
    lanes: list[int] = []
    ends: list[float] = []
    for attempt in attempts:
        start = attempt["start_ms"]
        lane = next((i for i, end in enumerate(ends) if start >= end), len(ends))
        end = start + attempt["slot_wait_ms"] + attempt["duration_ms"]
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = end
        lanes.append(lane)
    return lanes


def _marks(bill: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """The row's marks: (kind, value for ``data-mark-value``, words on the picture)."""
    marks: list[tuple[str, str, str]] = []
    if bill.get("probe"):
        marks.append(("probe", "true", "half-open probe"))
    if bill.get("joined") is not None:
        marks.append(("joined", str(bill["joined"]), f"joined {bill['joined']}"))
    if bill.get("handed_over") is not None:
        marks.append(
            ("handed_over", str(bill["handed_over"]), f"handed over to {bill['handed_over']}")
        )
    if bill.get("stopped") == "cached":
        marks.append(("cached", "true", "cached quote"))
    if bill.get("stale_if_error") is not None:
        stale = str(bill["stale_if_error"])
        marks.append(("stale_if_error", stale, f"stale quote for {stale}"))
    if bill.get("rate_wait_ms") is not None:
        rate = bill["rate_wait_ms"]
        marks.append(("rate_wait", _num(rate), f"rate wait {_ms_words(rate)}"))
    if bill.get("token_wait_ms") is not None:
        token = bill["token_wait_ms"]
        marks.append(("token_wait", _num(token), f"token wait {_ms_words(token)}"))
    if bill.get("won") is not None:
        marks.append(("won", str(bill["won"]), f"attempt {bill['won']} won"))
    return marks


def _row(
    out: list[str],
    y: float,
    scale: _Scale,
    name: str,
    bill: Mapping[str, Any],
    *,
    label: str,
    extra: str = "",
) -> float:
    """Draw one supplier's (or one cart call's) row at ``y``; return its height."""
    attempts: Sequence[Mapping[str, Any]] = bill.get("attempts", ())
    stopped = bill.get("stopped")
    lanes = _lanes(attempts)
    bar_lanes = max(lanes, default=0) + 1
    text_y0 = y + bar_lanes * LANE_H + 9
    labels = _Labels()
    out.append(
        f'<g class="row" data-supplier="{_attr(name)}" data-stopped="{_attr(stopped or "")}"'
        f"{extra}>"
    )
    out.append(f'<text x="{LABEL_X}" y="{_px(y + 11)}" font-weight="600">{_text(label)}</text>')
    end_ms = 0.0
    for attempt, lane in zip(attempts, lanes, strict=True):
        end_ms = _attempt(out, y + lane * LANE_H, text_y0, scale, attempt, labels)
    if bill.get("gave_up_after_ms") is not None:
        waited = bill["gave_up_after_ms"]
        x = scale.x(end_ms)
        w = scale.width(end_ms, waited)
        words = f"gave up after {_ms_words(waited)}"
        out.append(
            f'<g class="mark" data-mark="gave_up" data-mark-value="{_num(waited)}"'
            f' data-gave-up-after-ms="{_num(waited)}">'
            f"<title>{_text(words)}: no slot came while the supplier still had time</title>"
            f'<rect x="{_px(x)}" y="{_px(y + 3)}" width="{_px(w)}" height="{BAR_H - 6}"'
            f' fill="none" stroke="#718096" stroke-dasharray="3 2"/>'
        )
        lx, line = labels.place(x, words)
        out.append(_small(lx, text_y0 + line * TEXT_H, words) + "</g>")
    for kind, value, words in _marks(bill):
        lx, line = labels.place(scale.x(0 if not attempts else end_ms), words)
        out.append(
            f'<g class="mark" data-mark="{_attr(kind)}" data-mark-value="{_attr(value)}">'
            + _small(lx, text_y0 + line * TEXT_H, "◆ " + words, fill="#2b6cb0")
            + "</g>"
        )
    if extra_lines := bill.get("lines"):
        lines = ", ".join(str(sku) for sku in extra_lines[:4])
        more = f" and {len(extra_lines) - 4} more" if len(extra_lines) > 4 else ""
        words = f"lines: {lines}{more}"
        out.append(_small(STOPPED_X, y + 11 + LANE_H, words, fill="#4a5568"))
    stopped_words = "stopped: " + str(stopped) if stopped else "not finished"
    out.append(
        f'<text class="stopped" x="{STOPPED_X}" y="{_px(y + 11)}">{_text(stopped_words)}</text>'
    )
    out.append("</g>")
    used_lines = sum(1 for free in labels.free if free > 0)
    return bar_lanes * LANE_H + max(used_lines, 1) * TEXT_H + 10


def _attempt(
    out: list[str],
    y: float,
    text_y0: float,
    scale: _Scale,
    attempt: Mapping[str, Any],
    labels: _Labels,
) -> float:
    """One attempt: its slot wait, its time on the wire, then its backoff; return its end."""
    start: float = attempt["start_ms"]
    wait: float = attempt["slot_wait_ms"]
    duration: float = attempt["duration_ms"]
    outcome = str(attempt["outcome"])
    status = attempt.get("status")
    sent = start + wait
    end = sent + duration
    flags = ""
    notes: list[str] = []
    if attempt.get("cut_short"):
        flags += ' data-cut-short="true"'
        notes.append("cut short")
    if attempt.get("hedge"):
        flags += ' data-hedge="true"'
        notes.append("hedge")
    words = outcome + "".join(f" · {note}" for note in notes)
    tip = (
        f"attempt {attempt['attempt']}: {outcome}"
        + ("" if status is None else f" (HTTP {status})")
        + f", waited {_ms_words(wait)} for a slot, {_ms_words(duration)} on the wire,"
        f" from {_ms_words(start)}" + "".join(f"; {note}" for note in notes)
    )
    out.append(
        f'<g class="attempt" data-attempt="{_attr(attempt["attempt"])}"'
        f' data-outcome="{_attr(outcome)}" data-start-ms="{_num(start)}"'
        f' data-slot-wait-ms="{_num(wait)}" data-duration-ms="{_num(duration)}"'
        + ("" if status is None else f' data-status="{_attr(status)}"')
        + f"{flags}><title>{_text(tip)}</title>"
    )
    if wait > 0:
        out.append(
            f'<rect class="slot-wait" x="{_px(scale.x(start))}" y="{_px(y + 3)}"'
            f' width="{_px(scale.width(start, wait))}" height="{BAR_H - 6}" fill="{_SLOT_COLOUR}"/>'
        )
    x, w = scale.x(sent), scale.width(sent, duration)
    stroke = ' stroke="#1a202c" stroke-dasharray="2 2"' if attempt.get("cut_short") else ""
    out.append(
        f'<rect class="wire" x="{_px(x)}" y="{_px(y)}" width="{_px(w)}" height="{BAR_H}"'
        f' fill="{_colour(outcome)}"{stroke}/>'
    )
    label = f"{attempt['attempt']}: {words}"
    if w >= len(label) * CHAR_W + 6:
        out.append(f'<text x="{_px(x + 3)}" y="{_px(y + 11)}" fill="#ffffff">{_text(label)}</text>')
    else:
        lx, line = labels.place(x, label)
        out.append(_small(lx, text_y0 + line * TEXT_H, label))
    out.append("</g>")
    backoff = attempt.get("backoff_ms")
    if backoff is not None:
        bx, bw = scale.x(end), scale.width(end, backoff)
        words = f"backoff {_ms_words(backoff)}"
        out.append(
            f'<g class="backoff" data-backoff-ms="{_num(backoff)}"><title>{_text(words)}</title>'
            f'<line x1="{_px(bx)}" y1="{_px(y + BAR_H / 2)}" x2="{_px(bx + bw)}"'
            f' y2="{_px(y + BAR_H / 2)}" stroke="{_BACKOFF_COLOUR}" stroke-width="3"/>'
        )
        lx, line = labels.place(bx, words)
        out.append(_small(lx, text_y0 + line * TEXT_H, words, fill="#975a16") + "</g>")
        end += backoff
    return end


def _small(x: float, y: float, words: str, fill: str = "#2d3748") -> str:
    return f'<text x="{_px(x)}" y="{_px(y)}" font-size="10" fill="{fill}">{_text(words)}</text>'


def _axis(out: list[str], y: float, bottom: float, scale: _Scale) -> None:
    out.append(f'<g class="axis" transform="translate(0 {_px(y)})">')
    out.append(f'<line x1="{_px(PLOT_X0)}" y1="0" x2="{_px(scale.x1)}" y2="0" stroke="#a0aec0"/>')
    for tick in scale.ticks():
        x = scale.x(tick)
        out.append(
            f'<line x1="{_px(x)}" y1="0" x2="{_px(x)}" y2="{_px(bottom - y)}"'
            f' stroke="#edf2f7"/>'
            f'<text x="{_px(x)}" y="-4" font-size="10" text-anchor="middle" fill="#4a5568">'
            f"{_text(f'{tick:g} ms')}</text>"
        )
    if scale.broken:
        x = scale.x1 + 10
        out.append(
            f'<path d="M{_px(x)} -4 l6 8 l6 -8 l6 8" fill="none" stroke="#a0aec0"/>'
            f'<text x="{_px(x)}" y="-8" font-size="10" fill="#4a5568">zoomed in</text>'
        )
    out.append("</g>")


def _deadline(out: list[str], top: float, bottom: float, scale: _Scale, words: str) -> None:
    x = scale.deadline_x()
    out.append(
        f'<g class="deadline" data-deadline-ms="{_num(scale.deadline_ms)}">'
        f"<title>{_text(words)}</title>"
        f'<line x1="{_px(x)}" y1="{_px(top)}" x2="{_px(x)}" y2="{_px(bottom)}"'
        f' stroke="#e53e3e" stroke-width="2" stroke-dasharray="6 3"/>'
        f'<text x="{_px(x)}" y="{_px(bottom + 12)}" font-size="10" text-anchor="end"'
        f' fill="#c53030">{_text(words)}</text></g>'
    )


def _document(
    *,
    request_id: str,
    heading: str,
    subheading: str,
    desc: str,
    kind: str,
    body: list[str],
    height: float,
    attrs: str,
) -> str:
    ident = "bill-" + _attr(request_id)
    return "".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" class="waterfall" role="img"'
            f' width="{WIDTH}" height="{_px(height)}" viewBox="0 0 {WIDTH} {_px(height)}"'
            f' aria-labelledby="{ident}-title {ident}-desc" data-request-id="{_attr(request_id)}"'
            f' data-kind="{kind}"{attrs} font-family="{_attr(FONT)}" font-size="11">',
            f'<title id="{ident}-title">{_text(f"QuoteFlow budget bill, request {request_id}")}'
            "</title>",
            f'<desc id="{ident}-desc">{_text(desc)}</desc>',
            f'<rect width="{WIDTH}" height="{_px(height)}" fill="#ffffff"/>',
            f'<text x="{LABEL_X}" y="18" font-size="14" font-weight="700">{_text(heading)}</text>',
            f'<text x="{LABEL_X}" y="34" fill="#4a5568">{_text(subheading)}</text>',
            *body,
            "</svg>",
        ]
    )


def _priced(quote: Mapping[str, Any]) -> str:
    """How a quote's total is made: today's unit price, or the offer's legal buy and rate."""
    stock = f"{quote['stock']} in stock"
    if "unit_cents" in quote:
        return f"{quote['unit_cents']} ¢ each + {quote['shipping_cents']} ¢ shipping, {stock}"
    offer = quote.get("offer", {})
    bought = f"{quote['buy_quantity']} bought, " if "buy_quantity" in quote else ""
    each = f"{offer.get('unit_price')} {offer.get('currency')} each"
    rate = f" at {offer['rate']} ({offer.get('rate_date')})" if "rate" in offer else ""
    return (
        f"{bought}{each}{rate}: {quote['line_cents']} ¢ + {quote['shipping_cents']} ¢ shipping,"
        f" {stock}"
    )


_MONEY_ATTRS = (
    ("unit_cents", "data-unit-cents"),
    ("line_cents", "data-line-cents"),
    ("buy_quantity", "data-buy-quantity"),
)
_OFFER_ATTRS = (
    ("currency", "data-offer-currency"),
    ("unit_price", "data-offer-unit-price"),
    ("shipping", "data-offer-shipping"),
    ("rate", "data-rate"),
    ("rate_date", "data-rate-date"),
)


def _money_attrs(item: Mapping[str, Any]) -> str:
    """A quote's or a pick's money fields as data attributes: only those the answer has."""
    found = "".join(f' {name}="{_attr(item[key])}"' for key, name in _MONEY_ATTRS if key in item)
    offer = item.get("offer")
    if offer is not None:
        found += "".join(
            f' {name}="{_attr(offer[key])}"' for key, name in _OFFER_ATTRS if key in offer
        )
    return found


def _quote_words(quote: Mapping[str, Any]) -> str:
    return f"{quote['supplier']} {quote['total_cents']} ¢"


def _said(name: str, bill: Mapping[str, Any]) -> str:
    attempts = bill.get("attempts", ())
    outcomes = ", ".join(str(a["outcome"]) for a in attempts)
    tried = f"{len(attempts)} attempt{'s' if len(attempts) != 1 else ''}"
    return (
        f"{name}: {tried}"
        + (f" ({outcomes})" if outcomes else "")
        + (f", stopped {bill.get('stopped')}")
    )


def render_quote(answer: Mapping[str, Any]) -> str:
    """The waterfall of one quote: ``answer`` is the JSON result with its bill under ``explain``."""
    explain = answer["explain"]
    bills: Mapping[str, Mapping[str, Any]] = explain["suppliers"]
    budget = explain["budget_ms"]
    scale = _Scale(budget, _events_end(bills.values()))
    request_id = str(answer["request_id"])
    best = answer.get("best")
    heading = f"{answer['sku']} × {answer['quantity']}"
    subheading = (
        f"answered in {_ms_words(answer['elapsed_ms'])} of a {_ms_words(budget)} budget · "
        + (f"best: {_quote_words(best)}" if best else "no usable quote")
        + (f" · caller {explain['caller']}" if "caller" in explain else "")
    )
    out: list[str] = []
    top = float(HEADER_H)
    y = top + 6
    for name, bill in bills.items():
        y += _row(out, y, scale, name, bill, label=name)
    bottom = y
    axis: list[str] = []
    _axis(axis, top, bottom, scale)
    _deadline(axis, top - 6, bottom, scale, f"deadline {_ms_words(budget)}")
    legend, y = _legend(bottom + 28, answer.get("quotes", ()), answer.get("failures", ()), best)
    desc = (
        f"Quote for {heading}: "
        + (f"best {_quote_words(best)}. " if best else "no usable quote. ")
        + " ".join(_said(name, bill) + "." for name, bill in bills.items())
        + f" Answered in {_ms_words(answer['elapsed_ms'])} of {_ms_words(budget)}."
    )
    return _document(
        request_id=request_id,
        heading=heading,
        subheading=subheading,
        desc=desc,
        kind="quote",
        body=[*axis, *out, *legend],
        height=y + 8,
        attrs=f' data-budget-ms="{_num(budget)}" data-elapsed-ms="{_num(answer["elapsed_ms"])}"',
    )


def _legend(
    y: float,
    quotes: Sequence[Mapping[str, Any]],
    failures: Sequence[Mapping[str, Any]],
    best: Mapping[str, Any] | None,
) -> tuple[list[str], float]:
    out = [f'<g class="legend" transform="translate(0 {_px(y)})">']
    out.append(f'<text x="{LABEL_X}" y="0" font-weight="600">Quotes</text>')
    line = 0
    for quote in quotes:
        line += 1
        mark = "★ best " if best is not None and quote == best else ""
        words = f"{mark}{quote['supplier']}: {quote['total_cents']} ¢ ({_priced(quote)})"
        out.append(
            f'<text class="quote" x="{LABEL_X + 10}" y="{line * 14}"'
            f' data-quote-supplier="{_attr(quote["supplier"])}" data-sku="{_attr(quote["sku"])}"'
            f' data-total-cents="{_attr(quote["total_cents"])}"'
            + _money_attrs(quote)
            + f' data-shipping-cents="{_attr(quote["shipping_cents"])}"'
            f' data-stock="{_attr(quote["stock"])}"'
            + (' data-best="true" font-weight="600"' if mark else "")
            + f">{_text(words)}</text>"
        )
    if not quotes:
        line += 1
        out.append(f'<text x="{LABEL_X + 10}" y="{line * 14}">none usable</text>')
    for failure in failures:
        line += 1
        failed = f"✗ {failure['supplier']}: {failure['code']}"
        out.append(
            f'<text class="failure" x="{LABEL_X + 10}" y="{line * 14}"'
            f' data-failure-supplier="{_attr(failure["supplier"])}"'
            f' data-code="{_attr(failure["code"])}" fill="#c53030">'
            f"{_text(failed)}</text>"
        )
    out.append("</g>")
    return out, y + line * 14


def render_cart(answer: Mapping[str, Any]) -> str:
    """The waterfall of a cart: one row per supplier call, grouped by supplier.

    ``answer`` is the cart's JSON answer with its bill under ``explain``.
    """
    explain = answer["explain"]
    suppliers: Mapping[str, Mapping[str, Any]] = explain["suppliers"]
    deadline = explain["deadline_ms"]
    budget = explain["budget_ms"]
    calls = [call for entry in suppliers.values() for call in entry["calls"]]
    scale = _Scale(deadline, _events_end(calls))
    request_id = str(answer["request_id"])
    basket = answer["basket"]
    lines = answer["lines"]
    heading = f"cart of {len(lines)} line{'s' if len(lines) != 1 else ''}"
    subheading = (
        f"answered in {_ms_words(answer['elapsed_ms'])} of a {_ms_words(budget)} budget · "
        f"basket {basket['total_cents']} ¢ (each line's best: {basket['per_line_total_cents']} ¢)"
        + ("" if basket["complete"] else f" · unquoted: {', '.join(basket['unquoted'])}")
    )
    out: list[str] = []
    top = float(HEADER_H)
    y = top + 6
    for name, entry in suppliers.items():
        out.append(f'<g class="supplier" data-supplier-group="{_attr(name)}">')
        for index, call in enumerate(entry["calls"], start=1):
            label = name if len(entry["calls"]) == 1 else f"{name} #{index}"
            extra = f' data-call="{index}" data-lines="{len(call.get("lines", ()))}"'
            y += _row(out, y, scale, name, call, label=label, extra=extra)
        out.append("</g>")
    bottom = y
    axis: list[str] = []
    _axis(axis, top, bottom, scale)
    _deadline(axis, top - 6, bottom, scale, f"calls' deadline {_ms_words(deadline)}")
    legend = [f'<g class="legend" transform="translate(0 {_px(bottom + 28)})">']
    legend.append(f'<text x="{LABEL_X}" y="0" font-weight="600">Basket</text>')
    row = 0
    for pick in basket["picks"]:
        row += 1
        bought = f" (buys {pick['buy_quantity']})" if "buy_quantity" in pick else ""
        sku = pick.get("bought_sku", pick["sku"])
        instead = f" as {sku}" if sku != pick["sku"] else ""
        words = (
            f"{pick['sku']}{instead} × {pick['quantity']}{bought}: {pick['supplier']},"
            f" {pick['line_cents']} ¢"
        )
        legend.append(
            f'<text class="pick" x="{LABEL_X + 10}" y="{row * 14}"'
            f' data-sku="{_attr(pick["sku"])}" data-pick-supplier="{_attr(pick["supplier"])}"'
            + _money_attrs(pick)
            + f">{_text(words)}</text>"
        )
    for item in basket["shipping"]:
        row += 1
        words = f"shipping {item['supplier']}: {item['shipping_cents']} ¢"
        legend.append(f'<text x="{LABEL_X + 10}" y="{row * 14}">{_text(words)}</text>')
    legend.append("</g>")
    y = bottom + 28 + row * 14
    desc = (
        f"Cart of {len(lines)} lines: basket {basket['total_cents']} cents"
        + ("" if basket["complete"] else f", {len(basket['unquoted'])} lines unquoted")
        + ". "
        + " ".join(
            _said(name if len(entry["calls"]) == 1 else f"{name} call {i}", call) + "."
            for name, entry in suppliers.items()
            for i, call in enumerate(entry["calls"], start=1)
        )
        + f" Answered in {_ms_words(answer['elapsed_ms'])} of {_ms_words(budget)}."
    )
    return _document(
        request_id=request_id,
        heading=heading,
        subheading=subheading,
        desc=desc,
        kind="cart",
        body=[*axis, *out, *legend],
        height=y + 8,
        attrs=f' data-budget-ms="{_num(budget)}" data-elapsed-ms="{_num(answer["elapsed_ms"])}"',
    )
