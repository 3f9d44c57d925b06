"""The tails section of ``make bench`` (issues 38, 48): suppliers whose latency has a tail, hedged.

Each run starts a FRESH lab (``--seed 1``) and QuoteFlow (defaults, the
case's ``--event-loop``; with ``--hedge`` or without, the control) and drives
it with closed-loop callers (``bench.slow``'s client) for ``DURATION_S``
after a warm-up whose answers are not counted: ``WARM_UP_S`` and one step
of ``WARM_UP_STEP_S`` for every run (the hedge needs ten answers to know its
delay; a control warms up as long as its pair), then, hedging, on until the
hedge bucket (``quoteflow_hedge_tokens``) has settled — moved by less than
half a token over a step — or ``WARM_UP_MAX_S`` have passed. Each case runs
``REPEAT`` times; the figures judged are the medians. The lab's latency
faults: atlas and cedar lognormal with a median of 60 ms (sigma 0.3), boreal
median 200 ms (sigma 0.9: about 6 % of its answers past the 0.8 s budget).

Cases and issue 48's targets:

- ``tails``, 2 callers, hedging on: answers with all three quotes ≥ 98 %,
  p90 at the client ≤ 510 ms, supplier calls per answer ≤ 3.40, hedges
  refused for ``no_token`` ≤ 25 % of those the delay asked for; off, reported.
- ``tails``, 4 callers: hedged, complete and p90 no worse than off (within 1
  point and 20 ms); with ``--outbound-limit 12``, ≥ 96 % complete.
- ``all400``, 8 callers, hedging on: every supplier at a constant 400 ms;
  hedges ≤ 2 % of calls, none late, no ``circuit_open``.
- ``hang``, 8 callers, hedging on and off: boreal hangs; hedging on sends
  boreal no more than off (within 5 %), and its breaker opens.

Standalone (JSON on stdout, a line per run on stderr)::

    python -m bench.tails
    python -m bench.tails --case tails --callers 2 --loop uvloop --duration 10
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from bench.core import SLOW_FULL_S, Bench
from bench.procs import Service, free_port, http, start, stop
from bench.report import Target
from bench.slow import Answer, loops, run_client

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
NAME = "tails"
SUPPLIERS = ("atlas", "boreal", "cedar")
DURATION_S = 20.0
WARM_UP_S = 5.0
WARM_UP_MAX_S = 90.0
WARM_UP_STEP_S = 5.0
BUDGET_S = 0.8
GRACE_S = 0.15
TAILS: Mapping[str, Mapping[str, object]] = {
    "atlas": {"kind": "latency", "ms": 60, "sigma": 0.3},
    "boreal": {"kind": "latency", "ms": 200, "sigma": 0.9},
    "cedar": {"kind": "latency", "ms": 60, "sigma": 0.3},
}
CONSTANT400: Mapping[str, Mapping[str, object]] = {
    s: {"kind": "latency", "ms": 400} for s in SUPPLIERS
}
HANG: Mapping[str, Mapping[str, object]] = {"boreal": {"kind": "hang"}}
RUNS: tuple[tuple[str, int, bool, int | None], ...] = (
    ("tails", 2, False, None),
    ("tails", 2, True, None),
    ("tails", 4, False, None),
    ("tails", 4, True, None),
    ("tails", 4, True, 12),
    ("all400", 8, True, None),
    ("hang", 8, False, None),
    ("hang", 8, True, None),
)
"""(case, callers, hedging, --outbound-limit or the default) in the order the section runs
them, each under every loop, ``REPEAT`` times."""
REPEAT = 3
"""Runs of each case; the figures judged are their medians (issue 48)."""
MEDIAN_KEYS = ("complete_share", "p90_ms", "calls_per_answer", "no_token_share", "hedge_share")


def _faults(case: str) -> Mapping[str, Mapping[str, object]]:
    return {"tails": TAILS, "all400": CONSTANT400, "hang": HANG}[case]


def oracle(answers: int = 200_000, seed: int = 1) -> float:
    """Share of answers with all three quotes if every call started at t = 0, with no limit."""
    rng = random.Random(seed)
    within = 0
    for _ in range(answers):
        draws = [
            float(str(TAILS[s]["ms"])) * math.exp(float(str(TAILS[s]["sigma"])) * rng.gauss(0, 1))
            for s in SUPPLIERS
        ]
        within += max(draws) <= BUDGET_S * 1000
    return within / answers


MODEL_DELAYS_S = (0.30, 0.355, 0.465)
"""Hedge delays the budget model is worked for (``hedge_model``)."""
EARN = 0.1
"""A retry token's share each request earns (``--retry-budget-earn``'s default)."""
ANSWER_BY_S = 0.77
"""When an attempt's answer must be in for its quote to count: the budget less QuoteFlow's
own time (the longest answer QuoteFlow used in these runs took 767–781 ms)."""


def hedge_model(delay_s: float, answers: int = 200_000, seed: int = 1) -> dict[str, float]:
    """What one hedge at a fixed ``delay_s`` for boreal could give, slots and bucket aside.

    Every call starts at t = 0; a boreal call still out at ``delay_s`` is
    joined by a hedge with its own draw. ``losing``: requests whose hedge
    brought no quote (the first attempt answered sooner, or the hedge came
    after the deadline) — each spends a token for good, and after the first
    burst the bucket pays for at most ``EARN`` of them per request.
    """
    rng = random.Random(seed)
    hedged = losing = within = 0
    latencies = []
    for _ in range(answers):
        atlas, boreal, cedar, second = (
            float(str(TAILS[s]["ms"]))
            / 1000
            * math.exp(float(str(TAILS[s]["sigma"])) * rng.gauss(0, 1))
            for s in (*SUPPLIERS, "boreal")
        )
        if boreal > delay_s:
            hedged += 1
            # Its token comes back only if it brings the quote: when it is
            # later than the first, or later than the deadline, it is lost.
            losing += boreal <= delay_s + second or delay_s + second > ANSWER_BY_S
            boreal = min(boreal, delay_s + second)
        slowest = max(atlas, boreal, cedar)
        within += slowest <= ANSWER_BY_S
        latencies.append(min(slowest, BUDGET_S))
    latencies.sort()
    return {
        "delay_ms": round(delay_s * 1000),
        "hedged": round(hedged / answers, 3),
        "losing": round(losing / answers, 3),
        "complete": round(within / answers, 4),
        "p90_ms": round(latencies[math.ceil(0.9 * answers) - 1] * 1000),
    }


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def one_run(
    case: str,
    callers: int,
    hedge: bool,
    loop: str,
    log_dir: Path,
    duration_s: float,
    outbound_limit: int | None = None,
) -> dict[str, Any]:
    """A fresh lab and QuoteFlow, the case's faults, a warm-up, then the measured window."""
    lab_port = free_port()
    services: list[Service] = []
    try:
        lab = start(
            "lab",
            [
                sys.executable,
                "-m",
                "provider_lab",
                "--host",
                HOST,
                "--port",
                str(lab_port),
                "--seed",
                "1",
            ],
            lab_port,
            log_dir,
            cwd=ROOT,
        )
        services.append(lab)
        for supplier, fault in _faults(case).items():
            status, _, body = http("PUT", f"{lab.url}/faults/{supplier}", fault)
            if status not in (200, 201):
                raise RuntimeError(f"lab fault {supplier}: {status} {body}")
        port = free_port()
        argv = [sys.executable, "-m", "quoteflow", "--host", HOST, "--port", str(port)]
        argv += ["--provider-url", lab.url, "--event-loop", loop]
        if hedge:
            argv.append("--hedge")
        if outbound_limit is not None:
            argv += ["--outbound-limit", str(outbound_limit)]
        quoteflow = start(f"quoteflow-{case}-{callers}-{loop}", argv, port, log_dir, cwd=ROOT)
        services.append(quoteflow)
        warm_up_s = _warm_up(quoteflow.url, callers, hedge)
        _, _, before = http("GET", lab.url + "/stats?summary=1", timeout=30)
        metrics_before = _metrics_text(quoteflow.url)
        answers, _ = run_client(quoteflow.url, callers, duration_s, explain=False)
        _, _, after = http("GET", lab.url + "/stats?summary=1", timeout=30)
        metrics_after = _metrics_text(quoteflow.url)
    finally:
        for service in reversed(services):
            stop(service)
    refused = {
        reason: _metric(metrics_after, "quoteflow_hedges_refused_total", reason=reason)
        - _metric(metrics_before, "quoteflow_hedges_refused_total", reason=reason)
        for reason in ("no_token", "no_slot", "no_turn", "no_time")
    }
    hedges = {
        event: _metric(metrics_after, "quoteflow_hedges_total", event=event)
        - _metric(metrics_before, "quoteflow_hedges_total", event=event)
        for event in ("sent", "won", "cancelled")
    }
    asked = hedges["sent"] + sum(refused.values())
    calls = {s: _sent(after, s) - _sent(before, s) for s in SUPPLIERS}
    return {
        "case": case,
        "callers": callers,
        "hedge": hedge,
        "outbound_limit": outbound_limit,
        "loop": loop,
        **_figures(answers, duration_s),
        "warm_up_s": warm_up_s,
        "hedge_tokens_at_start": {
            s: round(_metric(metrics_before, "quoteflow_hedge_tokens", supplier=s), 1)
            for s in SUPPLIERS
        },
        "calls": calls,
        "hedges": hedges,
        "refused": refused,
        # Of the hedges the delay asked for, the share refused for want of a token.
        "no_token_share": round(refused["no_token"] / asked, 3) if asked else 0.0,
        "hedge_share": round(hedges["sent"] / (sum(calls.values()) or 1), 4),
    }


