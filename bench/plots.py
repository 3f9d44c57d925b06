"""PNG plots of a benchmark run (needs matplotlib: ``pip install -e '.[bench]'``).

- ``latency_cdf.png``: per workload, the latency CDF of QuoteFlow vs the bare fan-out;
- ``throughput.png``: per workload, 200s and 503s per second of each contender;
- ``timeline.png``: per scenario, one request's attempts across the budget, when
  QuoteFlow answers ``?explain=1`` with its budget bill (skipped otherwise).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # after matplotlib.use: the backend must be chosen first
from matplotlib.axes import Axes
from matplotlib.ticker import ScalarFormatter

from bench.stats import cdf, merge, spread

COLORS = {"quoteflow": "#1f6feb", "bare": "#8b949e"}
LABELS = {"quoteflow": "QuoteFlow", "bare": "bare fan-out"}
OUTCOME_COLORS = {"ok": "#2da44e", "timeout": "#bf8700"}
FAILURE_COLOR = "#cf222e"


def draw(results: dict[str, Any], out_dir: Path) -> list[Path]:
    """Write every plot that has data; return the files written."""
    written = [_latency_cdf(results, out_dir / "latency_cdf.png")]
    written.append(_throughput(results, out_dir / "throughput.png"))
    if results.get("explain"):
        written.append(_timeline(results, out_dir / "timeline.png"))
    if "comeback" in results["workloads"]:
        written.append(_comeback(results, out_dir / "comeback.png"))
    return written


def _comeback(results: dict[str, Any], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(8, 3.2))
    runs = results["workloads"]["comeback"]["runs"]
    for i, run in enumerate(runs):
        slots = run["timeline"]
        xs = [slot["t_s"] for slot in slots]
        ys = [100 * slot["quoted"] / slot["n"] if slot["n"] else 0 for slot in slots]
        ax.step(xs, ys, where="post", color=COLORS["quoteflow"], alpha=1 - 0.3 * i)
    ax.set_ylim(0, 105)
    ax.set_xlabel("seconds since the first answer (100 ms slots)")
    ax.set_ylabel("% of answers with boreal")
    ax.set_title("flaky right after the outage: QuoteFlow's retries resume as they pay again")
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _hist(runs: list[dict[str, Any]], status: str | None) -> dict[int, int]:
    return merge(
        {int(b): c for b, c in hist.items()}
        for run in runs
        for code, hist in run["histograms"].items()
        if status is None or code == status
    )


def _latency_cdf(results: dict[str, Any], path: Path) -> Path:
    workloads = results["workloads"]
    budget_ms = results["limits"]["budget_s"] * 1000
    cols = 3
    rows = max(1, -(-len(workloads) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    flat: list[Axes] = [ax for row in axes for ax in row]
    for ax, (name, workload) in zip(flat, workloads.items(), strict=False):
        seen: list[float] = []
        for contender in ("bare", "quoteflow"):
            runs = [r for r in workload["runs"] if r["contender"] == contender]
            ok = _hist(runs, "200")
            if ok:
                xs, ys = cdf(ok)
                seen += xs
                ax.step(
                    xs,
                    ys,
                    where="post",
                    color=COLORS[contender],
                    label=f"{LABELS[contender]} (200)",
                )
            every = _hist(runs, None)
            if sum(every.values()) > sum(ok.values()):
                xs, ys = cdf(every)
                seen += xs
                ax.step(
                    xs,
                    ys,
                    where="post",
                    color=COLORS[contender],
                    linestyle="--",
                    label=f"{LABELS[contender]} (all, incl. 503)",
                )
        low, high = (min(seen), max(seen)) if seen else (1.0, budget_ms)
        if high > 10 * max(low, 1e-3):
            ax.set_xscale("log")
            ax.set_xlabel("latency (ms, log)")
            ax.axvline(budget_ms, color="#bf8700", linewidth=0.8, linestyle=":")
        else:
            if 0.9 * low <= budget_ms <= 1.1 * high:
                ax.axvline(budget_ms, color="#bf8700", linewidth=0.8, linestyle=":")
                low, high = min(low, budget_ms), max(high, budget_ms)
            pad = 0.05 * (high - low) or 0.5
            ax.set_xlim(low - pad, high + pad)
            ax.set_xlabel("latency (ms)")
        ax.set_ylim(0, 1.01)
        ax.set_title(
            f"{name}: {workload['workload']['connections']} conn, "
            f"suppliers {workload['workload']['latency_ms']} ms, "
            f"{workload['workload']['scenario']}",
            fontsize=9,
        )
        ax.set_ylabel("share of responses")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for ax in flat[len(workloads) :]:
        ax.set_visible(False)
    fig.suptitle("Latency CDF per workload (dotted: the 0.8 s budget)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _throughput(results: dict[str, Any], path: Path) -> Path:
    names = list(results["workloads"])
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(names)), 4.2))
    width = 0.38
    for offset, contender in ((-width / 2, "quoteflow"), (width / 2, "bare")):
        for i, name in enumerate(names):
            runs = [r for r in results["workloads"][name]["runs"] if r["contender"] == contender]
            ok = spread(r["rate_200"] for r in runs)
            busy = spread(r["share_503"] * r["rps"] for r in runs if r["share_503"] is not None)
            if ok is None:
                continue
            ax.bar(
                i + offset,
                ok["median"],
                width,
                color=COLORS[contender],
                yerr=[[ok["median"] - ok["min"]], [ok["max"] - ok["median"]]],
                capsize=3,
                label=f"{LABELS[contender]} 200/s" if i == 0 else None,
            )
            if busy and busy["median"] > 0:
                ax.bar(
                    i + offset,
                    busy["median"],
                    width,
                    bottom=ok["median"],
                    color="none",
                    edgecolor=COLORS[contender],
                    hatch="//",
                    label=f"{LABELS[contender]} 503/s" if contender == "quoteflow" else None,
                )
            ax.annotate(
                f"{ok['median']:.0f}",
                (i + offset, ok["median"]),
                ha="center",
                va="bottom",
                fontsize=7,
                xytext=(0, 2),
                textcoords="offset points",
            )
    if "overload" in names:
        latency = results["workloads"]["overload"]["workload"]["latency_ms"]
        limits = results["limits"]
        allowed = limits["outbound"] / (3 * latency / 1000)
        i = names.index("overload")
        ax.hlines(
            allowed,
            i - 0.45,
            i + 0.45,
            colors="#bf8700",
            linestyles="--",
            label=f"overload: limits allow {allowed:.0f}/s",
        )
    ax.set_xticks(range(len(names)), names)
    ax.set_yscale("log")
    ax.set_ylabel("responses per second (log; median, bars min–max)")
    ax.set_title("Throughput per workload: QuoteFlow vs the bare aiohttp fan-out")
    ax.grid(True, axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _suppliers(explain: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(supplier, its bill) from the explain block, whichever way it is keyed."""
    inner = explain.get("suppliers", explain)
    if isinstance(inner, list):
        return [(str(entry.get("supplier", i)), entry) for i, entry in enumerate(inner)]
    return [(k, v) for k, v in inner.items() if isinstance(v, dict) and "attempts" in v]


