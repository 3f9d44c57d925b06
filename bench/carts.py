"""The carts section of ``make bench`` (issue 37): a bill of materials in one request.

Each case starts a FRESH lab and QuoteFlow (defaults, ``--event-loop`` the
case's loop; ``BENCH_QUOTEFLOW_ARGS`` is not passed on) and measures from a
client in this process. Carts ask the lab's ``BOM-001`` … ``BOM-200`` at
quantity 1; the lab's three suppliers quote every one of them.

Cases and issue 37's targets:

- ``batch100``: a 100-line cart to the three lab suppliers in the lab's
  batch dialect (``POST /batch/{name}/match``, ``max_items = 50``, the lab's
  adapter) with the lab at 400 ms a call. Every line quoted by every
  supplier, 2 calls per supplier, answered in ≤ 0.6 s at the client (the
  median of 3 carts). Beside it, ``singles100``: the same 100 lines as single
  quotes (``POST /api/quotes``) to the classic suppliers at 400 ms, 8 at a
  time: its supplier calls, quotes and time are reported.
- ``classic100``: the same cart to the classic suppliers (one line per call)
  at 0 ms: complete, within the cart budget; at 400 ms (``classic100_400``):
  partial, with a code on every line a supplier did not quote, none later
  than the cart budget + 150 ms at the client.
- ``fairness``: single quotes from 4 closed-loop callers for 10 s with the lab
  at 50 ms, first alone, then while 2 closed-loop callers send 200-line carts
  to the same QuoteFlow: no single quote later than the budget + 150 ms, no
  cart later than the cart budget + 150 ms. The 4 callers' 12 calls fill the
  6 slots alone, so since issue 49 carts get their part of them: single-quote
  goodput (200s with every quote) with carts ≥ (limit − cart slots) ÷ limit
  of without, less 5 % (issue 37's ≥ 70 % was strict priority's).
- ``basket``: the basket's CPU on ``bench.basket``'s generator, 200 lines ×
  8 suppliers (≤ 5 ms) and × 32 (≤ 50 ms), the median over its seeded carts.

Issue 49's two cases of carts and single quotes sharing the slots: the lab's
three suppliers in its batch dialect (``max_items = 20``, as ``make run``'s
batch QuoteFlow; the default limits) at 50 ms; single quotes from 4
closed-loop callers for 10 s alone, then beside one caller sending 200-line
carts back to back:

- ``share_coalesce``: QuoteFlow with ``--coalesce``, every caller asking
  ``HOT-01``: single-quote goodput beside carts ≥ 0.90 × alone; none late.
- ``share_saturate``: no coalescing, each caller its own SKU, so single
  quotes alone fill every slot: every cart complete (every line quoted)
  within its budget, single-quote goodput ≥ (limit − cart slots) ÷ limit ×
  alone, less 5 % (× 0.95: 0.633 at the defaults).

Standalone (figures as JSON on stdout, a table on stderr)::

    python -m bench.carts                       # every case, both loops
    python -m bench.carts --case fairness --loop uvloop
    python -m bench.carts --case share_saturate --loop uvloop --against main --repeat 3

``--against REV`` runs each case against ``REV``'s QuoteFlow too (its files
unpacked, as ``bench.versus`` does), taking turns with this tree's, so both
see the same machine; ``--repeat`` runs each case that many times per tree.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs

from bench import basket as basket_bench
from bench.core import SLOW_FULL_S, Bench
from bench.procs import BenchError, Service, free_port, http, start, stop
from bench.report import Target
from bench.slow import client_loop_factory, loops
from bench.versus import export

ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"
NAME = "carts"
"""The section's name: in ``--only``, ``latest.json`` and the table."""
SUPPLIERS = ("atlas", "boreal", "cedar")
CART_BUDGET_S = 2.0
BUDGET_S = 0.8
GRACE_S = 0.15
"""No answer later than its budget + 150 ms at the client."""
FAIRNESS_S = 10.0
PAUSE_AFTER_503_S = 0.05
REQUEST_TIMEOUT_S = 10.0
CASES = (
    "batch100",
    "singles100",
    "classic100",
    "classic100_400",
    "fairness",
    "share_coalesce",
    "share_saturate",
    "basket",
)
SHARE_MAX_ITEMS = 20
"""Lines per batch call in the sharing cases: ``make run``'s batch QuoteFlow's."""
OUTBOUND_LIMIT = 6
CART_SLOTS = 2
"""QuoteFlow's defaults, for the saturate case's target."""


