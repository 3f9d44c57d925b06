"""The catalogue section of ``make bench`` (issue 19): a 7-supplier catalogue, and the cost of none.

It starts a lab of its own serving seven suppliers (atlas, boreal, cedar and
four more) and five contenders against it, all at saturate (connections = the
inbound limit, suppliers answering at once), in blocks of A B C D E E D C B A
(each pair compared side by side), so a noisy neighbour hurts each alike:

- ``qf7``: QuoteFlow with a catalogue file of the seven (its outbound limit
  and every other setting as the benchmark's);
- ``bare7``: the bare fan-out (``bench/bare_fanout.py``) to the same seven;
- ``qf3``: QuoteFlow with no file (atlas, boreal, cedar under --provider-url);
- ``bare3``: the bare fan-out to those three;
- ``before3``: QuoteFlow as it was before the catalogue (the merge base with
  ``main``, or ``BENCH_BEFORE_REF``), with the same flags: with no file the
  catalogue must cost nothing, so ``qf3 ÷ before3`` should be 1.

For each run: answers (200) per second and CPU milliseconds per answer of the
contender's own process. Ratios are taken within a block, then the median.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.procs import BenchError, Service, free_port, http, start, stop
from bench.report import median_text
from bench.stats import ratio, spread
from bench.wrk import run_wrk

if TYPE_CHECKING:
    from bench.core import Bench

SEVEN = ("atlas", "boreal", "cedar", "dune", "elm", "fjord", "glen")
CONTENDERS = ("qf7", "bare7", "bare3", "qf3", "before3")
"""In this order so that each pair compared runs side by side."""
PAIRS = (("qf7", "bare7"), ("qf3", "bare3"), ("qf3", "before3"))
ROOT = Path(__file__).resolve().parent.parent


def before_tree(into: Path) -> Path | None:
    """The ``quoteflow`` package as it was before this branch, extracted under ``into``.

    ``BENCH_BEFORE_REF`` names the commit; by default the merge base of HEAD and
    ``main``. ``None`` when git cannot say (a tarball, no ``main``).
    """
    ref = os.environ.get("BENCH_BEFORE_REF")
    try:
        if not ref:
            ref = subprocess.run(
                ["git", "-C", str(ROOT), "merge-base", "HEAD", "main"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref, "quoteflow"],
            capture_output=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into


def _quoteflow(bench: Bench, name: str, *flags: str, cwd: Path = ROOT) -> Service:
    port = free_port()
    limits = bench.limits
    return start(
        name,
        [
            *(sys.executable, "-m", "quoteflow", "--host", "127.0.0.1", "--port", str(port)),
            *("--budget", str(limits.budget_s), "--inbound-limit", str(limits.inbound)),
            *("--outbound-limit", str(limits.outbound)),
            *flags,
            *bench.options.quoteflow_args,
        ],
        port,
        bench.log_dir,
        cwd=cwd,
    )


def _bare(bench: Bench, name: str, lab_url: str, names: tuple[str, ...]) -> Service:
    port = free_port()
    return start(
        name,
        [
            *(sys.executable, "-m", "bench.bare_fanout", "--port", str(port)),
            *("--provider-url", lab_url, "--names", ",".join(names)),
            *bench.options.bare_args,
        ],
        port,
        bench.log_dir,
        cwd=ROOT,
    )


def settle(lab: Service, within_s: float = 10.0) -> None:
    """Until the lab has nothing in flight twice in a row."""
    end = time.monotonic() + within_s
    idle = 0
    while idle < 2 and time.monotonic() < end:
        status, _, body = http("GET", lab.url + "/stats")
        idle = idle + 1 if status == 200 and body["active"] == 0 else 0
        time.sleep(0.1)


def measured_run(
    wrk: str,
    service: Service,
    *,
    contender: str,
    index: int,
    connections: int,
    duration_s: float,
    out_dir: Path,
    section: str,
) -> dict[str, Any]:
    """One wrk run at saturate: answers a second and the service's CPU ms per answer."""
    cpu0 = service.cpu()
    run = run_wrk(
        wrk,
        service.url,
        connections=connections,
        duration_s=duration_s,
        scenario="normal",
        out_dir=out_dir,
        tag=f"{section}-{index}-{contender}",
    )
    cpu = service.cpu() - cpu0
    n200 = run.statuses.get(200, 0)
    record = {
        "contender": contender,
        "index": index,
        "rate_200": run.rate(200),
        "statuses": {str(k): v for k, v in sorted(run.statuses.items())},
        "cpu_ms_per_200": 1000 * cpu / n200 if n200 else None,
    }
    per = record["cpu_ms_per_200"]
    print(
        f"  {section} {contender:<10}{record['rate_200']:9.1f} 200/s  "
        f"cpu {'–' if per is None else f'{per:.3f}'} ms per 200",
        flush=True,
    )
    return record


