"""Issue 50's hosts figure: two gunicorn masters of 2 workers against one master of 4.

The same four workers, the same Redis, the same lab: once as one host (one
master, ``--workers 4``), once as two (two masters of ``--workers 2`` on one
Redis, as two machines behind a load balancer would be, here on one). Each is
driven by wrk at saturate (connections = the inbound limit × 4 workers; the
two-host case splits them between the masters, as a balancer would), in
blocks of one two two one (and the mirror), so a noisy neighbour hurts both
alike. Per run: answered requests a second (200s) and CPU per 200 — every
process of the deployment, its Redis included — and the ratio two ÷ one per
block; the median over the blocks is the figure. The lab answers at once
(``--latency-ms 0``) or late (``--latency-ms 400``: real suppliers).

    python -m bench.hosts [--latency-ms 0] [--blocks 3] [--duration 5]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.fleet import find_redis, redis_call
from bench.procs import HOST, Service, children, cpu_seconds, free_port, http, start, stop
from bench.wrk import find_wrk, run_wrk

INBOUND = 8
OUTBOUND = 12
ORDERS = (("one", "two", "two", "one"), ("two", "one", "one", "two"))


def start_master(name: str, workers: int, lab: str, redis_url: str, log_dir: Path) -> Service:
    """QuoteFlow under gunicorn: ``workers`` workers on the fleet's Redis."""
    port = free_port()
    env = {
        "QUOTEFLOW_PROVIDER_URL": lab,
        "QUOTEFLOW_REDIS_URL": redis_url,
        "QUOTEFLOW_INBOUND_LIMIT": str(INBOUND),
        "QUOTEFLOW_OUTBOUND_LIMIT": str(OUTBOUND),
        "QUOTEFLOW_LOG_LEVEL": "warning",
    }
    argv = [sys.executable, "-m", "gunicorn", "-c", "python:quoteflow.gunicorn_conf"]
    argv += ["quoteflow.app:gunicorn_app", "--workers", str(workers)]
    argv += ["--bind", f"{HOST}:{port}"]
    service = start(name, argv, port, log_dir, env=env, ready_timeout=30)
    while len(children(service.pid)) != workers:
        time.sleep(0.05)
    return service


def redis_ping(port: int) -> bool:
    try:
        return redis_call(port, "PING", timeout=0.5) == b"PONG"
    except OSError:
        return False


def cpu_of(services: list[Service], redis: Service) -> float:
    pids = [redis.pid]
    for service in services:
        pids += [service.pid, *children(service.pid)]
    return sum(cpu_seconds(pid) for pid in pids)


def drive(
    wrk: str, masters: list[Service], redis: Service, duration: float, out: Path, tag: str
) -> dict[str, Any]:
    """wrk on each master at once (the connections split between them); 200s/s and CPU/200."""
    connections = INBOUND * 4 // len(masters)
    runs: list[Any] = [None] * len(masters)

    def one(index: int) -> None:
        runs[index] = run_wrk(
            wrk,
            masters[index].url,
            connections=connections,
            duration_s=duration,
            scenario="normal",
            out_dir=out,
            tag=f"{tag}-{index}",
        )

    before = cpu_of(masters, redis)
    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(masters))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cpu = cpu_of(masters, redis) - before
    ok = sum(run.statuses.get(200, 0) for run in runs)
    seconds = max(run.duration_s for run in runs)
    return {"rate_200": ok / seconds, "cpu_ms_per_200": 1000 * cpu / ok if ok else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=int, default=0)
    parser.add_argument("--blocks", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    args = parser.parse_args()
    wrk = find_wrk()
    with tempfile.TemporaryDirectory(prefix="quoteflow-hosts-") as directory:
        log_dir = Path(directory)
        started: list[Service] = []
        try:
            lab_port = free_port()
            lab = start(
                "lab",
                [sys.executable, "-m", "provider_lab", "--port", str(lab_port)],
                lab_port,
                log_dir,
            )
            started.append(lab)
            http("PUT", f"{lab.url}/latency", {"ms": args.latency_ms})
            redis_port = free_port()
            redis = Service(
                "redis",
                redis_port,
                subprocess.Popen(
                    [
                        *(find_redis(), "--port", str(redis_port), "--bind", HOST),
                        *("--save", "", "--appendonly", "no", "--dir", directory),
                    ],
                    stdout=subprocess.DEVNULL,
                ),
                log_dir / "redis.log",
            )
            started.append(redis)
            while redis_ping(redis_port) is False:
                time.sleep(0.05)
            # Two fleets on one Redis, apart: db 0 the one host, db 1 the two.
            one_url = f"redis://{HOST}:{redis_port}/0"
            two_url = f"redis://{HOST}:{redis_port}/1"
            one = [start_master("one-host", 4, lab.url, one_url, log_dir)]
            started += one
            two = [start_master(f"host-{i}", 2, lab.url, two_url, log_dir) for i in "ab"]
            started += two
            ratios: dict[str, list[float]] = {"rate_200": [], "cpu_ms_per_200": []}
            for block in range(args.blocks):
                order = (
                    ["one", "two", "two", "one"] if block % 2 == 0 else ["two", "one", "one", "two"]
                )
                got: dict[str, list[dict[str, Any]]] = {"one": [], "two": []}
                for index, which in enumerate(order):
                    masters = one if which == "one" else two
                    run = drive(wrk, masters, redis, args.duration, log_dir, f"{block}-{index}")
                    got[which].append(run)
                    print(f"block {block + 1} {which}: {run}", flush=True)
                for key in ratios:
                    a = statistics.mean(r[key] for r in got["two"])
                    b = statistics.mean(r[key] for r in got["one"])
                    ratios[key].append(a / b)
            for key, values in ratios.items():
                shown = ", ".join(f"{v:.3f}" for v in values)
                print(f"two hosts ÷ one, {key}: median {statistics.median(values):.3f} ({shown})")
        finally:
            for service in reversed(started):
                stop(service, timeout=35)


if __name__ == "__main__":
    main()
