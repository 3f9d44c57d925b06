"""The ``abuse`` section of ``make bench`` (issue 18): normal callers while connections are hoarded.

Against the benchmark's single QuoteFlow process, with its default connection
limits (1,024 places, 5 s header timeout, 15 s idle timeout), wrk drives
normal callers at saturate (connections = the inbound limit, suppliers
answering at once). An attacker process (``python -m bench.abuse``) opens
3,000 connections that never send a byte and 100 that dribble a request head
one header line a second; a dribbler whose head QuoteFlow refuses (408) opens
again at once. Three contenders, in blocks of C H H C R R C:

- ``clean``: nobody else is connected;
- ``held``: the attacker holds its connections; those QuoteFlow closes to
  make room stay closed (the issue's case: connections held, not a flood);
- ``reopening``: the attacker also opens again, a second later, every idle
  connection QuoteFlow closed: with 3,000 against 1,024 places that is a
  steady flood of about 2,000 new connections a second, each taking the
  place of the longest-idle one.

For each run: wrk's answered requests a second (goodput, 200s only),
QuoteFlow's CPU per answer, its open file descriptors sampled from ``/proc``
every 50 ms, and the cores QuoteFlow and the attacker used. Target: held ÷
clean goodput ≥ 0.9 (against the clean runs around each pair); reopening ÷
clean is reported beside it, with the attacker's own CPU, which on a small
machine competes with QuoteFlow for the same cores. On a shared machine the
goodput ratio carries the neighbours' noise; CPU per answer does much less.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from bench.procs import BenchError, cpu_seconds, http
from bench.report import Target, _fmt
from bench.stats import ratio, spread
from bench.wrk import run_wrk
from quoteflow.config import Settings

if TYPE_CHECKING:
    from bench.core import Bench

CLEAN, HELD, REOPENING = "clean", "held", "reopening"
ABUSED = (HELD, REOPENING)
IDLE, DRIBBLING = 3000, 100
PLACES = Settings().max_connections
"""QuoteFlow's connection cap in the bench: its default."""
FDS_SLACK = 4
"""Descriptors being accepted or closed at one moment (uvloop accepts one at a time)."""
RECONNECT_AFTER_S = 1.0
SAMPLE_EVERY_S = 0.05


class Attacker:
    """``python -m bench.abuse`` against one port, from ``ready`` until ``stop``."""

    def __init__(self, port: int, *, reopening: bool) -> None:
        argv = [sys.executable, "-m", "bench.abuse", "--port", str(port)]
        argv += ["--idle", str(IDLE), "--dribble", str(DRIBBLING)]
        if reopening:
            argv += ["--reconnect-after", str(RECONNECT_AFTER_S)]
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line.startswith("ready "):
            self.process.kill()
            raise BenchError(f"the attacker did not get ready: {line!r}")

    def stop(self) -> dict[str, int]:
        """Close every connection; what the attacker saw QuoteFlow do."""
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.close()
        line = self.process.stdout.readline()
        self.process.wait(30)
        counts: dict[str, int] = json.loads(line.removeprefix("done ")) if line else {}
        return counts