def run_order(rounds: int) -> list[str]:
    """Blocks of A B C D E E D C B A."""
    return [name for _ in range(rounds) for name in (*CONTENDERS, *reversed(CONTENDERS))]


def run_catalogue(bench: Bench) -> dict[str, Any]:
    """Start the lab and the contenders, run every block, stop them all."""
    services: dict[str, Service] = {}
    scratch = Path(tempfile.mkdtemp(prefix="bench-catalogue-"))
    try:
        lab_port = free_port()
        services["lab"] = lab = start(
            "lab7",
            [
                sys.executable,
                "-m",
                "provider_lab",
                "--port",
                str(lab_port),
                "--names",
                ",".join(SEVEN),
            ],
            lab_port,
            bench.log_dir,
            cwd=ROOT,
        )
        catalogue = scratch / "suppliers7.toml"
        catalogue.write_text(
            "".join(
                f'[[supplier]]\nname = "{name}"\nurl = "{lab.url}/quotes/{name}"\n\n'
                for name in SEVEN
            )
        )
        services["qf7"] = _quoteflow(bench, "qf7", "--suppliers", str(catalogue))
        services["qf3"] = _quoteflow(bench, "qf3", "--provider-url", lab.url)
        services["bare7"] = _bare(bench, "bare7", lab.url, SEVEN)
        services["bare3"] = _bare(bench, "bare3", lab.url, SEVEN[:3])
        before = before_tree(scratch / "before")
        if before is None:
            raise BenchError("catalogue: no commit to compare with (set BENCH_BEFORE_REF)")
        # Run from the extracted tree: its quoteflow package comes first on sys.path.
        services["before3"] = _quoteflow(bench, "before3", "--provider-url", lab.url, cwd=before)
        for name in CONTENDERS:
            run_wrk(
                bench.wrk,
                services[name].url,
                connections=bench.limits.inbound,
                duration_s=bench.options.warmup_s,
                scenario="normal",
                out_dir=bench.raw_dir,
                tag=f"warmup-{name}",
            )
        runs = []
        for index, name in enumerate(run_order(bench.options.rounds)):
            settle(lab)
            service = services[name]
            runs.append(
                measured_run(
                    bench.wrk,
                    service,
                    contender=name,
                    index=index,
                    connections=bench.limits.inbound,
                    duration_s=bench.options.duration_s,
                    out_dir=bench.raw_dir,
                    section="catalogue",
                )
            )
        _, _, answer = http("POST", services["qf7"].url + "/api/quotes", {"quantity": 1})
        seven = isinstance(answer, dict) and len(answer.get("quotes", [])) + len(
            answer.get("failures", [])
        ) == len(SEVEN)
    finally:
        for service in services.values():
            stop(service)
        shutil.rmtree(scratch, ignore_errors=True)
    return {"runs": runs, "qf7_asks_seven": seven}


def summarize(section: dict[str, Any]) -> dict[str, Any]:
    """Medians per contender, and each pair's ratios within a block, then their median."""
    runs = section["runs"]
    medians = {
        name: {
            "rate_200": spread(r["rate_200"] for r in runs if r["contender"] == name),
            "cpu_ms_per_200": spread(r["cpu_ms_per_200"] for r in runs if r["contender"] == name),
        }
        for name in CONTENDERS
    }
    size = 2 * len(CONTENDERS)
    blocks = [runs[i : i + size] for i in range(0, len(runs), size)]
    pairs: dict[str, Any] = {}
    for top, bottom in PAIRS:
        throughput, cpu = [], []
        for block in blocks:
            for half in (block[: len(CONTENDERS)], block[len(CONTENDERS) :]):
                found = {r["contender"]: r for r in half}
                if top in found and bottom in found:
                    throughput.append(ratio(found[top]["rate_200"], found[bottom]["rate_200"]))
                    cpu.append(ratio(found[top]["cpu_ms_per_200"], found[bottom]["cpu_ms_per_200"]))
        pairs[f"{top}/{bottom}"] = {"throughput": spread(throughput), "cpu": spread(cpu)}
    return {"medians": medians, "ratios": pairs, "qf7_asks_seven": section["qf7_asks_seven"]}


def table(summary: dict[str, Any]) -> str:
    """The section's lines for the report."""
    lines = ["", "catalogue (saturate)     throughput ratio   CPU per 200 ratio"]
    for pair, found in summary["ratios"].items():
        tp, cpu = (median_text(found[key]) for key in ("throughput", "cpu"))
        lines.append(f"  {pair:<22} {tp:>10}   {cpu:>12}")
    return "\n".join(lines)