def bom(lines: int) -> list[dict[str, Any]]:
    """The first ``lines`` parts of the lab's bill of materials, one of each."""
    return [{"sku": f"BOM-{n:03d}", "quantity": 1} for n in range(1, lines + 1)]


def batch_catalogue(lab_url: str, max_items: int = 50) -> str:
    """The three lab suppliers in the batch dialect, ``max_items`` parts a call."""
    tables = []
    for name in SUPPLIERS:
        tables.append(
            "\n".join(
                (
                    "[[supplier]]",
                    f'name = "{name}"',
                    'method = "POST"',
                    f'url = "{lab_url}/batch/{name}/match"',
                    'adapter = "provider_lab.adapters:batch_dialect"',
                    'body = { parts = [ { mpn = "{sku}", qty = "{quantity}" } ], '
                    'scenario = "{scenario}" }',
                    f'batch = {{ max_items = {max_items}, items = "parts" }}',
                )
            )
        )
    return "\n\n".join(tables) + "\n"


class Stack:
    """A fresh lab and QuoteFlow, stopped on exit."""

    def __init__(
        self,
        loop: str,
        log_dir: Path,
        *,
        batch: bool,
        latency_ms: int,
        max_items: int = 50,
        extra: Sequence[str] = (),
        tree: Path | None = None,
    ) -> None:
        self.loop = loop
        self.log_dir = log_dir
        self.batch = batch
        self.latency_ms = latency_ms
        self.max_items = max_items
        self.extra = tuple(extra)
        """More QuoteFlow flags."""
        self.tree = tree
        """Another tree's QuoteFlow (``--against``); None: this one's."""
        self.services: list[Service] = []

    def __enter__(self) -> Stack:
        lab_port = free_port()
        lab = start(
            "lab",
            [sys.executable, "-m", "provider_lab", "--host", HOST, "--port", str(lab_port)],
            lab_port,
            self.log_dir,
            cwd=ROOT,
        )
        self.services.append(lab)
        self.lab_url = lab.url
        argv = [sys.executable, "-m", "quoteflow", "--host", HOST, "--event-loop", self.loop]
        if self.batch:
            path = self.log_dir / "batch-suppliers.toml"
            path.write_text(batch_catalogue(lab.url, self.max_items))
            argv += ["--suppliers", str(path)]
        else:
            argv += ["--provider-url", lab.url]
        port = free_port()
        argv += [*self.extra, "--port", str(port)]
        cwd, env = ROOT, None
        if self.tree is not None:
            cwd, env = self.tree, {"PYTHONPATH": str(self.tree)}
        name = f"quoteflow-{self.loop}"
        self.services.append(start(name, argv, port, self.log_dir, cwd=cwd, env=env))
        self.url = self.services[-1].url
        status, _, _ = http("PUT", lab.url + "/latency", {"ms": self.latency_ms})
        if status != 200:
            raise BenchError(f"lab latency: {status}")
        return self

    def __exit__(self, *exc: object) -> None:
        for service in reversed(self.services):
            stop(service)

    def lab_stats(self) -> dict[str, Any]:
        status, _, body = http("GET", self.lab_url + "/stats")
        if status != 200:
            raise BenchError(f"lab stats: {status}")
        return dict(body)


async def _post(
    session: aiohttp.ClientSession, url: str, body: object, request_id: str | None = None
) -> tuple[int, dict[str, Any] | None, float]:
    headers = {} if request_id is None else {"X-Request-ID": request_id}
    sent = time.perf_counter()
    async with session.post(url, json=body, headers=headers) as response:
        raw = await response.read()
        status = response.status
    took = time.perf_counter() - sent
    answer = json.loads(raw) if status == 200 else None
    return status, answer, took


def _session(limit: int) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=limit),
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        cookie_jar=aiohttp.DummyCookieJar(),
    )


def _run(coro: Any) -> Any:
    _, factory = client_loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(coro)