def _timeline(results: dict[str, Any], path: Path) -> Path:
    bills: dict[str, Any] = results["explain"]
    fig, axes = plt.subplots(len(bills), 1, figsize=(10, 1.2 + 1.25 * len(bills)), squeeze=False)
    for ax, (scenario, explain) in zip((row[0] for row in axes), bills.items(), strict=False):
        budget = float(explain.get("budget_ms", results["limits"]["budget_s"] * 1000))
        suppliers = _suppliers(explain)
        for y, (_, bill) in enumerate(suppliers):
            for attempt in bill.get("attempts", []):
                start = float(attempt.get("start_ms", 0))
                wait = float(attempt.get("slot_wait_ms", 0) or 0)
                duration = float(attempt.get("duration_ms", 0) or 0)
                outcome = str(attempt.get("outcome", "?"))
                number = attempt.get("attempt", "?")
                if wait:
                    ax.barh(y, wait, left=start, color="#d0d7de", height=0.5)
                ax.barh(
                    y,
                    duration,
                    left=start + wait,
                    color=OUTCOME_COLORS.get(outcome, FAILURE_COLOR),
                    height=0.5,
                    edgecolor="black",
                    linewidth=0.3,
                )
                backoff = attempt.get("backoff_ms")
                if backoff:
                    ax.barh(
                        y,
                        float(backoff),
                        left=start + wait + duration,
                        color="none",
                        edgecolor="#57606a",
                        hatch="...",
                        height=0.5,
                    )
                above = number == 1
                ax.annotate(
                    f"#{number} {outcome}",
                    (start + wait + duration, y + (-0.25 if above else 0.25)),
                    fontsize=7,
                    va="bottom" if above else "top",
                    ha="right" if start + wait + duration > budget / 2 else "left",
                )
        ax.axvline(budget, color="#bf8700", linestyle="--", linewidth=1)
        ax.set_xscale("symlog", linthresh=10)
        ax.set_xlim(0, budget * 1.1)
        ax.set_xticks([0, 5, 10, 20, 30, 50, 100, 200, 400, 800])
        ax.get_xaxis().set_major_formatter(ScalarFormatter())
        ax.set_yticks(
            range(len(suppliers)),
            [f"{name} ({bill.get('stopped', '?')})" for name, bill in suppliers],
            fontsize=8,
        )
        ax.set_ylim(len(suppliers) - 0.4, -0.7)
        ax.set_title(scenario, fontsize=9, loc="left", fontweight="bold")
        ax.grid(True, axis="x", alpha=0.3)
    axes[-1][0].set_xlabel(
        "ms since admission (linear to 10 ms, log after; grey: waiting for a slot, "
        "dotted: backoff, dashed: the budget)"
    )
    fig.suptitle("One request's supplier attempts per scenario (QuoteFlow ?explain=1)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
