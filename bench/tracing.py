"""The tracing section of ``make bench`` (issue 22): what OpenTelemetry costs per answered request.

Beside the benchmark's own processes it starts a tiny OTLP/HTTP sink
(``bench/otlp_sink.py``: it accepts every export, so the exporter's cost is
real) and three QuoteFlow processes with the bench's limits:

- ``off``: no ``OTEL_*`` variable at all — tracing off, as by default;
- ``0%``: tracing on, ``parentbased_traceidratio`` with ratio 0: what every
  request pays (the sampling decision, ``traceparent`` on every attempt),
  without the sampled ones' spans — so ``1%`` is read as ``0%`` plus its
  1 % of sampled requests;
- ``1%``: tracing on, ``parentbased_traceidratio`` with ratio 0.01;
- ``100%``: tracing on, every request traced and exported.

With ``BENCH_TRACING_BASELINE=DIR`` (a source tree, e.g. ``git archive main``
unpacked), a fourth, ``baseline``, runs that tree's QuoteFlow with tracing
off: ``off ÷ baseline`` is what the tracing code costs when it is off.

All are driven in turn at saturate (connections = the inbound limit,
suppliers answering at once) in blocks of A B C C B A (and the mirror), so
a noisy neighbour hurts each alike; every ratio is taken within one block.
Each round starts fresh processes: two processes of the same build differ
by up to a few per cent for their whole lives, which more runs of the same
process would never average out.
CPU per answered request (200) is the QuoteFlow process's own CPU, the
exporter's thread included.

Targets: ``1% ÷ off`` ≤ 1.05; ``off ÷ baseline`` ≤ 1.02 (when a baseline
runs); ``0% ÷ off`` and ``100% ÷ off`` are reported.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from bench.procs import BenchError, Service, free_port, http, start, stop
from bench.report import Target, _fmt
from bench.stats import ratio, spread
from bench.workloads import Workload
from bench.wrk import run_wrk

if TYPE_CHECKING:
    from bench.core import Bench

OFF, NONE, ONE, ALL, BASELINE = "off", "0%", "1%", "100%", "baseline"
TARGET_ONE = 1.05
"""Issue 22: 1 % sampling at most 1.05 × off."""
TARGET_OFF = 1.02
"""Issue 22: off at most 1.02 × the build before tracing (the baseline)."""

BASELINE_ENV = "BENCH_TRACING_BASELINE"

SAMPLING = {
    NONE: {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"},
    ONE: {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
    ALL: {"OTEL_TRACES_SAMPLER": "parentbased_always_on"},
}


def contenders(baseline: Path | None) -> tuple[str, ...]:
    """The processes of the section, in block order."""
    return (OFF, NONE, ONE, ALL, BASELINE) if baseline else (OFF, NONE, ONE, ALL)


def baseline_tree() -> Path | None:
    """``BENCH_TRACING_BASELINE``, checked to hold a QuoteFlow source tree."""
    value = os.environ.get(BASELINE_ENV)
    if not value:
        return None
    tree = Path(value).resolve()
    if not (tree / "quoteflow" / "__main__.py").is_file():
        raise BenchError(f"{BASELINE_ENV}: {value} holds no quoteflow/__main__.py")
    return tree


def start_quoteflow(
    bench: Bench, name: str, env: dict[str, str], tree: Path | None = None
) -> Service:
    """One QuoteFlow process with the bench's limits; ``tree``: run that source tree's code.

    ``python -m`` puts the working directory first on ``sys.path``, so
    running from ``tree`` imports its ``quoteflow``, with this venv's packages.
    """
    limits = bench.limits
    port = free_port()
    return start(
        name,
        [
            *(sys.executable, "-m", "quoteflow", "--host", "127.0.0.1", "--port", str(port)),
            *("--provider-url", bench.lab.url, "--budget", str(limits.budget_s)),
            *("--inbound-limit", str(limits.inbound)),
            *("--outbound-limit", str(limits.outbound)),
            *bench.options.quoteflow_args,
        ],
        port,
        bench.log_dir,
        cwd=tree or Path(__file__).resolve().parent.parent,
        env=env,
    )


def one_run(bench: Bench, service: Service, contender: str, index: int) -> dict[str, Any]:
    """Drive one contender once at saturate; its CPU around the run."""
    bench.settle()
    bench.reset_lab()
    cpu0 = service.cpu()
    run = run_wrk(
        bench.wrk,
        service.url,
        connections=bench.limits.inbound,
        duration_s=bench.options.duration_s,
        scenario="normal",
        out_dir=bench.raw_dir,
        tag=f"tracing-{index}-{contender}",
    )
    cpu = service.cpu() - cpu0
    n200 = run.statuses.get(200, 0)
    return {
        "contender": contender,
        "index": index,
        "duration_s": run.duration_s,
        "requests": run.requests,
        "statuses": {str(k): v for k, v in sorted(run.statuses.items())},
        "rate_200": run.rate(200),
        "cpu_s": cpu,
        "cpu_ms_per_200": 1000 * cpu / n200 if n200 else None,
    }


def run_order(names: tuple[str, ...], rounds: int) -> list[str]:
    """Blocks of A B C C B A, every other block mirrored (as the fleet section)."""
    order: list[str] = []
    for block in range(rounds):
        ahead = list(names if block % 2 == 0 else reversed(names))
        order += ahead + ahead[::-1]
    return order


def start_round(bench: Bench, traced: dict[str, str], tree: Path | None) -> dict[str, Service]:
    """A fresh process per contender, each warmed up (connections, caches, the exporter's)."""
    services: dict[str, Service] = {}
    try:
        services[OFF] = start_quoteflow(bench, "quoteflow-tracing-off", {})
        for name, sampling in SAMPLING.items():
            label = "quoteflow-tracing-" + name.removesuffix("%")
            services[name] = start_quoteflow(bench, label, {**traced, **sampling})
        if tree is not None:
            services[BASELINE] = start_quoteflow(bench, "quoteflow-baseline", {}, tree)
        for name, service in services.items():
            run_wrk(
                bench.wrk,
                service.url,
                connections=bench.limits.inbound,
                duration_s=bench.options.warmup_s,
                scenario="normal",
                out_dir=bench.raw_dir,
                tag=f"warmup-tracing-{name.removesuffix('%')}",
            )
    except BaseException:
        for service in services.values():
            stop(service)
        raise
    return services


def run_tracing(bench: Bench) -> dict[str, Any]:
    """Start the sink; each round, fresh contenders for its block; stop them all."""
    tree = baseline_tree()
    names = contenders(tree)
    workload = Workload(
        "tracing",
        "saturate: tracing off, on at 0 %, 1 % and 100 % sampling (OTLP/HTTP to a local sink)"
        + (", and the baseline tree, off" if tree else ""),
        connections=bench.limits.inbound,
        latency_ms=0,
        rounds=bench.options.rounds,
        contenders=names,
    )
    bench.set_latency(0)
    sink_port = free_port()
    services: dict[str, Service] = {}
    sink = start(
        "otlp-sink",
        [sys.executable, "-m", "bench.otlp_sink", "--port", str(sink_port)],
        sink_port,
        bench.log_dir,
        cwd=Path(__file__).resolve().parent.parent,
    )
    traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink.url, "OTEL_SERVICE_NAME": "quoteflow-bench"}
    runs: list[dict[str, Any]] = []
    try:
        order = run_order(names, workload.rounds)
        per_round = len(order) // workload.rounds
        for first in range(0, len(order), per_round):
            # Fresh processes every round: one process of the same code can be
            # a few per cent faster or slower than the next for its whole life
            # (where its heap and code landed), and a ratio of two processes
            # would keep that bias however many runs it took.
            services = start_round(bench, traced, tree)
            for contender in order[first : first + per_round]:
                record = one_run(bench, services[contender], contender, len(runs))
                print(progress_line(record), flush=True)
                runs.append(record)
            for service in services.values():
                stop(service)
            services = {}
        sink_stats = http("GET", sink.url + "/stats")[2]
    finally:
        for service in services.values():
            stop(service)
        stop(sink)
    return {
        "workload": attrs.asdict(workload),
        "baseline": str(tree) if tree else None,
        "runs": runs,
        "sink": sink_stats,
    }


