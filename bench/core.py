"""What the benchmark's sections share: the ``Bench`` run, its ``Options`` and helpers.

A section (``bench/hot.py``, ``bench/slow.py``, ...) exports ``run_<name>(bench: Bench)``
and imports ``Bench`` from here; ``bench/run.py`` imports every section and runs them.
This module imports no section, so nothing imports ``bench.run`` but ``python -m``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import platform
import shlex
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from bench import report
from bench.procs import (
    BenchError,
    Service,
    free_port,
    http,
    machine_jiffies,
    start,
    stop,
)
from bench.stats import merge, percentile
from bench.workloads import BOTH as CONTENDERS
from bench.workloads import Limits, Workload, all_workloads
from bench.wrk import WrkRun, run_wrk

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
SCENARIOS = ("normal", "slow", "broken", "malformed", "flaky")
SETTLE_TIMEOUT_S = 5.0
SLOW_FULL_S = 10.0
"""The run length issue 28's targets are set for (``bench.slow.FULL_S``)."""


@attrs.frozen
class Options:
    """How long and how often to run; from flags, then ``BENCH_*`` environment variables."""

    duration_s: float
    rounds: int
    only: tuple[str, ...]
    out_dir: Path
    plots: bool
    profile: bool
    warmup_s: float
    quoteflow_args: tuple[str, ...]
    """Extra flags for QuoteFlow (``BENCH_QUOTEFLOW_ARGS``), e.g. ``--log-level warning``."""
    bare_args: tuple[str, ...]
    """Extra flags for the bare fan-out (``BENCH_BARE_ARGS``), e.g. ``--event-loop asyncio``."""
    slow_duration_s: float = SLOW_FULL_S
    """Seconds per run of the slow-suppliers section (``BENCH_SLOW_DURATION``); targets scale."""


def parse_options(
    argv: Sequence[str], sections: Sequence[str], description: str | None = None
) -> Options:
    """Flags win over ``BENCH_DURATION``, ``BENCH_ROUNDS``, ``BENCH_ONLY``.

    ``--only`` takes the workloads' names and ``sections``, the names of the sections
    ``bench/run.py`` runs; ``description`` is ``--help``'s (``bench/run.py``'s docstring).
    """
    env = os.environ
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=description)
    parser.add_argument(
        "--duration",
        type=float,
        default=float(env.get("BENCH_DURATION", "4")),
        help="seconds per wrk run (BENCH_DURATION, default 4)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=int(env.get("BENCH_ROUNDS", "2")),
        help="A B B A blocks for light and saturate (BENCH_ROUNDS, default 2); others run one",
    )
    parser.add_argument(
        "--only",
        default=env.get("BENCH_ONLY", ""),
        help="comma-separated workloads to run (BENCH_ONLY, default all)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke test: 1 s runs, one block per workload"
    )
    parser.add_argument(
        "--slow-duration",
        type=float,
        default=float(env.get("BENCH_SLOW_DURATION", str(SLOW_FULL_S))),
        help="seconds per run of the slow_suppliers section (BENCH_SLOW_DURATION, default 10;"
        " its targets, set for 10 s, scale with it)",
    )
    parser.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="afterwards, profile QuoteFlow under saturate and overload with py-spy (root)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    args = parser.parse_args(argv)
    duration, rounds = (1.0, 1) if args.quick else (args.duration, args.rounds)
    if duration < 1 or rounds < 1:
        parser.error("--duration must be at least 1 and --rounds at least 1")
    slow_duration = 2.0 if args.quick else args.slow_duration
    if slow_duration < 1:
        parser.error("--slow-duration must be at least 1")
    only = tuple(name for name in args.only.split(",") if name)
    known = [w.name for w in all_workloads(Limits(), 1)] + list(sections)
    if unknown := [name for name in only if name not in known]:
        parser.error(f"unknown workload {', '.join(unknown)}; choose from {', '.join(known)}")
    return Options(
        duration_s=duration,
        rounds=rounds,
        only=only,
        out_dir=args.out,
        plots=not args.no_plots,
        profile=args.profile,
        warmup_s=1.0,
        quoteflow_args=tuple(shlex.split(env.get("BENCH_QUOTEFLOW_ARGS", ""))),
        bare_args=tuple(shlex.split(env.get("BENCH_BARE_ARGS", ""))),
        slow_duration_s=slow_duration,
    )


