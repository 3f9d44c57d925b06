"""The callers section of ``make bench`` (issue 20): what a caller's quota costs per answer.

Four contenders, each driven at saturate (connections = the inbound limit,
suppliers answering at once) with one caller's key on every request:

- ``single-off``: the benchmark's single QuoteFlow process, no callers;
- ``single-on``: a second one with ``--callers``: one caller with a rate it
  never reaches (``1000000/60s``, so every request is metered and none is
  refused) and as many seats as the inbound limit;
- ``fleet-off`` / ``fleet-on``: the same two under gunicorn with 2 workers and
  a redis-server each (``fleet-on``: one ``EVALSHA`` per request for the rate).

Runs go in blocks of off on on off (every other block mirrored), so a noisy
neighbour hurts each alike; the ratio on ÷ off is taken between neighbours
of the same block and its median reported. CPU per answered request (200) is
the process's own CPU, or, under gunicorn, the master's, every worker's and
redis-server's together. Targets: ≤ 1.1 × single, ≤ 1.15 × fleet.
"""

from __future__ import annotations

import hashlib
import sys
from typing import TYPE_CHECKING, Any

import attrs

from bench import fleet
from bench.procs import HOST, BenchError, Service, free_port, start, stop
from bench.report import Target, _fmt
from bench.stats import ratio, spread
from bench.wrk import run_wrk

if TYPE_CHECKING:
    from bench.core import Bench

KEY = "bench-caller-key-0123456789"
AUTHORIZATION = f"Bearer {KEY}"
RATE = "1000000/60s"
"""Far above what one machine answers: every request is metered, none refused."""
PAIRS = (("single-off", "single-on"), ("fleet-off", "fleet-on"))
TARGETS = {"single": 1.10, "fleet": 1.15}


def callers_file(bench: Bench) -> str:
    """The callers file of the ``on`` contenders: one caller, the key by its digest."""
    path = bench.log_dir / "callers.toml"
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    path.write_text(
        "[[caller]]\n"
        'name = "bench"\n'
        f'key_sha256 = "{digest}"\n'
        f'rate = "{RATE}"\n'
        f"seats = {bench.limits.inbound}\n",
        encoding="utf-8",
    )
    return str(path)


def start_single_on(bench: Bench, path: str) -> Service:
    """A single QuoteFlow process like the benchmark's own, with ``--callers``."""
    port = free_port()
    limits = bench.limits
    return start(
        "quoteflow-callers",
        [
            *(sys.executable, "-m", "quoteflow", "--host", HOST, "--port", str(port)),
            *("--provider-url", bench.lab.url, "--budget", str(limits.budget_s)),
            *("--inbound-limit", str(limits.inbound)),
            *("--outbound-limit", str(limits.outbound)),
            *bench.options.quoteflow_args,
            *("--callers", path),
        ],
        port,
        bench.log_dir,
    )


def start_fleet(bench: Bench, name: str, env: dict[str, str]) -> fleet.Deployment:
    """redis-server, then QuoteFlow under gunicorn on it with ``env`` too."""
    redis = fleet.start_redis(bench)
    try:
        url = f"redis://{HOST}:{redis.port}/0"
        env = {"QUOTEFLOW_REDIS_URL": url, **env}
        return fleet.start_gunicorn(bench, name, bench.lab.url, env, redis)
    except BaseException:
        stop(redis)
        raise


def run_order(rounds: int) -> list[tuple[str, str]]:
    """(pair, contender) in the order they run: blocks of off on on off, mirrored every other."""
    order: list[tuple[str, str]] = []
    for pair in PAIRS:
        for block in range(rounds):
            ahead = list(pair if block % 2 == 0 else reversed(pair))
            order += [(pair[0], c) for c in ahead + ahead[::-1]]
    return order


def run_callers(bench: Bench) -> dict[str, Any]:
    """Start the three extra contenders, run every block, stop them."""
    path = callers_file(bench)
    bench.set_latency(0)
    single_on = start_single_on(bench, path)
    deployments: dict[str, fleet.Deployment] = {}
    try:
        deployments["fleet-off"] = start_fleet(bench, "fleet-off", {})
        deployments["fleet-on"] = start_fleet(bench, "fleet-on", {"QUOTEFLOW_CALLERS_FILE": path})
        urls = {
            "single-off": bench.services["quoteflow"].url,
            "single-on": single_on.url,
            **{name: d.url for name, d in deployments.items()},
        }
        for name, url in urls.items():
            run_wrk(  # warm-up: connections, caches, the fleet's first leases
                bench.wrk,
                url,
                connections=bench.limits.inbound,
                duration_s=bench.options.warmup_s,
                scenario="normal",
                out_dir=bench.raw_dir,
                tag=f"warmup-{name}",
                authorization=AUTHORIZATION,
            )
        runs = []
        for index, (_, contender) in enumerate(run_order(bench.options.rounds)):
            record = one_run(bench, contender, urls[contender], single_on, deployments, index)
            print(progress_line(record), flush=True)
            runs.append(record)
    finally:
        for deployment in deployments.values():
            deployment.stop()
        stop(single_on)
    log = deployments["fleet-on"].gunicorn.log_path.read_text(errors="replace")
    # Any would mean fleet-on ran spells on each worker's own share of the rate.
    downs = log.count('"event":"quota_coordination_down"')
    return {"rate": RATE, "runs": runs, "quota_coordination_down": downs}


