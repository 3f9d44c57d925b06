"""``python -m bench.versus REV``: this work tree's QuoteFlow against ``REV``'s, side by side.

What a change costs on the request path, measured so that a noisy neighbour
hurts both alike: ``REV``'s code is exported (``git archive``) to a temporary
directory, both QuoteFlows start beside one provider lab, and wrk drives them
in turn at saturate (connections = the inbound limit, suppliers answering at
once) in blocks of A B B A, every other block mirrored. Printed per run:
answers a second and QuoteFlow's CPU per answer; at the end, after ÷ before
per block and their medians. CPU per answer moves much less with the
neighbours than throughput does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from bench.procs import Service, cpu_seconds, free_port, start, stop
from bench.workloads import Limits
from bench.wrk import find_wrk, run_wrk

ROOT = Path(__file__).resolve().parent.parent
BEFORE, AFTER = "before", "after"


def export(rev: str, into: Path) -> Path:
    """``rev``'s files, unpacked under ``into``."""
    archive = into / "rev.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), rev], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into / "tree", filter="data")
    return into / "tree"


def quoteflow(name: str, root: Path, lab_url: str, logs: Path) -> Service:
    """``python -m quoteflow`` importing the code under ``root`` (its working directory)."""
    port = free_port()
    argv = [sys.executable, "-m", "quoteflow", "--port", str(port), "--provider-url", lab_url]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}
    return start(name, [*argv, "--log-level", "warning"], port, logs, cwd=root, env=env)


def set_latency(lab_url: str, ms: int) -> None:
    """Have every supplier of the lab answer after ``ms`` milliseconds."""
    body = json.dumps({"ms": ms}).encode()
    request = urllib.request.Request(f"{lab_url}/latency", data=body, method="PUT")
    with urllib.request.urlopen(request, timeout=5) as answer:
        answer.read()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the blocks; print each run and the ratios."""
    parser = argparse.ArgumentParser(prog="python -m bench.versus", description=__doc__)
    parser.add_argument("rev", help="the commit to compare against, e.g. main")
    parser.add_argument("--rounds", type=int, default=4, help="A B B A blocks (4)")
    parser.add_argument("--duration", type=float, default=3.0, help="seconds per wrk run (3)")
    parser.add_argument(
        "--latency-ms",
        type=int,
        default=0,
        help="every lab supplier answers after this long (0: at once); e.g. 400 for real ones",
    )
    args = parser.parse_args(argv)
    connections = Limits().inbound
    with tempfile.TemporaryDirectory(prefix="quoteflow-versus-") as scratch:
        work = Path(scratch)
        trees = {BEFORE: export(args.rev, work), AFTER: ROOT}
        lab_port = free_port()
        lab_argv = [sys.executable, "-m", "provider_lab", "--port", str(lab_port)]
        lab = start("lab", lab_argv, lab_port, work, cwd=ROOT)
        if args.latency_ms:
            set_latency(lab.url, args.latency_ms)
        services = {name: quoteflow(name, tree, lab.url, work) for name, tree in trees.items()}
        wrk = find_wrk()
        try:
            for name, service in services.items():  # warm-up: connections, caches
                run_wrk(
                    wrk,
                    service.url,
                    connections=connections,
                    duration_s=1,
                    scenario="normal",
                    out_dir=work,
                    tag=f"warm-{name}",
                )
            rate: dict[str, list[float]] = {BEFORE: [], AFTER: []}
            cpu: dict[str, list[float]] = {BEFORE: [], AFTER: []}
            for block in range(args.rounds):
                order = [BEFORE, AFTER] if block % 2 == 0 else [AFTER, BEFORE]
                for index, name in enumerate(order + order[::-1]):
                    service = services[name]
                    used = cpu_seconds(service.pid)
                    run = run_wrk(
                        wrk,
                        service.url,
                        connections=connections,
                        duration_s=args.duration,
                        scenario="normal",
                        out_dir=work,
                        tag=f"{block}-{index}-{name}",
                    )
                    answers = run.statuses.get(200, 0)
                    rate[name].append(run.rate(200))
                    cpu[name].append(1000 * (cpu_seconds(service.pid) - used) / max(answers, 1))
                    print(
                        f"{name:<7}{rate[name][-1]:9.1f} 200/s  {cpu[name][-1]:.3f} ms CPU per 200",
                        flush=True,
                    )
        finally:
            for service in (*services.values(), lab):
                stop(service)
    for label, values in (("throughput", rate), ("CPU per 200", cpu)):
        blocks = [
            sum(values[AFTER][k : k + 2]) / sum(values[BEFORE][k : k + 2])
            for k in range(0, len(values[AFTER]), 2)
        ]
        shown = ", ".join(f"{ratio:.3f}" for ratio in blocks)
        print(f"{label} after ÷ before per block: {shown}; median {statistics.median(blocks):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