def _warm_up(url: str, callers: int, hedge: bool) -> float:
    """Seconds of unmeasured load: ``WARM_UP_S`` and a step; hedging, on until the hedge
    bucket has settled.

    Every run, hedged or its control, warms up at least as long, so that a
    pair compares like with like. Settled: the lowest hedged supplier's
    bucket (``quoteflow_hedge_tokens``) moved by less than half a token over
    a step — full, or as much earned by successes as spent on hedges — or
    ``WARM_UP_MAX_S`` passed. Its first answers teach the percentile, and
    the hedges sent while it moves are not what a steady load sees.
    """
    run_client(url, callers, WARM_UP_S, explain=False)
    level = _lowest_tokens(url) if hedge else 0.0
    run_client(url, callers, WARM_UP_STEP_S, explain=False)
    warm = WARM_UP_S + WARM_UP_STEP_S
    if not hedge:
        return warm
    before, level = level, _lowest_tokens(url)
    while warm < WARM_UP_MAX_S and abs(level - before) >= 0.5:
        run_client(url, callers, WARM_UP_STEP_S, explain=False)
        warm += WARM_UP_STEP_S
        before, level = level, _lowest_tokens(url)
    return warm


def _lowest_tokens(url: str) -> float:
    """The fewest tokens any hedged supplier's hedge bucket holds now (``/metrics``)."""
    text = _metrics_text(url)
    if "quoteflow_hedge_tokens{" not in text:
        raise RuntimeError(f"no hedge bucket gauge at {url}/metrics")
    return min(_metric(text, "quoteflow_hedge_tokens", supplier=s) for s in SUPPLIERS)


