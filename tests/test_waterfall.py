"""The bill drawn as an SVG waterfall: a pure function, read back as XML as a tool would."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from quoteflow.waterfall import render_cart, render_quote

SVG = "{http://www.w3.org/2000/svg}"


def attempt(n: int, start: float, outcome: str = "ok", **extra: Any) -> dict[str, Any]:
    """One attempt of a bill, as ``codec.encode_explain`` writes it."""
    values: dict[str, Any] = {
        "attempt": n,
        "start_ms": start,
        "slot_wait_ms": 0.012,
        "duration_ms": 2.5,
        "outcome": outcome,
        "status": 200 if outcome == "ok" else None,
        "backoff_ms": None,
        "remaining_ms": 790.0,
    }
    values.update(extra)
    return values


QUOTE = {
    "supplier": "boreal",
    "sku": "KB-001",
    "unit_cents": 1100,
    "shipping_cents": 250,
    "stock": 50,
    "total_cents": 2450,
}


def answer(suppliers: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """A quote's JSON answer with its bill, as the handler builds it for ``?explain=svg``."""
    body: dict[str, Any] = {
        "sku": "KB-001",
        "quantity": 2,
        "quotes": [QUOTE],
        "failures": [],
        "best": QUOTE,
        "elapsed_ms": 31.25,
        "request_id": "7a5c8555bbb2df3df3af401973ddd1a7",
        "explain": {"budget_ms": 800.0, "suppliers": suppliers},
    }
    body.update(overrides)
    return body


FLAKY = {
    "atlas": {"attempts": [attempt(1, 0.549)], "stopped": "success"},
    "boreal": {
        "attempts": [
            attempt(1, 0.61, "http_503", status=503, backoff_ms=24.764),
            attempt(2, 28.496, slot_wait_ms=0.018, duration_ms=1.755),
        ],
        "stopped": "success",
    },
    "cedar": {"attempts": [attempt(1, 0.7)], "stopped": "success"},
}


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    return root


def rows(root: ET.Element) -> list[ET.Element]:
    return [g for g in root.iter(f"{SVG}g") if "data-supplier" in g.attrib]


def attempts_of(row: ET.Element) -> list[ET.Element]:
    return [g for g in row.iter(f"{SVG}g") if "data-attempt" in g.attrib]


def test_flaky_boreal_is_two_attempts_with_a_backoff_between() -> None:
    """Each supplier a row in bill order; boreal's 503 then ok, the backoff, values verbatim."""
    root = parse(render_quote(answer(FLAKY)))
    found = rows(root)
    assert [(r.get("data-supplier"), r.get("data-stopped")) for r in found] == [
        ("atlas", "success"),
        ("boreal", "success"),
        ("cedar", "success"),
    ]
    boreal = found[1]
    tried = attempts_of(boreal)
    assert [(a.get("data-attempt"), a.get("data-outcome")) for a in tried] == [
        ("1", "http_503"),
        ("2", "ok"),
    ]
    second = tried[1]
    assert float(second.get("data-start-ms", "")) == 28.496
    assert float(second.get("data-slot-wait-ms", "")) == 0.018
    assert float(second.get("data-duration-ms", "")) == 1.755
    assert tried[0].get("data-status") == "503"
    backoffs = [g for g in boreal.iter(f"{SVG}g") if "data-backoff-ms" in g.attrib]
    assert [float(g.get("data-backoff-ms", "")) for g in backoffs] == [24.764]
    deadline = [g for g in root.iter(f"{SVG}g") if "data-deadline-ms" in g.attrib]
    assert [float(g.get("data-deadline-ms", "")) for g in deadline] == [800.0]


def test_title_names_the_request_and_desc_says_what_happened() -> None:
    """The SVG's ``title`` and ``desc`` (what a screen reader says) tell the story in words."""
    root = parse(render_quote(answer(FLAKY)))
    title = root.find(f"{SVG}title")
    desc = root.find(f"{SVG}desc")
    assert title is not None
    assert "7a5c8555bbb2df3df3af401973ddd1a7" in (title.text or "")
    assert desc is not None
    assert "boreal: 2 attempts (http_503, ok), stopped success" in (desc.text or "")
    assert "best boreal 2450" in (desc.text or "")
    assert root.get("role") == "img"
    assert root.get("data-request-id") == "7a5c8555bbb2df3df3af401973ddd1a7"