def _cart_figures(answer: dict[str, Any]) -> dict[str, Any]:
    lines = answer["lines"]
    coded = all(
        {q["supplier"] for q in line["quotes"]} | {f["supplier"] for f in line["failures"]}
        == set(SUPPLIERS)
        for line in lines
    )
    codes: dict[str, int] = {}
    for line in lines:
        for failure in line["failures"]:
            codes[failure["code"]] = codes.get(failure["code"], 0) + 1
    return {
        "lines": len(lines),
        "fully_quoted_lines": sum(len(line["quotes"]) == len(SUPPLIERS) for line in lines),
        "quotes": sum(len(line["quotes"]) for line in lines),
        "every_line_coded": coded,
        "failure_codes": codes,
        "basket_total_cents": answer["basket"]["total_cents"],
        "per_line_total_cents": answer["basket"]["per_line_total_cents"],
        "optimal": answer["basket"]["optimal"],
        "complete": answer["basket"]["complete"],
    }


def case_cart(loop: str, log_dir: Path, *, batch: bool, latency_ms: int) -> dict[str, Any]:
    """Three 100-line carts, one after another, each on its own request id."""

    async def carts(url: str) -> list[tuple[int, dict[str, Any] | None, float]]:
        async with _session(1) as session:
            return [await _post(session, url, {"lines": bom(100)}, f"cart-{n}") for n in range(3)]

    with Stack(loop, log_dir, batch=batch, latency_ms=latency_ms) as stack:
        runs = _run(carts(stack.url + "/api/carts"))
        stats = stack.lab_stats()
    seconds = [took for _, _, took in runs]
    figures: dict[str, Any] = {
        "statuses": [status for status, _, _ in runs],
        "seconds": [round(s, 3) for s in seconds],
        "median_s": round(statistics.median(seconds), 3),
        "late": sum(s > CART_BUDGET_S + GRACE_S for s in seconds),
        "lab_calls": stats.get("total"),
    }
    answers = [answer for _, answer, _ in runs if answer is not None]
    if answers:
        figures.update(_cart_figures(answers[-1]))
    if batch:
        per_id = stats.get("batch_sizes_per_id", {}).get("cart-2", {})
        figures["calls_per_supplier"] = {name: len(per_id.get(name, [])) for name in SUPPLIERS}
    return figures


def case_singles(loop: str, log_dir: Path) -> dict[str, Any]:
    """The same 100 lines as single quotes, 8 at a time, to classic suppliers at 400 ms."""

    async def singles(url: str) -> tuple[list[tuple[int, dict[str, Any] | None, float]], float]:
        lines = bom(100)
        results: list[tuple[int, dict[str, Any] | None, float]] = []
        async with _session(8) as session:
            began = time.perf_counter()
            for start_at in range(0, len(lines), 8):
                chunk = lines[start_at : start_at + 8]
                results += await asyncio.gather(*(_post(session, url, line) for line in chunk))
            return results, time.perf_counter() - began

    with Stack(loop, log_dir, batch=False, latency_ms=400) as stack:
        results, took = _run(singles(stack.url + "/api/quotes"))
        stats = stack.lab_stats()
    quotes = sum(len(answer["quotes"]) for _, answer, _ in results if answer is not None)
    return {
        "requests": len(results),
        "statuses": dict(_count(status for status, _, _ in results)),
        "seconds": round(took, 3),
        "quotes": quotes,
        "lab_calls": stats.get("total"),
    }


def _count(values: Any) -> dict[Any, int]:
    counted: dict[Any, int] = {}
    for value in values:
        counted[value] = counted.get(value, 0) + 1
    return counted


async def _closed_loop(
    session: aiohttp.ClientSession,
    url: str,
    body: object,
    end: float,
    seen: list[tuple[int, dict[str, Any] | None, float]],
) -> None:
    while time.perf_counter() < end:
        try:
            result = await _post(session, url, body)
        except (aiohttp.ClientError, TimeoutError):
            seen.append((0, None, REQUEST_TIMEOUT_S))
            await asyncio.sleep(PAUSE_AFTER_503_S)
            continue
        seen.append(result)
        if result[0] == 503:
            await asyncio.sleep(PAUSE_AFTER_503_S)


