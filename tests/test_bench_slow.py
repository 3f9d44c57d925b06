"""The slow-suppliers section's client and figures (issue 28), without QuoteFlow or the lab."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from bench import slow
from bench.run import parse_options


def _ok(done_s: float, latency_s: float, *quoted: str, **failures: str) -> slow.Answer:
    stopped = dict.fromkeys(failures, "deadline")
    return slow.Answer(done_s, latency_s, 200, quoted, failures, stopped)


ALL = ("atlas", "boreal", "cedar")


def test_counts_are_of_the_window_and_lateness_of_every_answer() -> None:
    """A complete answer after the window does not count; its lateness does."""
    answers = [
        _ok(1.0, 0.41, *ALL),
        _ok(2.0, 0.80, "atlas", "cedar", boreal="timeout"),
        _ok(3.0, 0.01, "atlas", "cedar", boreal="circuit_open"),
        slow.Answer(3.1, 0.001, 503),
        slow.Answer(3.2, 0.002, 500),
        slow.Answer(3.3, 5.0, None, error="TimeoutError"),
        _ok(10.5, 0.97, *ALL),
    ]
    got = slow.figures(answers, window_s=10.0, budget_s=0.8)
    assert got["complete"] == 1
    assert got["quoted"] == {"atlas": 3, "boreal": 1, "cedar": 3}
    assert got["statuses"] == {"200": 4, "500": 1, "503": 1}
    assert got["circuit_open"] == {"atlas": 0, "boreal": 1, "cedar": 0}
    assert got["failures"]["boreal"] == {"timeout": 1, "circuit_open": 1}
    assert got["stopped"]["boreal"] == {"deadline": 2}
    assert (got["late"], got["latency_ms"]["max"]) == (1, 970.0)
    assert (got["server_5xx"], got["errors"]) == (1, {"TimeoutError": 1})
    assert got["missing_atlas_or_cedar"] == 0
    assert got["tail_ms"] == 500.0


def _run(case: str, loop: str, complete: int, opened: int = 0) -> dict[str, Any]:
    answers = [_ok(0.5, 0.4, *ALL)] * complete + [
        _ok(0.6, 0.01, "atlas", "cedar", boreal="circuit_open")
    ] * opened
    return {"case": case, "callers": 8, "loop": loop, **slow.figures(answers, 10.0, 0.8)}


def test_targets_need_both_loops_and_scale_with_the_duration() -> None:
    """40 complete answers in 10 s under both loops: met; uvloop's 39 fails the row."""
    section = {
        "duration_s": 10.0,
        "runs": [
            _run("all400", "asyncio", 40),
            _run("all400", "uvloop", 39),
            _run("boreal_hang", "asyncio", 60, opened=2),
            _run("boreal_hang", "uvloop", 60, opened=2),
        ],
    }
    rows = {row["metric"]: row for row in slow.targets(slow.summarize(section))}
    complete = rows["all400×8 10 s: answers with all 3 quotes (asyncio | uvloop)"]
    assert (complete["quoteflow"], complete["bare"], complete["met"]) == ("40", "39", False)
    assert rows["all400×8 10 s: circuit_open failure codes (asyncio | uvloop)"]["met"] is True
    hang = rows["boreal_hang×8 6 s: answers with boreal circuit_open (asyncio | uvloop)"]
    assert hang["met"] is True
    assert rows["boreal_hang×8 6 s: 200s (asyncio | uvloop)"]["target"].startswith("> 50")
    section["duration_s"] = 5.0  # half the length: half the answers are enough
    rows = {row["metric"]: row for row in slow.targets(slow.summarize(section))}
    half = rows["all400×8 5 s: answers with all 3 quotes (asyncio | uvloop)"]
    assert half["met"] is True
    assert "scaled to 5 s" in half["target"]


def test_a_spell_is_judged_from_t_plus_its_margin() -> None:
    """Answers from T + 1 s on are judged (a 503 too); the first complete one was sent after T."""
    answers = [
        _ok(3.9, 0.4, "atlas", "cedar", boreal="timeout"),  # in the spell
        _ok(4.2, 0.5, *ALL),  # sent in the spell: not the first after T
        _ok(4.3, 0.25, "atlas", "cedar", boreal="timeout"),  # before T + 1 s: not judged
        _ok(4.35, 0.3, *ALL),  # sent at 4.05 s: the first complete answer after T
        *[_ok(5.0 + i / 100, 0.01, *ALL) for i in range(49)],
        slow.Answer(5.6, 0.001, 503),
    ]
    got = slow.spell_figures(answers, spell_t=4.0, margin_s=1.0)
    assert (got["answers"], got["complete"], got["first_complete_ms"]) == (50, 49, 350.0)
    run = {"case": "spell400", "callers": 4, "loop": "uvloop", **slow.figures(answers, 10, 0.8)}
    assert slow.judge({**run, "spell": got}, 1.0)[0]["met"] is True  # 49 of 50: 98 %
    worse = slow.spell_figures([*answers, slow.Answer(5.7, 0.001, 503)], 4.0, 1.0)
    assert slow.judge({**run, "spell": worse}, 1.0)[0]["met"] is False  # 49 of 51


def test_the_section_is_chosen_by_its_name_and_by_slow() -> None:
    """``--only slow_suppliers`` is known; ``--quick`` shortens its runs to 2 s."""
    assert parse_options(["--only", "slow_suppliers"]).only == ("slow_suppliers",)
    assert parse_options(["--quick"]).slow_duration_s == 2.0
    assert parse_options([]).slow_duration_s == slow.FULL_S


async def test_closed_loop_callers_rest_only_after_a_503(aiohttp_server: Any) -> None:
    """3 callers for 0.3 s on a real socket: at once again after a 200, 50 ms after a 503."""
    busy = [True]

    async def quotes(request: web.Request) -> web.Response:
        assert await request.json() == {"quantity": 1}
        assert request.query.get("explain") == "1"
        if busy[0]:
            return web.json_response({"error": "capacity_exhausted"}, status=503)
        return web.json_response(
            {
                "quotes": [{"supplier": s} for s in ALL],
                "failures": [],
                "elapsed_ms": 1.0,
                "explain": {"suppliers": {s: {"stopped": "success"} for s in ALL}},
            }
        )

    app = web.Application()
    app.router.add_post("/api/quotes", quotes)
    server = await aiohttp_server(app)
    url = str(server.make_url("")).rstrip("/")
    refused = slow.figures(await slow.drive(url, 3, 0.3), 0.3, 0.8)
    # Each 503 costs its caller 50 ms: at most 0.3 / 0.05 + 1 requests per caller.
    assert 3 <= refused["statuses"]["503"] <= 3 * 7
    assert refused["answers"] == refused["statuses"]["503"]
    busy[0] = False
    answered = slow.figures(await slow.drive(url, 3, 0.3), 0.3, 0.8)
    assert answered["complete"] == answered["ok_in_window"] > 3 * 7
    assert answered["stopped"]["boreal"] == {"success": answered["statuses"]["200"]}
