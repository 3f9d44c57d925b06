"""``make bench`` compares QuoteFlow with the bare fan-out on the same event loop by default."""

from __future__ import annotations

import importlib.util

import pytest

from bench.core import event_loops
from bench.report import loops_line
from bench.run import parse_options

DEFAULT_LOOP = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"


@pytest.fixture(autouse=True)
def _no_bench_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BENCH_QUOTEFLOW_ARGS", "BENCH_BARE_ARGS"):
        monkeypatch.delenv(name, raising=False)


def test_the_bare_fan_out_follows_quoteflows_loop_by_default() -> None:
    """With no extra flags both run on QuoteFlow's default loop, and the report says so."""
    loops = event_loops(parse_options([]))
    assert loops == {"quoteflow": DEFAULT_LOOP, "bare": DEFAULT_LOOP}
    assert "(like for like)" in loops_line({"event_loops": loops})


def test_quoteflows_loop_flag_moves_both(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--event-loop asyncio`` for QuoteFlow puts the bare fan-out on asyncio too."""
    monkeypatch.setenv("BENCH_QUOTEFLOW_ARGS", "--log-level warning --event-loop asyncio")
    assert event_loops(parse_options([])) == {"quoteflow": "asyncio", "bare": "asyncio"}


def test_bare_args_can_still_ask_for_mixed_loops(monkeypatch: pytest.MonkeyPatch) -> None:
    """``BENCH_BARE_ARGS`` wins for the bare fan-out, and the report labels the loops mixed."""
    monkeypatch.setenv("BENCH_QUOTEFLOW_ARGS", "--event-loop uvloop")
    monkeypatch.setenv("BENCH_BARE_ARGS", "--event-loop asyncio")
    loops = event_loops(parse_options([]))
    assert loops == {"quoteflow": "uvloop", "bare": "asyncio"}
    assert "MIXED loops" in loops_line({"event_loops": loops})
