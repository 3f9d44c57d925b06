"""Where QuoteFlow's CPU goes: py-spy samples while wrk drives it.

``python -m bench.run --profile`` (root, ``pip install py-spy``) writes, per
profiled workload, the collapsed stacks (``profile-<workload>.collapsed``, open
them in speedscope.app) and a summary: the share of samples per function
(self and inclusive) and per area (aiohttp server, aiohttp client, json,
cattrs, attrs, asyncio, QuoteFlow's own modules).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.wrk import WrkRun

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")

AREAS: tuple[tuple[str, str], ...] = (
    ("prometheus_client/", "prometheus_client"),
    ("cattrs/", "cattrs"),
    ("attr/", "attrs"),
    ("json/", "json"),
    ("aiohttp/web", "aiohttp server"),
    ("aiohttp/client", "aiohttp client"),
    ("aiohttp/connector", "aiohttp client"),
    ("aiohttp/", "aiohttp other"),
    ("yarl/", "yarl"),
    ("multidict/", "multidict"),
    ("asyncio/", "asyncio"),
    ("logging/", "logging"),
    ("uuid", "uuid"),
    ("random", "random"),
)


def _py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


def _area(path: str) -> str:
    if "quoteflow/" in path:  # QuoteFlow's own modules one by one
        return "quoteflow." + path.rsplit("/", 1)[-1].removesuffix(".py")
    if "bench/" in path:
        return "bench." + path.rsplit("/", 1)[-1].removesuffix(".py")
    for needle, name in AREAS:
        if needle in path:
            return name
    return "other"


def _frames(stack: str) -> list[tuple[str, str]]:
    """(function, file) per Python frame of one collapsed stack, outermost first."""
    found: list[tuple[str, str]] = []
    for part in stack.split(";"):
        match = FRAME.match(part.strip())
        if match and match["file"].endswith(".py"):
            found.append((match["func"], match["file"]))
    return found


LOOP_FRAMES = frozenset({"_run_once", "Handle._run", "_run"})


def _below_loop(frames: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The frames under the event loop's last dispatch frame (all of them if none)."""
    for i in range(len(frames) - 1, -1, -1):
        func, file = frames[i]
        if file.endswith(("asyncio/base_events.py", "asyncio/events.py")) and (
            func.rsplit(".", 1)[-1] in LOOP_FRAMES
        ):
            return frames[i + 1 :]
    return frames


def summarize(collapsed: str, top: int = 30) -> dict[str, Any]:
    """Self and inclusive shares per function and per area from py-spy's raw output."""
    self_time: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    areas_self: Counter[str] = Counter()
    areas_incl: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = _frames(stack)
        if not frames:
            continue
        total += count
        func, file = frames[-1]
        self_time[f"{func} ({_short(file)})"] += count
        areas_self[_area(file)] += count
        # Inclusive shares count from the event loop's callback down: every
        # stack starts in __main__, run_app and the loop, which says nothing.
        inner = _below_loop(frames)
        for name in {f"{f} ({_short(p)})" for f, p in inner}:
            inclusive[name] += count
        for area in {_area(p) for _, p in inner}:
            areas_incl[area] += count

    def shares(counter: Counter[str], n: int) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in counter.most_common(n)]

    return {
        "samples": total,
        "self": shares(self_time, top),
        "self_all": shares(self_time, len(self_time)),
        "inclusive": shares(inclusive, top),
        "areas_self": shares(areas_self, 20),
        "areas_inclusive": shares(areas_incl, 20),
    }


def _short(path: str) -> str:
    for marker in ("site-packages/", "lib/python3"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


RATE_HZ = 200


def record(pid: int, drive: Callable[[], WrkRun], out_base: Path) -> dict[str, Any]:
    """Sample ``pid`` with py-spy for as long as ``drive()`` runs; summarize the samples.

    Shares are also turned into CPU milliseconds per response (samples ÷ rate ÷
    responses), so two contenders at different throughputs compare directly.
    """
    py_spy = _py_spy()
    if py_spy is None:
        return {"error": "py-spy is not installed: .venv/bin/pip install py-spy"}
    collapsed = out_base.with_suffix(".collapsed")
    # Blocking sampling (py-spy pauses the process for each sample): with
    # --nonblocking many stacks came back cut short.
    argv = [py_spy, "record", "--pid", str(pid), "--rate", str(RATE_HZ), "--format", "raw"]
    process = subprocess.Popen(
        [*argv, "--output", str(collapsed)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    run: WrkRun | None = None
    try:
        run = drive()
    finally:
        process.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
        try:
            _, err = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            _, err = process.communicate()
    if not collapsed.exists():
        return {"error": f"py-spy wrote nothing: {err.decode(errors='replace')[-500:]}"}
    summary = summarize(collapsed.read_text())
    summary["responses"] = run.requests if run else 0
    summary["rps"] = run.rps if run else 0.0
    summary["ms_per_response"] = (
        1000 * summary["samples"] / RATE_HZ / run.requests if run and run.requests else None
    )
    out_base.with_suffix(".summary.txt").write_text(format_summary(summary))
    return summary


def diff(ours: dict[str, Any], reference: dict[str, Any], top: int = 25) -> str:
    """CPU ms per response by area and by function: ours, the reference, and the gap."""
    lines: list[str] = []
    per = (ours.get("ms_per_response"), reference.get("ms_per_response"))
    if per[0] is None or per[1] is None:
        return "no per-response figures\n"
    lines.append(
        f"CPU per response: {per[0]:.3f} ms vs {per[1]:.3f} ms (+{per[0] - per[1]:.3f} ms); "
        f"sampled at {ours['rps']:.0f} vs {reference['rps']:.0f} responses/s"
    )
    for key, title in (
        ("areas_self", "self time by area"),
        ("areas_inclusive", "inclusive time by area (below the event loop)"),
        ("self_all", "self time by function"),
    ):
        a = {k: pct / 100 * per[0] for k, pct in ours[key]}
        b = {k: pct / 100 * per[1] for k, pct in reference[key]}
        rows = sorted(set(a) | set(b), key=lambda k: a.get(k, 0) - b.get(k, 0), reverse=True)
        lines.append(f"\n{title}: ms per response (ours / reference / gap)")
        lines += [
            f"  {a.get(k, 0):.4f}  {b.get(k, 0):.4f}  {a.get(k, 0) - b.get(k, 0):+.4f}  {k}"
            for k in rows[:top]
        ]
    return "\n".join(lines) + "\n"


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as text a person reads."""
    lines = [f"{summary['samples']} samples (active, non-idle)"]
    if summary.get("ms_per_response"):
        lines.append(
            f"{summary['responses']} responses at {summary['rps']:.0f}/s: "
            f"{summary['ms_per_response']:.3f} ms of sampled CPU per response"
        )
    for key, title in (
        ("areas_self", "self time by area"),
        ("areas_inclusive", "inclusive time by area"),
        ("self", "self time by function"),
        ("inclusive", "inclusive time by function"),
    ):
        lines.append(f"\n{title}:")
        lines += [f"  {pct:5.1f} %  {name}" for name, pct in summary[key]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    # python -m bench.profile FILE.collapsed: summarize an existing recording.
    print(format_summary(summarize(Path(sys.argv[1]).read_text(), top=40)))