def _metrics_text(url: str) -> str:
    status, _, body = http("GET", url + "/metrics", timeout=10)
    return body if status == 200 and isinstance(body, str) else ""


def _sent(stats: Mapping[str, Any], supplier: str) -> int:
    """Requests that reached ``supplier`` (the lab's ``per_supplier`` count)."""
    return int(stats.get("per_supplier", {}).get(supplier, 0))


def _figures(answers: Sequence[Answer], window_s: float) -> dict[str, Any]:
    inside = [a for a in answers if a.done_s <= window_s and a.status is not None]
    ok = [a for a in inside if a.status == 200]
    complete = sum(1 for a in ok if set(SUPPLIERS) <= set(a.quoted))
    latencies = sorted(a.latency_s * 1000 for a in inside)
    p90 = (
        latencies[min(len(latencies) - 1, math.ceil(0.9 * len(latencies)) - 1)] if latencies else 0
    )
    circuit_open = sum(1 for a in ok if "circuit_open" in a.failures.values())
    return {
        "answers": len(inside),
        "ok": len(ok),
        "complete": complete,
        "complete_share": round(complete / len(ok), 4) if ok else 0.0,
        "p90_ms": round(p90, 1),
        "late": sum(1 for ms in latencies if ms > (BUDGET_S + GRACE_S) * 1000),
        "circuit_open_answers": circuit_open,
        "boreal_circuit_open": sum(1 for a in ok if a.failures.get("boreal") == "circuit_open"),
    }


