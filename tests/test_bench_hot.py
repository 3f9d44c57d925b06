"""The ``hot`` section's figures: goodput gains per block, and each target judged from them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from aiohttp import web

from bench import coalesce_model, hot


def _run(contender: str, goodput: float, per_answer: float, slowest: float) -> dict[str, Any]:
    return {
        "contender": contender,
        "goodput": goodput,
        "rate_200": goodput,
        "supplier_requests_per_answer": per_answer,
        "supplier_requests_per_answer_summed": 3 * per_answer,
        "cpu_ms_per_answer": 1.0,
        "max_200_ms": slowest,
        "max_elapsed_ms": slowest - 1,
        "lab_max_active": 6,
    }


def test_targets_are_judged_from_each_blocks_ratio() -> None:
    """Coalescing at 4 × and 0.2 per answer meets both targets; a late answer fails its row."""
    order = hot.run_order(2)
    assert order == [*hot.CONTENDERS, *reversed(hot.CONTENDERS)]
    figures = {
        hot.NEITHER: (10.0, 3.0, 500.0),
        hot.COALESCE: (40.0, 0.2, 500.0),
        hot.CACHE: (30.0, 0.5, 900.0),
        hot.BOTH: (80.0, 0.1, 500.0),
    }
    section = {
        "runs": [_run(name, *figures[name]) for name in order],
        "still_answers": {
            name: {
                "ok": True,
                "after_s": 2.5 if name == hot.NEITHER else 0.01,
                "first": {
                    "status": 200,
                    "quotes": 0 if name == hot.NEITHER else 3,
                    "failures": {"atlas": "circuit_open"} if name == hot.NEITHER else {},
                },
                "bound_s": 11.0,
                "polls": 12,
            }
            for name in hot.CONTENDERS
        },
    }
    summary = hot.summarize(section, budget_ms=800)
    assert summary["gain"][hot.COALESCE] == {"median": 4.0, "min": 4.0, "max": 4.0, "n": 2}
    rows = {row["metric"]: row for row in hot.targets(summary, outbound=6)}
    met = {metric: row["met"] for metric, row in rows.items()}
    assert met["goodput (answers/s): --coalesce | neither"] is True
    assert met["supplier requests per answer, per supplier: --coalesce | neither"] is True
    summed = rows["supplier requests per answer, summed over the 3: --coalesce | neither"]
    assert (summed["quoteflow"], summed["met"]) == ("0.600", None)
    again = rows["HOT-01's 3 quotes again afterwards (s after its last run) | straight after"]
    assert again["met"] is True
    assert again["quoteflow"].startswith("neither 2.5, coalesce 0.01")
    assert again["bare"].startswith("neither circuit_open, coalesce full")
    late = "slowest 200 (ms), as wrk saw it | QuoteFlow's elapsed_ms: cache"
    assert met[late] is False
    assert met["lab max_active, every run"] is True


def test_a_contender_that_never_answers_fully_again_fails_the_check() -> None:
    """One contender past its bound without 3 quotes: the row afterwards is not met."""
    section = {
        "runs": [_run(name, 10.0, 1.0, 500.0) for name in hot.run_order(1)],
        "still_answers": {
            name: {
                "ok": name != hot.CACHE,
                "after_s": None if name == hot.CACHE else 0.0,
                "first": {"status": 200, "quotes": 3, "failures": {}},
                "bound_s": 11.0,
                "polls": 1,
            }
            for name in hot.CONTENDERS
        },
    }
    rows = hot.targets(hot.summarize(section, budget_ms=800), outbound=6)
    (again,) = [row for row in rows if row["metric"].startswith("HOT-01")]
    assert (again["met"], again["ratio"]) == (False, "3/4")
    assert "cache never" in again["quoteflow"]


def test_the_idealised_coalescer_stays_near_a_quarter_per_supplier() -> None:
    """The offline hot workload: ideal FIFO coalescing near 0.27 per supplier, 0.8 summed."""
    fifo = coalesce_model.simulate("fifo", seeds=[1], seconds=5.0)[0]
    assert 0.2 < fifo.per_supplier < 0.32
    assert fifo.summed == fifo.per_supplier * 3
    assert fifo.summed > 0.6  # a summed 0.3 is out of any in-flight coalescer's reach
    assert fifo.timeouts < 0.05
    without = coalesce_model.simulate("no-coalesce", seeds=[1], seconds=5.0)[0]
    assert without.timeouts > 0.75  # 64 × 3 calls queue for 120 a second: the budget runs out


def _answers(*bodies: dict[str, Any]) -> web.Application:
    """A stand-in QuoteFlow on a real socket: ``bodies`` in turn, the last one for ever."""
    queue = list(bodies)

    async def quotes(request: web.Request) -> web.Response:
        return web.json_response(queue.pop(0) if len(queue) > 1 else queue[0])

    app = web.Application()
    app.router.add_post("/api/quotes", quotes)
    return app


OPEN = {
    "quotes": [{"supplier": "atlas"}],
    "failures": [{"supplier": "boreal", "code": "circuit_open"}],
}
FULL = {"quotes": [{"supplier": s} for s in ("atlas", "boreal", "cedar")], "failures": []}


async def test_the_check_afterwards_waits_for_an_open_circuit(aiohttp_server: Any) -> None:
    """Two circuit_open answers, then a full one: met, the first answer recorded, 3 requests."""
    server = await aiohttp_server(_answers(OPEN, OPEN, FULL))
    started = time.monotonic()
    check = await asyncio.to_thread(
        hot.wait_for_quotes, str(server.make_url("")).rstrip("/"), started, 5.0
    )
    assert check["ok"] is True
    assert check["polls"] == 3
    assert check["first"] == {"status": 200, "quotes": 1, "failures": {"boreal": "circuit_open"}}
    assert 2 * hot.POLL_S <= check["after_s"] < 5.0


async def test_the_check_afterwards_gives_up_at_its_bound(aiohttp_server: Any) -> None:
    """A contender that never answers fully again fails once its bound has passed."""
    server = await aiohttp_server(_answers(OPEN))
    check = await asyncio.to_thread(
        hot.wait_for_quotes, str(server.make_url("")).rstrip("/"), time.monotonic(), 0.5
    )
    assert (check["ok"], check["after_s"]) == (False, None)
    assert check["polls"] >= 3