def progress_line(run: dict[str, Any]) -> str:
    """One line per run, printed as it finishes."""
    per = run["cpu_ms_per_200"]
    return (
        f"  tracing  {run['contender']:<10}{run['rate_200']:9.1f} 200/s  "
        f"cpu {'–' if per is None else f'{per:.3f}'} ms per 200"
    )


def summarize(section: dict[str, Any]) -> dict[str, Any]:
    """Medians per contender, and each ratio taken within a block of neighbouring runs."""
    runs = section["runs"]
    names = tuple(section["workload"]["contenders"])
    by: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
    for run in runs:
        by[run["contender"]].append(run)
    pairs = [(ONE, OFF), (NONE, OFF), (ALL, OFF)] + ([(OFF, BASELINE)] if BASELINE in names else [])
    ratios: dict[str, list[float | None]] = {f"{top}/{bottom}": [] for top, bottom in pairs}
    width = len(names)
    for first in range(0, len(runs) - width + 1, width):
        block = {run["contender"]: run["cpu_ms_per_200"] for run in runs[first : first + width]}
        if set(block) == set(names):
            for top, bottom in pairs:
                ratios[f"{top}/{bottom}"].append(ratio(block[top], block[bottom]))
    return {
        "cpu_ms_per_200": {name: spread(r["cpu_ms_per_200"] for r in by[name]) for name in by},
        "rate_200": {name: spread(r["rate_200"] for r in by[name]) for name in by},
        "ratios": {name: spread(values) for name, values in ratios.items()},
        "sink": section.get("sink"),
    }


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The tracing rows of the bench's table (QuoteFlow's column: the contender measured)."""
    per = summary["cpu_ms_per_200"]
    ratios = summary["ratios"]

    def row(top: str, bottom: str, target: float | None, note: str) -> Target:
        found = ratios.get(f"{top}/{bottom}")
        return Target(
            "tracing",
            f"CPU per 200 (ms): {top} | {bottom}",
            _fmt(per[top], 3),
            _fmt(per[bottom], 3),
            _fmt(found, 3),
            note,
            None if target is None or found is None else found["median"] <= target,
        )

    rows = [
        row(ONE, OFF, TARGET_ONE, f"≤ {TARGET_ONE} × off (issue 22)"),
        row(NONE, OFF, None, "reported: what a request not sampled costs"),
        row(ALL, OFF, None, "reported (issue 22)"),
    ]
    if BASELINE in per:
        rows.insert(0, row(OFF, BASELINE, TARGET_OFF, f"≤ {TARGET_OFF} × baseline (issue 22)"))
    sink = summary.get("sink") or {}
    rows.append(
        Target(
            "tracing",
            "OTLP exports received by the sink (batches, MB)",
            f"{sink.get('exports', 0)}",
            f"{sink.get('bytes', 0) / 1e6:.1f}",
            "",
            "",
            None,
        )
    )
    return [attrs.asdict(r) for r in rows]
