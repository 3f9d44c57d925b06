"""``python -m bench.run``: QuoteFlow against a bare aiohttp fan-out, under wrk.

Starts three processes on 127.0.0.1 — the provider lab, QuoteFlow and the bare
fan-out (``bench/bare_fanout.py``), both pointed at the lab — then, for each
workload, sets the lab's latency and drives the two contenders in turn with wrk,
interleaved A B B A so a noisy neighbour hurts both alike. Every run records
wrk's counts and per-status latency histograms, the CPU time of the service,
the lab and wrk itself, and what the lab saw. After each workload a normal
request must still get all three quotes from both. Then the hot section
(``bench/hot.py``, issue 21): four QuoteFlow processes — neither, coalescing,
the quote cache, both — under many callers asking for a few popular SKUs. Then
the abuse section (``bench/connections.py``, issue 18): normal callers' goodput
while an attacker hoards 3,000 idle and 100 dribbling connections. Then the
fleet section (``bench/fleet.py``, issue 12): QuoteFlow under gunicorn with 2
workers and Redis against the single process, CPU per answered request and
Redis commands per request. Then the tracing section (``bench/tracing.py``,
issue 22): CPU per answered request with OpenTelemetry off, and on at 1 % and
100 %. Then the callers section (``bench/callers.py``, issue 20): CPU per
answered request with a caller's quota on against off, single and fleet.
Then the supplier-contracts section (``bench/contracts.py``, issue 30): CPU
per answered request with an outbound rate on every supplier against none,
single and fleet, and the lab's 429s with and without one. Last, the
slow-suppliers section (``bench/slow.py``, issue 28): a fresh QuoteFlow with
its defaults per case, suppliers at 400–500 ms or hanging, closed-loop
callers in this process, under both event loops. Then the offers section
(``bench/offers.py``, issue 47): the CPU of pricing 200 lines × 8 offers with
five breaks, a MOQ, a multiple and a foreign currency each, and of the basket
on such offers.

Output: a table with each target of issue 5 marked met or not met,
``bench/results/latest.json`` and PNG plots beside it.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs

from bench import (
    apis,
    callers,
    carts,
    catalogue,
    connections,
    contracts,
    core,
    fleet,
    hot,
    kinds,
    offers,
    report,
    slow,
    tails,
    tracing,
)
from bench.core import Bench, Options, event_loops, machine
from bench.procs import BenchError
from bench.workloads import Limits, all_workloads
from bench.wrk import find_wrk

SECTIONS = (
    "hot",
    "fleet",
    "abuse",
    "catalogue",
    "tracing",
    "callers",
    slow.NAME,
    apis.NAME,
    contracts.NAME,
    carts.NAME,
    tails.NAME,
    offers.NAME,
)
"""The sections ``main`` runs, by the name ``--only`` takes (besides the workloads')."""


def parse_options(argv: Sequence[str]) -> Options:
    """Flags win over ``BENCH_DURATION``, ``BENCH_ROUNDS``, ``BENCH_ONLY``."""
    return core.parse_options(argv, SECTIONS, description=__doc__)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; exit 0 when it ran, even with targets not met; 1 when wedged."""
    options = parse_options(sys.argv[1:] if argv is None else argv)
    limits = Limits()
    began = time.monotonic()
    try:
        wrk = find_wrk()
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    workloads = [
        w
        for w in all_workloads(limits, options.rounds)
        if not options.only or w.name in options.only
    ]
    bench = Bench(options, limits, wrk)
    results: dict[str, Any] = {
        "machine": machine(),
        "limits": attrs.asdict(limits),
        "options": {
            "duration_s": options.duration_s,
            "rounds": options.rounds,
            "quoteflow_args": list(options.quoteflow_args),
            "bare_args": list(options.bare_args),
            "slow_duration_s": options.slow_duration_s,
            "event_loops": event_loops(options),
        },
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "workloads": {},
    }
    try:
        print(report.banner(results, workloads), flush=True)
        bench.start_all()
        bench.warm_up()
        for workload in workloads:
            results["workloads"][workload.name] = bench.run_workload(workload)
        if not options.only or "hot" in options.only:
            results["hot"] = hot.run_hot(bench)
        if not options.only or "abuse" in options.only:
            results["abuse"] = connections.run_abuse(bench)
        if not options.only or "fleet" in options.only:
            results["fleet"] = fleet.run_fleet(bench)
        if not options.only or "catalogue" in options.only:
            results["catalogue"] = catalogue.run_catalogue(bench)
        if not options.only or "tracing" in options.only:
            results["tracing"] = tracing.run_tracing(bench)
        if not options.only or "callers" in options.only:
            results["callers"] = callers.run_callers(bench)
        if not options.only or apis.NAME in options.only:
            results[apis.NAME] = apis.run_apis(bench)
        if not options.only or contracts.NAME in options.only:
            results[contracts.NAME] = contracts.run_contracts(bench)
        # `--only slow` (the scenario-slow workload) runs the slow-suppliers section too.
        if not options.only or {"slow", slow.NAME} & set(options.only):
            results[slow.NAME] = slow.run_slow(bench)
            results[kinds.NAME] = kinds.run_kinds(kinds.ROUNDS, bench.log_dir)
        if not options.only or carts.NAME in options.only:
            results[carts.NAME] = carts.run_carts(bench)
        if not options.only or tails.NAME in options.only:
            results[tails.NAME] = tails.run_tails(bench)
        if not options.only or offers.NAME in options.only:
            print("offers: pricing and the basket on offers of five breaks each", flush=True)
            results[offers.NAME] = offers.figures()
        results["explain"] = bench.explain_bills()
        if options.profile:
            results["profile"] = bench.profile()
    except (BenchError, OSError) as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        return 130
    finally:
        bench.stop_all()
    results["summary"] = report.summarize(results, limits)
    if "hot" in results:
        results["summary"]["hot"] = hot.summarize(results["hot"], limits.budget_ms)
        results["summary"]["targets"] += hot.targets(results["summary"]["hot"], limits.outbound)
    if "fleet" in results:
        results["summary"]["fleet"] = fleet.summarize(
            results["fleet"], results["summary"].get("overload", {}).get("quoteflow")
        )
        results["summary"]["targets"] += fleet.targets(results["summary"]["fleet"])
    if "abuse" in results:
        results["summary"]["abuse"] = connections.summarize(results["abuse"])
        results["summary"]["targets"] += connections.targets(results["summary"]["abuse"])
    if "catalogue" in results:
        results["summary"]["catalogue"] = catalogue.summarize(results["catalogue"])
    if "tracing" in results:
        results["summary"]["tracing"] = tracing.summarize(results["tracing"])
        results["summary"]["targets"] += tracing.targets(results["summary"]["tracing"])
    if "callers" in results:
        results["summary"]["callers"] = callers.summarize(results["callers"])
        results["summary"]["targets"] += callers.targets(results["summary"]["callers"])
    if apis.NAME in results:
        results["summary"][apis.NAME] = apis.summarize(results[apis.NAME])
        results["summary"]["targets"] += apis.targets(results["summary"][apis.NAME])
    if contracts.NAME in results:
        results["summary"][contracts.NAME] = contracts.summarize(results[contracts.NAME])
        results["summary"]["targets"] += contracts.targets(results["summary"][contracts.NAME])
    if slow.NAME in results:
        results["summary"][slow.NAME] = slow.summarize(results[slow.NAME])
        results["summary"]["targets"] += slow.targets(results["summary"][slow.NAME])
    if kinds.NAME in results:
        results["summary"]["targets"] += kinds.targets(results[kinds.NAME])
    if carts.NAME in results:
        results["summary"][carts.NAME] = carts.summarize(results[carts.NAME])
        results["summary"]["targets"] += carts.targets(results["summary"][carts.NAME])
    if tails.NAME in results:
        results["summary"][tails.NAME] = tails.summarize(results[tails.NAME])
        results["summary"]["targets"] += tails.targets(results["summary"][tails.NAME])
    if offers.NAME in results:
        results["summary"]["targets"] += offers.targets(results[offers.NAME])
    results["elapsed_s"] = round(time.monotonic() - began, 1)
    options.out_dir.mkdir(parents=True, exist_ok=True)
    out = options.out_dir / "latest.json"
    out.write_text(json.dumps(results, indent=1))
    print(report.table(results, limits))
    if "catalogue" in results:
        print(catalogue.table(results["summary"]["catalogue"]))
    if apis.NAME in results:
        print(apis.table(results["summary"][apis.NAME]))
    if contracts.NAME in results:
        print(contracts.table(results["summary"][contracts.NAME]))
    if options.plots:
        print(report.plot_all(results, options.out_dir))
    print(f"\nresults: {out}  ({results['elapsed_s']} s)")
    wedged = [
        f"{name}: {contender}"
        for name, workload in results["workloads"].items()
        for contender, check in workload["still_answers"].items()
        if contender == "quoteflow" and not check["ok"]
    ]
    if wedged:
        # Targets not met are findings; a service that stops answering is a failed run.
        print(f"bench: QuoteFlow stopped answering after {', '.join(wedged)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