class FdSampler:
    """A process's open file descriptors, sampled on a thread while a run lasts."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> FdSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_EVERY_S):
            self.samples.append(len(os.listdir(f"/proc/{self.pid}/fd")))


def run_order(rounds: int) -> list[str]:
    """Blocks of C H H C R R C: each attacker starts before its pair and stops after it."""
    return [CLEAN, HELD, HELD, CLEAN, REOPENING, REOPENING, CLEAN] * rounds


def run_abuse(bench: Bench) -> dict[str, Any]:
    """Every block, the attacker held around its two abused runs; QuoteFlow must still answer."""
    quoteflow = bench.services["quoteflow"]
    bench.set_latency(0)
    runs: list[dict[str, Any]] = []
    attacker: Attacker | None = None
    seen: list[dict[str, int]] = []
    try:
        for index, contender in enumerate(run_order(bench.options.rounds)):
            if attacker is not None and contender != runs[-1]["contender"]:
                seen.append(attacker.stop())
                attacker = None
            if contender in ABUSED and attacker is None:
                attacker = Attacker(quoteflow.port, reopening=contender == REOPENING)
            bench.settle()
            attacker_cpu0 = cpu_seconds(attacker.process.pid) if attacker else 0.0
            cpu0 = quoteflow.cpu()
            with FdSampler(quoteflow.pid) as fds:
                run = run_wrk(
                    bench.wrk,
                    quoteflow.url,
                    connections=bench.limits.inbound,
                    duration_s=bench.options.duration_s,
                    scenario="normal",
                    out_dir=bench.raw_dir,
                    tag=f"abuse-{index}-{contender}",
                )
            used = quoteflow.cpu() - cpu0
            elapsed = max(run.duration_s, 1e-9)
            attacker_cpu = cpu_seconds(attacker.process.pid) - attacker_cpu0 if attacker else 0.0
            record = {
                "contender": contender,
                "index": index,
                "rate_200": run.rate(200),
                "statuses": {str(k): v for k, v in sorted(run.statuses.items())},
                "fds_max": max(fds.samples, default=None),
                "fds_median": sorted(fds.samples)[len(fds.samples) // 2] if fds.samples else None,
                "quoteflow_cores": used / elapsed,
                "cpu_ms_per_200": (
                    1000 * used / run.statuses[200] if run.statuses.get(200) else None
                ),
                "attacker_cores": attacker_cpu / elapsed,
            }
            print(progress_line(record), flush=True)
            runs.append(record)
    finally:
        if attacker is not None:
            seen.append(attacker.stop())
    bench.settle()
    status, _, body = http("POST", quoteflow.url + "/api/quotes", {"sku": "KB-001", "quantity": 1})
    still = status == 200 and isinstance(body, dict) and len(body.get("quotes", [])) == 3
    return {"runs": runs, "attacker": seen, "still_answers": still}


def progress_line(run: dict[str, Any]) -> str:
    """One line per run, printed as it finishes."""
    return (
        f"  abuse    {run['contender']:<10}{run['rate_200']:9.1f} 200/s  fds max {run['fds_max']}"
        f"  cores: QuoteFlow {run['quoteflow_cores']:.2f}, attacker {run['attacker_cores']:.2f}"
    )


def summarize(section: dict[str, Any]) -> dict[str, Any]:
    """Per contender: goodput, descriptors, CPU; each abused pair ÷ its neighbouring clean runs."""
    runs = section["runs"]
    by: dict[str, list[dict[str, Any]]] = {CLEAN: [], HELD: [], REOPENING: []}
    for run in runs:
        by[run["contender"]].append(run)
    ratios: dict[str, list[float | None]] = {HELD: [], REOPENING: []}
    cpu_ratios: dict[str, list[float | None]] = {HELD: [], REOPENING: []}
    for first in range(len(runs) - 3):  # C A A C: the clean runs around each abused pair
        block = runs[first : first + 4]
        kinds = {r["contender"] for r in block[1:3]}
        if block[0]["contender"] == block[3]["contender"] == CLEAN and len(kinds) == 1:
            kind = kinds.pop()
            clean, abused = (block[0], block[3]), block[1:3]
            ratios[kind].append(ratio(_sum(abused, "rate_200"), _sum(clean, "rate_200")))
            cpu_ratios[kind].append(
                ratio(_sum(abused, "cpu_ms_per_200"), _sum(clean, "cpu_ms_per_200"))
            )

    def each(key: str) -> dict[str, Any]:
        return {c: spread(r[key] for r in by[c]) for c in by}

    return {
        "rate_200": each("rate_200"),
        "fds_max": each("fds_max"),
        "quoteflow_cores": each("quoteflow_cores"),
        "attacker_cores": each("attacker_cores"),
        "cpu_ms_per_200": each("cpu_ms_per_200"),
        "goodput_ratio": {kind: spread(values) for kind, values in ratios.items()},
        "cpu_ratio": {kind: spread(values) for kind, values in cpu_ratios.items()},
        "attacker": section["attacker"],
        "still_answers": section["still_answers"],
    }


def _fds_within(abused: dict[str, float] | None, clean: dict[str, float] | None) -> bool | None:
    """Whether the most descriptors seen under attack are the cap plus the process's own few."""
    if abused is None or clean is None:
        return None
    return abused["max"] <= PLACES + clean["max"] + FDS_SLACK


def _sum(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [run[key] for run in runs]
    return None if None in values else sum(values)


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The abuse rows of the bench's table (columns: abused where QuoteFlow is, clean beside it)."""
    held = summary["goodput_ratio"][HELD]
    reopening = summary["goodput_ratio"][REOPENING]
    met = held is not None and held["median"] >= 0.9 and bool(summary["still_answers"])
    rate, fds, cores = summary["rate_200"], summary["fds_max"], summary["quoteflow_cores"]
    attacker = summary["attacker_cores"]
    rows = (
        Target(
            "abuse",
            f"goodput (200/s), {IDLE:,} idle + {DRIBBLING} dribbling held | none",
            _fmt(rate[HELD]),
            _fmt(rate[CLEAN]),
            _fmt(held, 2),
            "≥ 0.9 × (issue 18)",
            met,
        ),
        Target(
            "abuse",
            "goodput (200/s), the attacker reopening what is closed (~2,000/s) | none",
            _fmt(rate[REOPENING]),
            _fmt(rate[CLEAN]),
            _fmt(reopening, 2),
            "",
            None,
        ),
        Target(
            "abuse",
            "QuoteFlow's CPU per 200 (ms): held | none",
            _fmt(summary["cpu_ms_per_200"][HELD], 3),
            _fmt(summary["cpu_ms_per_200"][CLEAN], 3),
            _fmt(summary["cpu_ratio"][HELD], 2),
            "",
            None,
        ),
        Target(
            "abuse",
            "QuoteFlow's CPU per 200 (ms): reopening | none",
            _fmt(summary["cpu_ms_per_200"][REOPENING], 3),
            _fmt(summary["cpu_ms_per_200"][CLEAN], 3),
            _fmt(summary["cpu_ratio"][REOPENING], 2),
            "",
            None,
        ),
        Target(
            "abuse",
            "QuoteFlow's open fds, most seen: held | none",
            _fmt(fds[HELD], 0),
            _fmt(fds[CLEAN], 0),
            "",
            f"≤ {PLACES:,} + none's + {FDS_SLACK}",
            _fds_within(fds[HELD], fds[CLEAN]),
        ),
        Target(
            "abuse",
            "QuoteFlow's open fds, most seen: reopening",
            _fmt(fds[REOPENING], 0),
            "",
            "",
            f"≤ {PLACES:,} + none's + {FDS_SLACK}",
            _fds_within(fds[REOPENING], fds[CLEAN]),
        ),
        Target(
            "abuse",
            "cores used: QuoteFlow | the attacker, while reopening",
            _fmt(cores[REOPENING], 2),
            _fmt(attacker[REOPENING], 2),
            "",
            "",
            None,
        ),
        Target(
            "abuse",
            "all 3 quotes afterwards",
            "1/1" if summary["still_answers"] else "0/1",
            "",
            "",
            "all",
            bool(summary["still_answers"]),
        ),
    )
    return [attrs.asdict(row) for row in rows]