def case_fairness(loop: str, log_dir: Path, duration_s: float = FAIRNESS_S) -> dict[str, Any]:
    """4 single-quote callers alone, then beside 2 callers of 200-line carts (lab at 50 ms)."""

    async def drive(url: str, with_carts: bool) -> dict[str, Any]:
        singles: list[tuple[int, dict[str, Any] | None, float]] = []
        carts: list[tuple[int, dict[str, Any] | None, float]] = []
        async with _session(6) as session:
            end = time.perf_counter() + duration_s
            tasks = [
                _closed_loop(session, url + "/api/quotes", {"quantity": 1}, end, singles)
                for _ in range(4)
            ]
            if with_carts:
                cart = {"lines": bom(200)}
                tasks += [
                    _closed_loop(session, url + "/api/carts", cart, end, carts) for _ in range(2)
                ]
            await asyncio.gather(*tasks)
        good = sum(
            1
            for status, answer, _ in singles
            if status == 200 and answer is not None and len(answer["failures"]) == 0
        )
        return {
            "singles": len(singles),
            "singles_goodput": good,
            "singles_late": sum(took > BUDGET_S + GRACE_S for s, _, took in singles if s == 200),
            "singles_statuses": _count(status for status, _, _ in singles),
            "carts": len(carts),
            "carts_statuses": _count(status for status, _, _ in carts),
            "carts_late": sum(took > CART_BUDGET_S + GRACE_S for s, _, took in carts if s == 200),
            "cart_quotes": [
                sum(len(line["quotes"]) for line in answer["lines"])
                for _, answer, _ in carts
                if answer is not None
            ],
        }

    with Stack(loop, log_dir, batch=False, latency_ms=50) as stack:
        alone = _run(drive(stack.url, False))
        beside = _run(drive(stack.url, True))
    ratio = beside["singles_goodput"] / alone["singles_goodput"] if alone["singles_goodput"] else 0
    return {"alone": alone, "with_carts": beside, "goodput_ratio": round(ratio, 3)}


def case_share(
    loop: str,
    log_dir: Path,
    case: str,
    duration_s: float = FAIRNESS_S,
    tree: Path | None = None,
) -> dict[str, Any]:
    """Issue 49's cases: 4 single-quote callers alone, then beside back-to-back 200-line carts."""
    coalesce = case == "share_coalesce"
    skus = ["HOT-01"] * 4 if coalesce else [f"HOT-{n:02d}" for n in range(1, 5)]

    async def drive(url: str, with_carts: bool) -> dict[str, Any]:
        singles: list[tuple[int, dict[str, Any] | None, float]] = []
        carts: list[tuple[int, dict[str, Any] | None, float]] = []
        async with _session(6) as session:
            end = time.perf_counter() + duration_s
            tasks = [
                _closed_loop(
                    session, url + "/api/quotes", {"sku": sku, "quantity": 1}, end, singles
                )
                for sku in skus
            ]
            if with_carts:
                cart = {"lines": bom(200)}
                tasks.append(_closed_loop(session, url + "/api/carts", cart, end, carts))
            await asyncio.gather(*tasks)
        good = sum(
            1
            for status, answer, _ in singles
            if status == 200 and answer is not None and len(answer["failures"]) == 0
        )
        complete = [
            status == 200
            and answer is not None
            and all(line["quotes"] for line in answer["lines"])
            and took <= CART_BUDGET_S + GRACE_S
            for status, answer, took in carts
        ]
        return {
            "singles": len(singles),
            "singles_goodput_per_s": round(good / duration_s, 1),
            "singles_late": sum(took > BUDGET_S + GRACE_S for s, _, took in singles if s == 200),
            "singles_statuses": _count(status for status, _, _ in singles),
            "carts": len(carts),
            "carts_complete_in_budget": sum(complete),
            "carts_seconds": [round(took, 3) for _, _, took in carts],
            "cart_quotes": [
                sum(len(line["quotes"]) for line in answer["lines"])
                for _, answer, _ in carts
                if answer is not None
            ],
        }

    extra = ("--coalesce",) if coalesce else ()
    stack = Stack(
        loop, log_dir, batch=True, latency_ms=50, max_items=SHARE_MAX_ITEMS, extra=extra, tree=tree
    )
    with stack:
        alone = _run(drive(stack.url, False))
        beside = _run(drive(stack.url, True))
    before = alone["singles_goodput_per_s"]
    ratio = beside["singles_goodput_per_s"] / before if before else 0
    return {"alone": alone, "with_carts": beside, "goodput_ratio": round(ratio, 3)}