def event_loops(options: Options) -> dict[str, str]:
    """The event loop each contender runs on: the bare fan-out follows QuoteFlow's.

    Like for like by default (uvloop for both when installed), so QuoteFlow ÷
    bare measures QuoteFlow's own cost, not the loops'. An ``--event-loop`` in
    ``BENCH_BARE_ARGS`` still wins, e.g. ``asyncio`` for the mixed-loop figure.
    """

    def chosen(args: Sequence[str]) -> str | None:
        parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
        parser.add_argument("--event-loop")
        value: str | None = parser.parse_known_args(list(args))[0].event_loop
        return value

    def resolved(choice: str) -> str:
        if choice != "auto":
            return choice
        return "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"

    quoteflow = resolved(chosen(options.quoteflow_args) or "auto")
    return {"quoteflow": quoteflow, "bare": resolved(chosen(options.bare_args) or quoteflow)}


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    model = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    wrk_version = subprocess.run(
        [shutil.which("wrk") or "wrk", "--version"], capture_output=True, text=True, check=False
    ).stdout.splitlines()
    return {
        "nproc": os.cpu_count(),
        "cpu_model": model,
        "python": platform.python_version(),
        "kernel": platform.release(),
        "wrk": wrk_version[0].split(" [")[0] if wrk_version else "unknown",
    }