def test_every_bar_has_a_text_label() -> None:
    """Outcomes are never told by colour alone: each attempt carries its outcome as text."""
    root = parse(render_quote(answer(FLAKY)))
    for row in rows(root):
        for tried in attempts_of(row):
            words = " ".join(t.text or "" for t in tried.iter(f"{SVG}text"))
            assert tried.get("data-outcome", "?") in words
        stopped = " ".join(t.text or "" for t in row.iter(f"{SVG}text"))
        assert f"stopped: {row.get('data-stopped')}" in stopped


@pytest.mark.parametrize(
    "sku",
    ["<script>alert(1)</script>", 'a"b&c<d>', "]]>&lt;", "tab\there", "bell\x07", "€ ✓ 𝄞"],
)
def test_a_hostile_sku_is_text(sku: str) -> None:
    """A SKU with markup, quotes or control characters is drawn as text: the SVG stays well-formed
    and has no element the SKU could have made."""
    quote = {**QUOTE, "sku": sku}
    svg = render_quote(answer(FLAKY, sku=sku, quotes=[quote], best=quote))
    root = parse(svg)
    tags = {element.tag.removeprefix(SVG) for element in root.iter()}
    assert tags <= {"svg", "title", "desc", "rect", "text", "g", "line", "path"}
    heading = [t.text for t in root.iter(f"{SVG}text")]
    if sku.isprintable() and "\t" not in sku:
        assert f"{sku} × 2" in heading
    assert "<script" not in svg


def test_hostile_names_and_ids_stay_inside_their_attributes() -> None:
    """A supplier, caller or joined id with quotes cannot add an attribute of its own."""
    hostile = 'x" onload="alert(1)'
    bills = {hostile: {"attempts": [], "stopped": "joined", "joined": hostile}}
    body = answer(bills, quotes=[], best=None, failures=[{"supplier": hostile, "code": "timeout"}])
    body["explain"]["caller"] = hostile
    root = parse(render_quote(body))
    assert [r.get("data-supplier") for r in rows(root)] == [hostile]
    for element in root.iter():
        assert "onload" not in element.attrib


def test_marks_for_probe_joined_cached_waits_and_give_up() -> None:
    """Each of the bill's extras appears as a mark with its value, on the supplier's row."""
    bills = {
        "atlas": {"attempts": [], "stopped": "joined", "joined": "abc123", "probe": True},
        "boreal": {"attempts": [], "stopped": "cached"},
        "cedar": {
            "attempts": [],
            "stopped": "no_slot_in_time",
            "gave_up_after_ms": 412.5,
            "rate_wait_ms": 3.25,
            "token_wait_ms": 7.5,
        },
    }
    root = parse(render_quote(answer(bills)))

    def marks(row: ET.Element) -> dict[str, str]:
        return {
            g.get("data-mark", ""): g.get("data-mark-value", "")
            for g in row.iter(f"{SVG}g")
            if "data-mark" in g.attrib
        }

    atlas, boreal, cedar = rows(root)
    assert marks(atlas) == {"joined": "abc123", "probe": "true"}
    assert atlas.get("data-stopped") == "joined"
    assert marks(boreal) == {"cached": "true"}
    assert marks(cedar) == {"gave_up": "412.5", "rate_wait": "3.25", "token_wait": "7.5"}
    assert attempts_of(atlas) == attempts_of(boreal) == []


def test_cut_short_and_a_hedge_that_won() -> None:
    """A cut-short attempt and a hedge say so; the hedge, out beside the first, gets a lane."""
    bills = {
        "boreal": {
            "attempts": [
                attempt(1, 0.5, "cancelled", duration_ms=300.0),
                attempt(2, 150.0, hedge=True, duration_ms=20.0),
            ],
            "stopped": "success",
            "won": 2,
        },
        "cedar": {
            "attempts": [attempt(1, 0.5, "timeout", duration_ms=794.0, cut_short=True)],
            "stopped": "deadline",
        },
    }
    root = parse(render_quote(answer(bills)))
    boreal, cedar = rows(root)
    first, hedge = attempts_of(boreal)
    assert hedge.get("data-hedge") == "true"
    first_y = {r.get("y") for r in first.iter(f"{SVG}rect") if r.get("class") == "wire"}
    hedge_y = {r.get("y") for r in hedge.iter(f"{SVG}rect") if r.get("class") == "wire"}
    assert first_y != hedge_y
    assert {g.get("data-mark") for g in boreal.iter(f"{SVG}g")} >= {"won"}
    (cut,) = attempts_of(cedar)
    assert cut.get("data-cut-short") == "true"
    assert "cut short" in " ".join(t.text or "" for t in cut.iter(f"{SVG}text"))