def calls_per_answer(run: Mapping[str, Any]) -> float:
    ok = int(run["ok"]) or 1
    calls: Mapping[str, int] = run["calls"]
    return round(sum(calls.values()) / ok, 3)


def run_tails(bench: Bench) -> dict[str, Any]:
    """Every run of ``RUNS`` under every loop, and the oracle (shorter under ``--quick``)."""
    scale = bench.options.slow_duration_s / SLOW_FULL_S
    return _all(bench.log_dir, DURATION_S * scale, RUNS, loops())


def _all(
    log_dir: Path,
    duration_s: float,
    chosen: Sequence[tuple[str, int, bool, int | None]],
    event_loops: Sequence[str],
    repeat: int = REPEAT,
) -> dict[str, Any]:
    runs = []
    for case, callers, hedge, limit in chosen:
        for loop in event_loops:
            repeats = []
            for _ in range(repeat):
                record = one_run(case, callers, hedge, loop, log_dir, duration_s, limit)
                record["calls_per_answer"] = calls_per_answer(record)
                print(_line(record), file=sys.stderr, flush=True)
                repeats.append(record)
            runs.append(_median(repeats))
    return {
        "duration_s": duration_s,
        "repeat": repeat,
        "oracle": round(oracle(), 4),
        "hedge_model": [hedge_model(delay) for delay in MODEL_DELAYS_S],
        "runs": runs,
    }


