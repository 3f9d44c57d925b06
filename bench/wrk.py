"""Drive a server with wrk (closed loop) and read back what ``post.lua`` recorded."""

from __future__ import annotations

import os
import subprocess
import time
from collections import defaultdict
from pathlib import Path

import attrs

from bench.procs import BenchError, find_or_install

LUA_SCRIPT = Path(__file__).with_name("post.lua")

Histogram = dict[int, int]
"""Latency bucket (µs, 4 significant digits) → number of responses."""


@attrs.frozen
class WrkRun:
    """What one wrk run measured."""

    duration_s: float
    requests: int
    statuses: dict[int, int]
    histograms: dict[int, Histogram]
    """Per HTTP status."""
    errors: dict[str, int]
    inspected: dict[str, float]
    """Body checks of 200s: ``boreal_quoted``, ``boreal_failed``, ``elapsed_ms_max``; with
    ``codes``, ``code <supplier> <code>`` for each supplier's failure codes."""
    timeline: dict[int, dict[str, int]]
    """100 ms slot (of the monotonic clock) → ``n`` 200s and ``q`` boreal quotes in it."""
    wrk_latency_us: dict[str, int]
    """wrk's own percentiles over every response (a cross-check of the histograms)."""
    cpu_s: float
    """CPU seconds wrk itself used (user + system)."""
    output: str

    @property
    def rps(self) -> float:
        """Responses per second, any status."""
        return self.requests / self.duration_s if self.duration_s else 0.0

    def rate(self, status: int) -> float:
        """Responses per second with ``status``."""
        return self.statuses.get(status, 0) / self.duration_s if self.duration_s else 0.0


def find_wrk() -> str:
    """The wrk executable; installed if we are root on a Debian-like system."""
    return find_or_install("wrk", "wrk")


def run_wrk(
    wrk: str,
    url: str,
    *,
    connections: int,
    duration_s: float,
    scenario: str,
    out_dir: Path,
    tag: str,
    quantity: int = 2,
    sku: str = "KB-001",
    inspect: bool = False,
    timeline: bool = False,
    zipf_skus: int = 0,
    authorization: str = "",
    codes: bool = False,
) -> WrkRun:
    """Run wrk against ``url`` + ``/api/quotes`` with one thread per connection.

    ``zipf_skus`` > 0: each request asks for one of the lab's ``HOT-01`` … ``HOT-N``,
    drawn from a Zipf distribution (``post.lua``), instead of ``sku``. ``codes``: count
    each supplier's failure codes in the 200s, ``inspected["code <supplier> <code>"]``.
    """
    out_path = out_dir / f"{tag}.tsv"
    out_path.unlink(missing_ok=True)
    env = dict(os.environ)
    env.update(
        BENCH_SCENARIO=scenario,
        BENCH_QUANTITY=str(quantity),
        BENCH_SKU=sku,
        BENCH_INSPECT="1" if inspect or timeline else "0",
        BENCH_TIMELINE="1" if timeline else "0",
        BENCH_ZIPF_SKUS=str(zipf_skus),
        BENCH_WRK_OUT=str(out_path),
        BENCH_AUTHORIZATION=authorization,
        BENCH_CODES="1" if codes else "0",
    )
    argv = [
        wrk,
        f"-t{connections}",
        f"-c{connections}",
        f"-d{max(1, round(duration_s))}s",
        "--timeout",
        "10s",  # wrk drops answers slower than this from its statistics
        "-s",
        str(LUA_SCRIPT),
        url,
    ]
    stdout_path = out_dir / f"{tag}.out"
    with open(stdout_path, "wb") as stdout:
        process = subprocess.Popen(argv, stdout=stdout, stderr=subprocess.STDOUT, env=env)
    status, cpu_s = _wait(process, duration_s + 30)
    output = stdout_path.read_text(errors="replace")
    if status != 0 or not out_path.exists():
        raise BenchError(f"wrk failed (exit {status}):\n{output}")
    return _parse(out_path.read_text(), cpu_s, output)


def _wait(process: subprocess.Popen[bytes], timeout: float) -> tuple[int, float]:
    """Reap wrk with ``wait4`` to get its CPU time; kill it after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(process.pid, os.WNOHANG)
        if pid:
            process.returncode = os.waitstatus_to_exitcode(status)
            return process.returncode, usage.ru_utime + usage.ru_stime
        if time.monotonic() > deadline:
            process.kill()
        time.sleep(0.05)


def _parse(text: str, cpu_s: float, output: str) -> WrkRun:
    summary: dict[str, int] = {}
    statuses: dict[int, int] = defaultdict(int)
    histograms: dict[int, Histogram] = defaultdict(lambda: defaultdict(int))
    inspected: dict[str, float] = {}
    slots: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for line in text.splitlines():
        key, _, raw = line.partition("\t")
        kind, _, name = key.partition(" ")
        value = float(raw)
        if kind == "s":
            summary[name] = int(value)
        elif kind == "n":
            statuses[int(name)] += int(value)
        elif kind == "h":
            status, _, us = name.partition(" ")
            histograms[int(status)][int(us)] += int(value)
        elif kind == "t":
            slot, _, what = name.partition(" ")
            slots[int(slot)][what] += int(value)
        elif kind == "x" and name.endswith("_max"):
            inspected[name] = max(inspected.get(name, value), value)
        elif kind == "x":
            inspected[name] = inspected.get(name, 0) + value
    return WrkRun(
        duration_s=summary["duration_us"] / 1e6,
        requests=summary["requests"],
        statuses=dict(statuses),
        histograms={status: dict(hist) for status, hist in histograms.items()},
        errors={k.removeprefix("errors_"): v for k, v in summary.items() if k.startswith("errors")},
        inspected=inspected,
        timeline={slot: dict(counts) for slot, counts in sorted(slots.items())},
        wrk_latency_us={k: v for k, v in summary.items() if k.startswith("wrk_")},
        cpu_s=cpu_s,
        output=output,
    )
