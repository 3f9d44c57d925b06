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

FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")

AREAS: tuple[tuple[str, str], ...] = (
    ("quoteflow/", "quoteflow"),
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
        for name in {f"{f} ({_short(p)})" for f, p in frames}:
            inclusive[name] += count
        for area in {_area(p) for _, p in frames}:
            areas_incl[area] += count

    def shares(counter: Counter[str], n: int) -> list[tuple[str, float]]:
        return [(k, round(100 * v / total, 1)) for k, v in counter.most_common(n)]

    return {
        "samples": total,
        "self": shares(self_time, top),
        "inclusive": shares(inclusive, top),
        "areas_self": shares(areas_self, 20),
        "areas_inclusive": shares(areas_incl, 20),
    }


def _short(path: str) -> str:
    for marker in ("site-packages/", "lib/python3"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def record(pid: int, drive: Callable[[], object], out_base: Path) -> dict[str, Any]:
    """Sample ``pid`` with py-spy for as long as ``drive()`` runs; summarize the samples."""
    py_spy = _py_spy()
    if py_spy is None:
        return {"error": "py-spy is not installed: .venv/bin/pip install py-spy"}
    collapsed = out_base.with_suffix(".collapsed")
    process = subprocess.Popen(
        [
            py_spy,
            "record",
            "--pid",
            str(pid),
            "--rate",
            "250",
            "--nonblocking",
            "--format",
            "raw",
            "--output",
            str(collapsed),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        drive()
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
    out_base.with_suffix(".summary.txt").write_text(format_summary(summary))
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """The summary as text a person reads."""
    lines = [f"{summary['samples']} samples (active, non-idle)"]
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