def case_basket() -> dict[str, Any]:
    """The basket's CPU, from ``bench.basket``."""
    return dict(basket_bench.figures())


def run_case(case: str, loop: str, log_dir: Path) -> dict[str, Any]:
    if case == "batch100":
        return case_cart(loop, log_dir, batch=True, latency_ms=400)
    if case == "singles100":
        return case_singles(loop, log_dir)
    if case == "classic100":
        return case_cart(loop, log_dir, batch=False, latency_ms=0)
    if case == "classic100_400":
        return case_cart(loop, log_dir, batch=False, latency_ms=400)
    if case == "fairness":
        return case_fairness(loop, log_dir)
    if case in ("share_coalesce", "share_saturate"):
        return case_share(loop, log_dir, case)
    if case == "basket":
        return case_basket()
    raise BenchError(f"unknown case {case!r}")


def judge(case: str, figures: dict[str, Any]) -> list[tuple[str, bool]]:
    """Issues 37's and 49's targets for one case's figures: (what, met)."""
    if case == "batch100":
        return [
            ("every line quoted by all 3", figures.get("fully_quoted_lines") == 100),
            ("2 calls per supplier", set(figures.get("calls_per_supplier", {}).values()) == {2}),
            ("median ≤ 0.6 s", figures["median_s"] <= 0.6),
        ]
    if case == "classic100":
        return [
            ("complete", figures.get("fully_quoted_lines") == 100),
            ("within the cart budget", figures["late"] == 0),
        ]
    if case == "classic100_400":
        return [
            ("a code on every unquoted line", bool(figures.get("every_line_coded"))),
            ("none later than budget + 150 ms", figures["late"] == 0),
        ]
    if case == "fairness":
        beside = figures["with_carts"]
        least = (OUTBOUND_LIMIT - CART_SLOTS) / OUTBOUND_LIMIT * 0.95
        return [
            ("single goodput ≥ 4/6 × alone less 5 %", figures["goodput_ratio"] >= least),
            ("no single late", beside["singles_late"] == 0),
            ("no cart late", beside["carts_late"] == 0),
        ]
    if case == "share_coalesce":
        beside = figures["with_carts"]
        return [
            ("single goodput ≥ 0.90 × alone", figures["goodput_ratio"] >= 0.90),
            ("no single late", beside["singles_late"] == 0),
        ]
    if case == "share_saturate":
        beside = figures["with_carts"]
        least = (OUTBOUND_LIMIT - CART_SLOTS) / OUTBOUND_LIMIT * 0.95
        return [
            (
                "every cart complete in budget",
                0 < beside["carts_complete_in_budget"] == beside["carts"],
            ),
            ("single goodput ≥ 4/6 × alone less 5 %", figures["goodput_ratio"] >= least),
        ]
    if case == "basket":
        return [
            ("200×8 median ≤ 5 ms", figures["200x8"]["median_ms"] <= 5),
            ("200×32 median ≤ 50 ms", figures["200x32"]["median_ms"] <= 50),
        ]
    return []


def run_carts(bench: Bench) -> dict[str, Any]:
    """Every case under every loop (the basket's once), each against a fresh lab and QuoteFlow.

    Under ``--quick`` the fairness and sharing cases run for a fifth of their 10 s.
    """
    runs: dict[str, dict[str, Any]] = {}
    scale = bench.options.slow_duration_s / SLOW_FULL_S
    for case in CASES:
        for loop in loops() if case != "basket" else ("-",):
            if case == "fairness":
                figures = case_fairness(loop, bench.log_dir, FAIRNESS_S * scale)
            elif case in ("share_coalesce", "share_saturate"):
                figures = case_share(loop, bench.log_dir, case, FAIRNESS_S * scale)
            else:
                figures = run_case(case, loop, bench.log_dir)
            runs.setdefault(case, {})[loop] = figures
            met = ", ".join(f"{w}: {'met' if ok else 'NOT met'}" for w, ok in judge(case, figures))
            print(f"carts {case} {loop}: {met or 'reported'}", flush=True)
    return {"loops": list(loops()), "runs": runs}