def _median(repeats: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The last run's record with each judged figure the median of the runs' (and the runs)."""
    found = dict(repeats[-1])
    for key in MEDIAN_KEYS:
        found[key] = statistics.median(run[key] for run in repeats)
    found["repeats"] = [{key: run[key] for key in MEDIAN_KEYS} for run in repeats]
    return found


def _line(run: Mapping[str, Any]) -> str:
    return (
        f"tails {_label(run)} "
        f"{run['loop']}: complete {run['complete_share']:.1%}, calls/answer "
        f"{run['calls_per_answer']}, p90 {run['p90_ms']} ms, late {run['late']}, "
        f"warm-up {run['warm_up_s']} s, hedge tokens then {run['hedge_tokens_at_start']}, "
        f"hedges {run['hedges']}, refused {run['refused']}, calls {run['calls']}"
    )


def _label(run: Mapping[str, Any]) -> str:
    limit = run.get("outbound_limit")
    room = "" if limit is None else f" limit {limit}"
    return f"{run['case']}×{run['callers']} {'hedge' if run['hedge'] else 'off'}{room}"


def summarize(section: dict[str, Any]) -> dict[str, Any]:
    """The runs by case, callers and hedging, then loop; the oracle."""
    by: dict[str, dict[str, Any]] = {}
    for run in section["runs"]:
        by.setdefault(_label(run), {})[run["loop"]] = run
    return {"oracle": section["oracle"], "hedge_model": section["hedge_model"], "runs": by}


def judge(
    label: str, run: Mapping[str, Any], runs: Mapping[str, Any]
) -> list[tuple[str, str, bool]]:
    """(what, value, met) for one run, per issue 38."""
    checks: list[tuple[str, str, bool]] = []
    if label == "tails×2 hedge":
        checks += [
            ("complete ≥ 98 %", f"{run['complete_share']:.1%}", run["complete_share"] >= 0.98),
            ("p90 at the client ≤ 510 ms", str(run["p90_ms"]), run["p90_ms"] <= 510),
            (
                "calls per answer ≤ 3.40",
                str(run["calls_per_answer"]),
                run["calls_per_answer"] <= 3.40,
            ),
            (
                "refused for no_token ≤ 25 % of hedges asked",
                f"{run['no_token_share']:.1%}",
                run["no_token_share"] <= 0.25,
            ),
        ]
    if label == "tails×4 hedge":
        off = runs.get("tails×4 off", {}).get(run["loop"])
        if off is not None:
            points = (off["complete_share"] - run["complete_share"]) * 100
            later = run["p90_ms"] - off["p90_ms"]
            checks += [
                ("complete within 1 point of off", f"{-points:+.1f}", points <= 1.0),
                ("p90 within 20 ms of off", f"{later:+.0f} ms", later <= 20),
            ]
    if label == "tails×4 hedge limit 12":
        checks.append(
            ("complete ≥ 96 %", f"{run['complete_share']:.1%}", run["complete_share"] >= 0.96)
        )
    if label.startswith("all400"):
        calls = sum(run["calls"].values()) or 1
        share = run["hedges"]["sent"] / calls
        share = run.get("hedge_share", share)
        checks += [
            ("hedges ≤ 2 % of calls", f"{share:.1%}", share <= 0.02),
            ("none late", str(run["late"]), run["late"] == 0),
            ("no circuit_open", str(run["circuit_open_answers"]), run["circuit_open_answers"] == 0),
        ]
    if label == "hang×8 hedge":
        off = runs.get("hang×8 off", {}).get(run["loop"])
        if off is not None:
            ratio = run["calls"]["boreal"] / max(1, off["calls"]["boreal"])
            checks.append(("boreal calls ÷ off ≤ 1.05", f"{ratio:.3f}", ratio <= 1.05))
        checks.append(
            ("its breaker opens", str(run["boreal_circuit_open"]), run["boreal_circuit_open"] > 0)
        )
    return checks


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target, asyncio | uvloop; the controls' figures and the oracle reported."""
    rows: list[Target] = []
    runs = summary["runs"]
    for label, by_loop in runs.items():
        pair = [by_loop.get("asyncio"), by_loop.get("uvloop")]
        present = [run for run in pair if run is not None]
        if not present:
            continue
        for index, (what, _, _) in enumerate(judge(label, present[0], runs)):
            values = [judge(label, r, runs)[index][1] if r else "–" for r in pair]
            met = all(judge(label, r, runs)[index][2] for r in present)
            rows.append(
                Target(
                    NAME,
                    f"{label}: {what} (asyncio | uvloop)",
                    values[0],
                    values[1],
                    "",
                    "issue 48",
                    met,
                )
            )
        if label.startswith("tails") and label.endswith("off"):
            for key in ("complete_share", "calls_per_answer", "p90_ms"):
                values = [str(r[key]) if r else "–" for r in pair]
                rows.append(
                    Target(
                        NAME,
                        f"{label}: {key} (asyncio | uvloop)",
                        values[0],
                        values[1],
                        "",
                        "reported",
                        None,
                    )
                )
    rows.append(
        Target(
            NAME,
            "oracle: all three within the budget, every call at t=0",
            str(summary["oracle"]),
            "",
            "",
            "reported",
            None,
        )
    )
    for model in summary["hedge_model"]:
        rows.append(
            Target(
                NAME,
                f"model: boreal hedged at {model['delay_ms']} ms, every call at t=0, no limit",
                f"complete {model['complete']:.1%}, p90 {model['p90_ms']} ms",
                f"hedged {model['hedged']}, losing {model['losing']} per request",
                "",
                f"reported (the bucket pays for {EARN} losing per request after its burst)",
                None,
            )
        )
    return [attrs.asdict(row) for row in rows]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.tails", description=__doc__)
    parser.add_argument("--case", choices=("tails", "all400", "hang", "all"), default="all")
    parser.add_argument("--callers", type=int, default=None)
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both")
    parser.add_argument("--duration", type=float, default=DURATION_S)
    parser.add_argument("--repeat", type=int, default=REPEAT, help="runs of each case (3)")
    parser.add_argument("--hedge", choices=("on", "off", "both"), default="both")
    options = parser.parse_args(argv)
    chosen = [
        run
        for run in RUNS
        if options.case in ("all", run[0])
        and options.callers in (None, run[1])
        and options.hedge in ("both", "on" if run[2] else "off")
    ]
    event_loops = loops() if options.loop == "both" else (options.loop,)
    with tempfile.TemporaryDirectory(prefix="bench-tails-") as folder:
        started = time.monotonic()
        section = _all(Path(folder), options.duration, chosen, event_loops, options.repeat)
    summary = summarize(section)
    for row in targets(summary):
        mark = {True: "met", False: "NOT met", None: "reported"}[row["met"]]
        print(f"{row['metric']}: {row['quoteflow']} | {row['bare']} — {mark}", file=sys.stderr)
    section["elapsed_s"] = round(time.monotonic() - started, 1)
    json.dump(section, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