class Bench:
    """One benchmark run: the three processes and everything measured against them."""

    def __init__(self, options: Options, limits: Limits, wrk: str) -> None:
        self.options = options
        self.limits = limits
        self.wrk = wrk
        self.raw_dir = options.out_dir / "raw"
        self.log_dir = options.out_dir / "logs"
        for folder in (self.raw_dir, self.log_dir):
            folder.mkdir(parents=True, exist_ok=True)
        self.services: dict[str, Service] = {}
        self.lab_latency_ms: int | None = None

    # -- processes -------------------------------------------------------------

    def start_all(self) -> None:
        """Start the lab, then QuoteFlow and the bare fan-out pointed at it."""
        py = sys.executable
        lab_port = free_port()
        self.services["lab"] = start(
            "lab",
            [py, "-m", "provider_lab", "--port", str(lab_port)],
            lab_port,
            self.log_dir,
            cwd=ROOT,
        )
        lab_url = self.services["lab"].url
        qf_port = free_port()
        self.services["quoteflow"] = start(
            "quoteflow",
            [
                *(py, "-m", "quoteflow", "--host", "127.0.0.1", "--port", str(qf_port)),
                *("--provider-url", lab_url, "--budget", str(self.limits.budget_s)),
                *("--inbound-limit", str(self.limits.inbound)),
                *("--outbound-limit", str(self.limits.outbound)),
                *self.options.quoteflow_args,
            ],
            qf_port,
            self.log_dir,
            cwd=ROOT,
        )
        bare_port = free_port()
        self.services["bare"] = start(
            "bare",
            [
                py,
                "-m",
                "bench.bare_fanout",
                "--port",
                str(bare_port),
                "--provider-url",
                lab_url,
                *("--event-loop", event_loops(self.options)["bare"]),
                *self.options.bare_args,
            ],
            bare_port,
            self.log_dir,
            cwd=ROOT,
        )

    def stop_all(self) -> None:
        """Stop every process this run started, the lab last."""
        for name in ("quoteflow", "bare", "lab"):
            if name in self.services:
                stop(self.services[name])

    @property
    def lab(self) -> Service:
        """The provider lab."""
        return self.services["lab"]

    # -- the lab ---------------------------------------------------------------

    def set_latency(self, ms: int) -> None:
        """Set the latency the lab adds to every supplier answer."""
        if self.lab_latency_ms == ms:
            return
        status, _, body = http("PUT", self.lab.url + "/latency", {"ms": ms})
        if status != 200:
            raise BenchError(f"lab refused latency {ms} ms: {status} {body}")
        self.lab_latency_ms = ms

    def settle(self) -> None:
        """Wait until the lab has nothing in flight twice in a row, 100 ms apart.

        Requests abandoned by wrk at the end of a run still finish (within the
        budget for QuoteFlow; the bare fan-out waits for the supplier), and a
        retry may be in its backoff while the lab is idle: hence twice.
        """
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        idle_in_a_row = 0
        while idle_in_a_row < 2 and time.monotonic() < deadline:
            status, _, body = http("GET", self.lab.url + "/stats")
            idle_in_a_row = idle_in_a_row + 1 if status == 200 and body["active"] == 0 else 0
            time.sleep(0.1)

    def reset_lab(self) -> None:
        """Zero the lab's statistics (it refuses while requests are in flight)."""
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while True:
            status, _, body = http("POST", self.lab.url + "/reset")
            if status == 200:
                return
            if time.monotonic() > deadline:
                raise BenchError(f"lab refused to reset: {status} {body}")
            time.sleep(0.1)

    # -- runs ------------------------------------------------------------------

    def warm_up(self) -> None:
        """A short unrecorded run against each contender (connections, caches)."""
        self.set_latency(0)
        for name in CONTENDERS:
            run_wrk(
                self.wrk,
                self.services[name].url,
                connections=self.limits.inbound,
                duration_s=self.options.warmup_s,
                scenario="normal",
                out_dir=self.raw_dir,
                tag=f"warmup-{name}",
            )
        self.settle()

    def one_run(self, workload: Workload, contender: str, index: int) -> dict[str, Any]:
        """Drive ``contender`` once with wrk and measure everything around it."""
        service = self.services[contender]
        self.settle()
        self.reset_lab()
        service_cpu, lab_cpu = service.cpu(), self.lab.cpu()
        busy0, total0 = machine_jiffies()
        clearing = self._clear_faults_later(workload.fault_cleared_after_s)
        try:
            run = run_wrk(
                self.wrk,
                service.url,
                connections=workload.connections,
                duration_s=max(self.options.duration_s, workload.min_duration_s),
                scenario=workload.scenario,
                out_dir=self.raw_dir,
                tag=f"{workload.name}-{index}-{contender}",
                sku=workload.sku,
                inspect=workload.inspect,
                timeline=workload.timeline,
            )
        finally:
            if clearing is not None:
                clearing[0].cancel()
        service_cpu = service.cpu() - service_cpu
        lab_cpu = self.lab.cpu() - lab_cpu
        busy1, total1 = machine_jiffies()
        self.settle()
        _, _, lab_stats = http("GET", self.lab.url + "/stats", timeout=30)
        record = _run_record(
            workload,
            contender,
            index,
            run,
            service_cpu=service_cpu,
            lab_cpu=lab_cpu,
            machine_busy=(busy1 - busy0) / max(1, total1 - total0),
            lab_stats=lab_stats,
        )
        if clearing is not None and clearing[1] and run.timeline:
            # wrk's timeline slots are CLOCK_MONOTONIC tenths of a second, as
            # time.monotonic() is on Linux: the clearing lands on the same axis.
            cleared_slot = int(clearing[1][0] * 10)
            record["fault_cleared_t_s"] = round((cleared_slot - min(run.timeline)) / 10, 1)
        return record

    def _clear_faults_later(
        self, after_s: float | None
    ) -> tuple[threading.Timer, list[float]] | None:
        """Clear the lab's faults ``after_s`` into the run; the timer and when it fired."""
        if after_s is None:
            return None
        fired: list[float] = []

        def clear() -> None:
            http("DELETE", self.lab.url + "/faults")
            fired.append(time.monotonic())

        timer = threading.Timer(after_s, clear)
        timer.start()
        return timer, fired

    def still_answers(self, contender: str) -> dict[str, Any]:
        """A normal request for quantity 1 must get all three quotes (not wedged).

        A 503 right after an overload is not a wedge: retry for a few budgets.
        Nor is a circuit still open after a fault: it closes at the latest one
        open time (at most the cap) and one probe later.
        """
        self.settle()
        url = self.services[contender].url + "/api/quotes"
        limits = self.limits
        deadline = time.monotonic() + limits.breaker_open_max_s + 5 * limits.budget_s
        while True:
            status, _, body = http("POST", url, {"sku": "KB-001", "quantity": 1})
            quotes = body.get("quotes", []) if isinstance(body, dict) else []
            failures = body.get("failures", []) if isinstance(body, dict) else []
            ok = status == 200 and len(quotes) == 3 and not failures
            if ok or time.monotonic() > deadline:
                return {"ok": ok, "status": status, "quotes": len(quotes), "failures": failures}
            time.sleep(0.2)

    def run_workload(self, workload: Workload) -> dict[str, Any]:
        """Every run of one workload in its order, then the still-answers check."""
        self.set_latency(workload.latency_ms)
        runs: list[dict[str, Any]] = []
        if workload.fault is not None:
            self.settle()
            status, _, body = http("PUT", self.lab.url + "/faults/boreal", workload.fault)
            if status != 200:
                raise BenchError(f"lab refused fault {workload.fault}: {status} {body}")
        try:
            for index, contender in enumerate(workload.order()):
                record = self.one_run(workload, contender, index)
                print(report.progress_line(workload, record), flush=True)
                runs.append(record)
        finally:
            if workload.fault is not None:
                http("DELETE", self.lab.url + "/faults")
        checks = {name: self.still_answers(name) for name in CONTENDERS}
        return {"workload": attrs.asdict(workload), "runs": runs, "still_answers": checks}

    def explain_bills(self) -> dict[str, Any]:
        """One ``?explain=1`` request per scenario, if QuoteFlow has the budget bill."""
        self.set_latency(0)
        self.settle()
        bills: dict[str, Any] = {}
        url = self.services["quoteflow"].url + "/api/quotes?explain=1"
        for scenario in SCENARIOS:
            status, _, body = http("POST", url, {"quantity": 2, "scenario": scenario})
            if status == 200 and isinstance(body, dict) and "explain" in body:
                bills[scenario] = body["explain"]
        return bills

    def profile(self) -> dict[str, Any]:
        """Profile both contenders with py-spy under saturate and overload (extra runs).

        The bare fan-out's profile is the reference: what QuoteFlow spends
        beyond it, function by function, is QuoteFlow's own cost.
        """
        from bench import profile

        found: dict[str, Any] = {}
        for workload in all_workloads(self.limits, 1):
            if workload.name not in ("saturate", "overload"):
                continue
            self.set_latency(workload.latency_ms)
            for contender in CONTENDERS:
                self.settle()
                service = self.services[contender]
                found[f"{workload.name}-{contender}"] = profile.record(
                    service.pid,
                    functools.partial(
                        run_wrk,
                        self.wrk,
                        service.url,
                        connections=workload.connections,
                        duration_s=max(self.options.duration_s, 8),
                        scenario=workload.scenario,
                        out_dir=self.raw_dir,
                        tag=f"profile-{workload.name}-{contender}",
                    ),
                    self.options.out_dir / f"profile-{workload.name}-{contender}",
                )
            gap = profile.diff(found[f"{workload.name}-quoteflow"], found[f"{workload.name}-bare"])
            (self.options.out_dir / f"profile-{workload.name}-diff.txt").write_text(gap)
            print(f"\nprofile {workload.name}, QuoteFlow vs bare:\n{gap}", flush=True)
        return found