def summarize(section: dict[str, Any]) -> dict[str, Any]:
    """The runs by case, then loop (as ``run_carts`` keeps them)."""
    return {"runs": section["runs"]}


_SHOWN: dict[str, tuple[str, ...]] = {
    "batch100": ("median_s", "fully_quoted_lines", "calls_per_supplier"),
    "singles100": ("seconds", "quotes", "lab_calls"),
    "classic100": ("median_s", "fully_quoted_lines", "lab_calls"),
    "classic100_400": ("median_s", "quotes", "late"),
    "fairness": ("goodput_ratio",),
    "share_coalesce": ("goodput_ratio",),
    "share_saturate": ("goodput_ratio",),
    "basket": ("200x8", "200x32"),
}
"""The figures the table shows beside each case's targets."""


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per target and case, asyncio | uvloop beside it; the figures of each case after."""
    rows: list[Target] = []
    for case, runs in summary["runs"].items():
        by_loop = [runs.get("asyncio") or runs.get("-"), runs.get("uvloop")]
        present = [figures for figures in by_loop if figures is not None]
        first = present[0] if present else {}
        for index, (what, _) in enumerate(judge(case, first) if present else []):
            verdicts = [judge(case, figures)[index][1] for figures in present]
            shown = [
                ("met" if judge(case, f)[index][1] else "NOT met") if f is not None else "–"
                for f in by_loop
            ]
            metric = f"{case}: {what} (asyncio | uvloop)"
            issue = "issue 49" if case.startswith("share_") or case == "fairness" else "issue 37"
            rows.append(Target(NAME, metric, shown[0], shown[1], "", issue, all(verdicts)))
        for key in _SHOWN.get(case, ()):
            values = [json.dumps(f.get(key)) if f is not None else "–" for f in by_loop]
            metric = f"{case}: {key} (asyncio | uvloop)"
            rows.append(Target(NAME, metric, values[0], values[1], "", "reported", None))
    return [attrs.asdict(row) for row in rows]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.carts", description=__doc__)
    parser.add_argument("--case", choices=(*CASES, "all"), default="all")
    parser.add_argument("--loop", choices=("asyncio", "uvloop", "both"), default="both")
    parser.add_argument("--against", metavar="REV", help="also run REV's QuoteFlow, in turns")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each case per tree")
    options = parser.parse_args(argv)
    cases = CASES if options.case == "all" else (options.case,)
    chosen = loops() if options.loop == "both" else (options.loop,)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-carts-") as folder:
        trees: dict[str, Path | None] = {"this": None}
        if options.against:
            trees[options.against] = export(options.against, Path(folder))
        for case in cases:
            for loop in chosen if case != "basket" else ("-",):
                for run in range(options.repeat):
                    for label, tree in trees.items():
                        if tree is not None and not case.startswith("share_"):
                            continue
                        if case.startswith("share_"):
                            figures = case_share(loop, Path(folder), case, tree=tree)
                        else:
                            figures = run_case(case, loop, Path(folder))
                        verdicts = judge(case, figures)
                        key = f"{case}/{loop}/{label}/{run}"
                        results[key] = {"figures": figures, "targets": verdicts}
                        marks = ", ".join(
                            f"{what}: {'met' if ok else 'NOT met'}" for what, ok in verdicts
                        )
                        print(
                            f"{key:32} {_brief(case, figures)} {marks}", file=sys.stderr, flush=True
                        )
    json.dump(results, sys.stdout, indent=2)
    print()
    return 0


def _brief(case: str, figures: dict[str, Any]) -> str:
    """The sharing cases' headline figures, for the table on stderr."""
    if not case.startswith("share_"):
        return ""
    alone, beside = figures["alone"], figures["with_carts"]
    return (
        f"singles {alone['singles_goodput_per_s']}/s alone, "
        f"{beside['singles_goodput_per_s']}/s beside carts ({figures['goodput_ratio']} x); "
        f"carts {beside['carts_complete_in_budget']} of {beside['carts']} complete in budget;"
    )


if __name__ == "__main__":
    raise SystemExit(main())