def one_run(
    bench: Bench,
    contender: str,
    url: str,
    single_on: Service,
    deployments: dict[str, fleet.Deployment],
    index: int,
) -> dict[str, Any]:
    """Drive one contender once; its CPU (and Redis round trips) around it."""
    deployment = deployments.get(contender)
    single = single_on if contender == "single-on" else bench.services["quoteflow"]

    def cpu_now() -> dict[int, float]:
        return deployment.cpu() if deployment else {single.pid: single.cpu()}

    bench.settle()
    bench.reset_lab()
    redis = deployment.redis if deployment else None
    commands0 = fleet.command_counts(redis.port) if redis else {}
    cpu0 = cpu_now()
    run = run_wrk(
        bench.wrk,
        url,
        connections=bench.limits.inbound,
        duration_s=bench.options.duration_s,
        scenario="normal",
        out_dir=bench.raw_dir,
        tag=f"callers-{index}-{contender}",
        authorization=AUTHORIZATION,
    )
    cpu1 = cpu_now()
    commands1 = fleet.command_counts(redis.port) if redis else {}
    if set(cpu1) != set(cpu0):
        raise BenchError(f"a {contender} process came or went during the run: {cpu0} → {cpu1}")
    total_cpu = sum(cpu1[pid] - cpu0[pid] for pid in cpu1)
    n200 = run.statuses.get(200, 0)
    evalsha = commands1.get("evalsha", 0) - commands0.get("evalsha", 0)
    return {
        "contender": contender,
        "index": index,
        "requests": run.requests,
        "statuses": {str(k): v for k, v in sorted(run.statuses.items())},
        "rate_200": run.rate(200),
        "cpu_s": total_cpu,
        "cpu_ms_per_200": 1000 * total_cpu / n200 if n200 else None,
        "evalsha_per_request": evalsha / run.requests if redis and run.requests else None,
    }


def progress_line(run: dict[str, Any]) -> str:
    """One line per run, printed as it finishes."""
    per = run["cpu_ms_per_200"]
    trips = run["evalsha_per_request"]
    return (
        f"  callers  {run['contender']:<11}{run['rate_200']:9.1f} 200/s  "
        f"cpu {'–' if per is None else f'{per:.3f}'} ms per 200"
        + ("" if trips is None else f"  {trips:.2f} EVALSHA per request")
        + f"  statuses {run['statuses']}"
    )


def summarize(section: dict[str, Any]) -> dict[str, Any]:
    """Medians per contender, and on ÷ off between the neighbouring runs of each block."""
    runs = section["runs"]
    by: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by.setdefault(run["contender"], []).append(run)
    ratios: dict[str, list[float | None]] = {kind: [] for kind in TARGETS}
    # Each block is four runs (off on on off, or its mirror): two on/off pairs.
    for first in range(0, len(runs) - 3, 4):
        block = runs[first : first + 4]
        kind = block[0]["contender"].split("-")[0]
        for a, b in ((block[0], block[1]), (block[2], block[3])):
            on, off = (a, b) if a["contender"].endswith("-on") else (b, a)
            ratios[kind].append(ratio(on["cpu_ms_per_200"], off["cpu_ms_per_200"]))
    return {
        "cpu_ms_per_200": {c: spread(r["cpu_ms_per_200"] for r in rs) for c, rs in by.items()},
        "rate_200": {c: spread(r["rate_200"] for r in rs) for c, rs in by.items()},
        "refused": sum(r["statuses"].get("429", 0) for r in runs),
        "evalsha_per_request": spread(
            r["evalsha_per_request"] for r in by.get("fleet-on", []) if r["evalsha_per_request"]
        ),
        "cpu_ratio": {kind: spread(values) for kind, values in ratios.items()},
        "quota_coordination_down": section.get("quota_coordination_down"),
    }


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The callers rows of the bench's table: quotas on (QuoteFlow's column) | off (beside it)."""
    per = summary["cpu_ms_per_200"]
    rows = []
    for kind, target in TARGETS.items():
        found = summary["cpu_ratio"][kind]
        rows.append(
            Target(
                "callers",
                f"CPU per 200 (ms), {kind}: quotas on | off",
                _fmt(per.get(f"{kind}-on"), 3),
                _fmt(per.get(f"{kind}-off"), 3),
                _fmt(found, 2),
                f"≤ {target} × off (issue 20)",
                None if found is None else found["median"] <= target,
            )
        )
    downs = summary.get("quota_coordination_down")
    rows.append(
        Target(
            "callers",
            "`quota_coordination_down` events in fleet-on",
            "–" if downs is None else str(downs),
            "",
            "",
            "0",
            None if downs is None else downs == 0,
        )
    )
    return [attrs.asdict(row) for row in rows]