def _run_record(
    workload: Workload,
    contender: str,
    index: int,
    run: WrkRun,
    *,
    service_cpu: float,
    lab_cpu: float,
    machine_busy: float,
    lab_stats: dict[str, Any],
) -> dict[str, Any]:
    """The JSON record of one run: raw counts plus the derived figures."""
    ok = run.histograms.get(200, {})
    every = merge(run.histograms.values())
    lab_total = sum(lab_stats.get("per_supplier", {}).values())
    per_id = lab_stats.get("attempts_per_supplier", {})
    boreal_per_id = Counter(counts.get("boreal", 0) for counts in per_id.values())
    n200 = run.statuses.get(200, 0)
    quoted = run.inspected.get("boreal_quoted")
    return {
        "contender": contender,
        "index": index,
        "duration_s": run.duration_s,
        "requests": run.requests,
        "statuses": {str(k): v for k, v in sorted(run.statuses.items())},
        "errors": run.errors,
        "rps": run.rps,
        "rate_200": run.rate(200),
        "share_503": run.statuses.get(503, 0) / run.requests if run.requests else None,
        "latency_ms": {
            "p50": percentile(ok, 50),
            "p90": percentile(ok, 90),
            "p99": percentile(ok, 99),
            "max": percentile(ok, 100),
            "all_p50": percentile(every, 50),
            "all_p99": percentile(every, 99),
            "all_max": run.wrk_latency_us.get("wrk_max_us", 0) / 1000,
        },
        "overhead_ms": {
            "p50": _minus(percentile(ok, 50), workload.latency_ms),
            "p99": _minus(percentile(ok, 99), workload.latency_ms),
        },
        "cpu": {
            "service_s": service_cpu,
            "lab_s": lab_cpu,
            "wrk_s": run.cpu_s,
            "service_ms_per_response": 1000 * service_cpu / run.requests if run.requests else None,
            "service_cores": service_cpu / run.duration_s,
            "lab_cores": lab_cpu / run.duration_s,
            "wrk_cores": run.cpu_s / run.duration_s,
            "machine_busy": machine_busy,
        },
        "lab": {
            "requests": lab_total,
            "per_supplier": lab_stats.get("per_supplier", {}),
            "per_response": lab_total / run.requests if run.requests else None,
            "max_active": lab_stats.get("max_active"),
            "ids": len(per_id),
            "boreal_per_id": {str(k): v for k, v in sorted(boreal_per_id.items())},
        },
        "inspected": run.inspected,
        "boreal_recovered": quoted / n200 if quoted is not None and n200 else None,
        "timeline": _timeline(run.timeline),
        "wrk_latency_us": run.wrk_latency_us,
        "histograms": {
            str(s): {str(b): c for b, c in h.items()} for s, h in run.histograms.items()
        },
    }


def _timeline(slots: dict[int, dict[str, int]]) -> list[dict[str, float]]:
    """Per 100 ms from the first answer: 200s, boreal quotes, and the share recovered."""
    if not slots:
        return []
    first = min(slots)
    return [
        {
            "t_s": round((slot - first) / 10, 1),
            "n": counts.get("n", 0),
            "quoted": counts.get("q", 0),
        }
        for slot, counts in sorted(slots.items())
    ]


def _minus(value: float | None, latency_ms: float) -> float | None:
    return None if value is None else value - latency_ms
