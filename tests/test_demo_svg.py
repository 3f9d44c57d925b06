"""``make demo SVG=DIR``: a case asked drawn, checked from the drawing, and written out."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import aiohttp
from pytest_aiohttp import AiohttpServer

from provider_lab.app import create_app as create_lab
from provider_lab.control_client import LabControl
from provider_lab.demo import (
    CASES,
    _hedge_words,
    _won,
    answer_from_svg,
    attempts_from_svg,
    run_case,
    svg_name,
)
from provider_lab.state import LabConfig
from quoteflow.app import create_app
from quoteflow.config import Settings
from quoteflow.waterfall import render_quote
from tests.conftest import TEST_CONNECT_TIMEOUT
from tests.test_waterfall import FLAKY, QUOTE, answer, attempt


def test_the_drawing_holds_what_the_demo_checks() -> None:
    """Read back from the SVG: request id, time, quotes with prices, best, failures, stopped."""
    atlas = {**QUOTE, "supplier": "atlas", "unit_cents": 1200, "total_cents": 2700}
    failures = [{"supplier": "cedar", "code": "http_503"}]
    body = answer(FLAKY, quotes=[QUOTE, atlas], failures=failures)
    read = answer_from_svg(render_quote(body))
    assert read["request_id"] == body["request_id"]
    assert read["elapsed_ms"] == body["elapsed_ms"]
    assert read["quotes"] == [QUOTE, atlas]
    assert read["best"] == QUOTE
    assert read["failures"] == failures
    assert read["explain"]["suppliers"] == {
        name: {"stopped": bill["stopped"]} for name, bill in FLAKY.items()
    }


async def test_a_case_is_drawn_and_checked_from_its_drawing(
    aiohttp_server: AiohttpServer, tmp_path: Path
) -> None:
    """``scenario flaky`` against a real lab and QuoteFlow: as expected, and its file shows
    boreal's two attempts."""
    lab = await aiohttp_server(create_lab(LabConfig(slow_ms=200, seed=1)))
    lab_url = str(lab.make_url("")).rstrip("/")
    settings = Settings(provider_url=lab_url, connect_timeout=TEST_CONNECT_TIMEOUT)
    service = await aiohttp_server(create_app(settings))
    (case,) = [case for case in CASES if case.name == "scenario flaky"]
    async with aiohttp.ClientSession() as session:
        outcome = await run_case(
            session,
            LabControl(session, lab_url),
            str(service.make_url("")).rstrip("/"),
            case,
            svg=tmp_path,
        )
    assert outcome.problems == []
    assert outcome.best == "boreal"
    drawn = ET.parse(tmp_path / svg_name(case)).getroot()
    (boreal,) = [g for g in drawn.iter() if g.get("data-supplier") == "boreal"]
    tried = [g.get("data-outcome") for g in boreal.iter() if "data-attempt" in g.attrib]
    assert tried == ["http_503", "ok"]
    assert svg_name(case) == "scenario-flaky.svg"


def test_a_hedged_call_is_read_back_from_its_drawing() -> None:
    """The hedge case's checks, from the drawing: both attempts, the hedge, the winner, the
    loser cancelled."""
    boreal = {
        "attempts": [
            attempt(1, 0.5, "cancelled", duration_ms=300.0),
            attempt(2, 150.0, hedge=True, duration_ms=20.0),
        ],
        "stopped": "success",
        "won": 2,
    }
    drawing = render_quote(answer({"boreal": boreal}))
    read = attempts_from_svg(drawing, "boreal")
    assert read["won"] == 2
    assert [(a["attempt"], a["outcome"], a.get("hedge", False)) for a in read["attempts"]] == [
        (1, "cancelled", False),
        (2, "ok", True),
    ]
    result = answer_from_svg(drawing)
    result["explain"]["suppliers"]["boreal"].update(read)
    assert _won(result)
    notes, problems = _hedge_words(result)
    assert problems == []
    assert "attempt 2, the hedge, went at 150.0 ms" in notes[0]
    assert "attempt 2 won" in notes[1]
    assert attempts_from_svg(drawing, "atlas") == {"attempts": [], "won": None}