def test_a_timeout_ends_at_the_deadline_on_the_same_scale() -> None:
    """A hang's attempt reaches the deadline line: both are drawn on one time axis."""
    bills = {
        "atlas": {"attempts": [attempt(1, 0.4)], "stopped": "success"},
        "boreal": {
            "attempts": [attempt(1, 0.5, "timeout", duration_ms=794.5, cut_short=True)],
            "stopped": "deadline",
        },
    }
    root = parse(render_quote(answer(bills, elapsed_ms=795.5)))
    (line,) = [
        el
        for g in root.iter(f"{SVG}g")
        if "data-deadline-ms" in g.attrib
        for el in g.iter(f"{SVG}line")
    ]
    boreal = rows(root)[1]
    (wire,) = [r for r in boreal.iter(f"{SVG}rect") if r.get("class") == "wire"]
    end = float(wire.get("x", "0")) + float(wire.get("width", "0"))
    assert abs(end - float(line.get("x1", "0"))) < 8


def test_failures_and_quotes_in_the_legend() -> None:
    """The quotes, ``best`` first and marked, and each failure's code are listed."""
    atlas = {**QUOTE, "supplier": "atlas", "total_cents": 2700}
    failures = [{"supplier": "cedar", "code": "http_503"}]
    body = answer(FLAKY, quotes=[QUOTE, atlas], failures=failures)
    root = parse(render_quote(body))
    quotes = [t for t in root.iter(f"{SVG}text") if "data-quote-supplier" in t.attrib]
    assert [(t.get("data-quote-supplier"), t.get("data-best")) for t in quotes] == [
        ("boreal", "true"),
        ("atlas", None),
    ]
    listed = [t for t in root.iter(f"{SVG}text") if "data-failure-supplier" in t.attrib]
    assert [(t.get("data-failure-supplier"), t.get("data-code")) for t in listed] == [
        ("cedar", "http_503")
    ]


def test_a_cart_is_one_row_per_call_grouped_by_supplier() -> None:
    """A batch supplier's two calls are two rows under its group, each with its lines."""
    cart = {
        "lines": [{"sku": "B-1"}, {"sku": "B-2"}, {"sku": "<b>"}],
        "basket": {
            "picks": [
                {"sku": "<b>", "quantity": 1, "supplier": "bulk", "unit_cents": 1, "line_cents": 1}
            ],
            "shipping": [{"supplier": "bulk", "shipping_cents": 100}],
            "total_cents": 101,
            "per_line_total_cents": 300,
            "complete": False,
            "unquoted": ["B-1"],
            "optimal": True,
        },
        "elapsed_ms": 40.0,
        "request_id": "cart-1",
        "explain": {
            "budget_ms": 2000.0,
            "deadline_ms": 1950.0,
            "solve_ms": 0.2,
            "suppliers": {
                "bulk": {
                    "calls": [
                        {"attempts": [attempt(1, 1.0)], "stopped": "success", "lines": ["B-1"]},
                        {
                            "attempts": [attempt(1, 1.5, "http_503", status=503)],
                            "stopped": "not_retryable",
                            "lines": ["B-2", "<b>"],
                        },
                    ]
                },
                "atlas": {"calls": [{"attempts": [], "stopped": "circuit_open", "lines": []}]},
            },
            "lines": {},
        },
    }
    root = parse(render_cart(cart))
    assert root.get("data-kind") == "cart"
    found = rows(root)
    assert [(r.get("data-supplier"), r.get("data-call"), r.get("data-lines")) for r in found] == [
        ("bulk", "1", "1"),
        ("bulk", "2", "2"),
        ("atlas", "1", "0"),
    ]
    groups = [g.get("data-supplier-group") for g in root.iter(f"{SVG}g")]
    assert [name for name in groups if name] == ["bulk", "atlas"]
    deadline = [g.get("data-deadline-ms") for g in root.iter(f"{SVG}g")]
    assert [d for d in deadline if d] == ["1950.0"]
    assert any(t.text == "<b> × 1: bulk, 1 ¢" for t in root.iter(f"{SVG}text"))
