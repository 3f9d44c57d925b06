"""The fleet section of ``make bench`` (issue 12): what fleet mode costs per answered request.

Beside the benchmark's single QuoteFlow process (limits in memory), it starts
a redis-server (persistence off, a port of its own) and two gunicorn
deployments of QuoteFlow with 2 workers each, the same lab behind all:

- ``fleet``: ``QUOTEFLOW_REDIS_URL`` set, the bench's limits held fleet-wide;
- ``split``: no Redis, each worker with half the outbound limit and half each
  share — the static way to keep the same promise to the suppliers with two
  processes. It is the control: what two processes cost on this machine
  before any coordination, so ``fleet ÷ split`` is the price of Redis and the
  leases alone, and ``split ÷ single`` that of the second process.

All three are driven in turn at saturate (connections = the inbound limit,
suppliers answering at once), in blocks of fleet split single single split
fleet (and the mirror), so a noisy neighbour hurts each alike. For each run:

- CPU per answered request (200): the single process's own CPU; for a
  gunicorn deployment, the master's, every worker's and (fleet) redis-server's
  together, all from ``/proc``;
- Redis commands per inbound request (any status), from ``INFO commandstats``
  before and after the run (the bench's own INFO calls left out).

Target: fleet ÷ single ≤ 1.25, as the median over the blocks' triples.

Then, issue 18, the fleet under the goodput run's load with its Redis frozen
(SIGSTOP) for the middle half of a run: the lab's peak in flight over that
run (each worker keeps to its safe share, so at most the outbound limit,
transitions included), and the 200s a second while frozen against the
goodput run with Redis up.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import attrs

from bench.procs import (
    HOST,
    BenchError,
    Service,
    children,
    cpu_seconds,
    find_or_install,
    free_port,
    http,
    start,
    stop,
)
from bench.report import Target, _fmt
from bench.stats import ratio, spread
from bench.workloads import Workload
from bench.wrk import run_wrk
from quoteflow.catalogue import default_catalogue
from quoteflow.config import Settings

if TYPE_CHECKING:
    from bench.core import Bench

FLEET, SPLIT, SINGLE = "fleet", "split", "single"
CONTENDERS = (FLEET, SPLIT, SINGLE)
WORKERS = 2
UVLOOP_WORKER = "aiohttp.GunicornUVLoopWebWorker"
WORKER_CLASSES = {"uvloop": UVLOOP_WORKER, "asyncio": "aiohttp.GunicornWebWorker"}
"""aiohttp's gunicorn worker class for each event loop."""
TARGET = 1.25
"""Issue 12: fleet CPU per answer at most 1.25 × single-process in-memory mode."""


def find_redis() -> str:
    """redis-server's path; installed if we are root on a Debian-like system (like wrk)."""
    return find_or_install("redis-server", "redis-server")


def redis_call(port: int, *command: str, timeout: float = 5.0) -> bytes:
    """One command to redis-server over a plain socket; the reply's payload (RESP 2).

    Enough for PING (a status) and INFO (a bulk string); an error reply raises.
    """
    frame = f"*{len(command)}\r\n" + "".join(f"${len(c)}\r\n{c}\r\n" for c in command)
    with socket.create_connection((HOST, port), timeout=timeout) as sock:
        sock.sendall(frame.encode())
        reader = sock.makefile("rb")
        head = reader.readline().rstrip(b"\r\n")
        if head[:1] == b"-":
            raise BenchError(f"redis {command[0]}: {head[1:].decode(errors='replace')}")
        if head[:1] == b"$":
            return reader.read(int(head[1:]))
        return head[1:]


def command_counts(port: int) -> dict[str, int]:
    """Calls per Redis command so far (``INFO commandstats``)."""
    counts: dict[str, int] = {}
    for line in redis_call(port, "INFO", "commandstats").decode().splitlines():
        name, _, fields = line.partition(":")
        if name.startswith("cmdstat_"):
            stats = dict(field.split("=", 1) for field in fields.split(","))
            counts[name.removeprefix("cmdstat_")] = int(stats["calls"])
    return counts


def flags_to_env(flags: tuple[str, ...]) -> dict[str, str]:
    """QuoteFlow flags (``BENCH_QUOTEFLOW_ARGS``) as the ``QUOTEFLOW_*`` variables of a worker."""
    env: dict[str, str] = {}
    index = 0
    while index < len(flags):
        flag = flags[index]
        if not flag.startswith("--"):
            raise BenchError(f"cannot pass {flag!r} to gunicorn's workers as a variable")
        name, eq, value = flag[2:].partition("=")
        if not eq:
            has_value = index + 1 < len(flags) and not flags[index + 1].startswith("--")
            value = flags[index + 1] if has_value else "1"  # a bare switch is on
            index += 1 if has_value else 0
        env["QUOTEFLOW_" + name.upper().replace("-", "_")] = value
        index += 1
    return env


@attrs.define
class Deployment:
    """A gunicorn master with its workers, and the redis-server they share, if any."""

    gunicorn: Service
    redis: Service | None = None

    @property
    def url(self) -> str:
        """Where the deployment answers."""
        return self.gunicorn.url

    def pids(self) -> dict[str, list[int]]:
        """Process ids by role."""
        return {
            "master": [self.gunicorn.pid],
            "workers": children(self.gunicorn.pid),
            "redis": [self.redis.pid] if self.redis else [],
        }

    def cpu(self) -> dict[int, float]:
        """CPU seconds so far of every process of the deployment, by pid."""
        for service in (self.redis, self.gunicorn):
            if service is not None:
                service.cpu()  # raises if one has died
        return {pid: cpu_seconds(pid) for group in self.pids().values() for pid in group}

    def stop(self) -> None:
        """gunicorn first (Redis' client), then redis-server."""
        stop(self.gunicorn, timeout=35)
        if self.redis is not None:
            stop(self.redis)


def start_redis(bench: Bench) -> Service:
    """A redis-server of the bench's own: a free port, nothing on disk."""
    redis_port = free_port()
    log_path = bench.log_dir / "redis.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            [
                *(find_redis(), "--bind", HOST, "--port", str(redis_port)),
                *("--save", "", "--appendonly", "no"),  # nothing on disk
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    redis = Service("redis", redis_port, process, log_path)
    deadline = time.monotonic() + 10
    while True:
        try:
            if redis_call(redis_port, "PING", timeout=0.5) == b"PONG":
                return redis
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            stop(redis)
            raise BenchError(f"redis-server did not start:\n{redis.log_tail()}")
        time.sleep(0.05)


def start_gunicorn(
    bench: Bench,
    name: str,
    lab_url: str,
    env: dict[str, str],
    redis: Service | None = None,
    *,
    worker_class: str = UVLOOP_WORKER,
    bench_args: bool = True,
) -> Deployment:
    """QuoteFlow under gunicorn with ``WORKERS`` workers: the bench's limits, then ``env``.

    ``worker_class`` chooses the event loop (``WORKER_CLASSES``); ``bench_args``
    False leaves ``BENCH_QUOTEFLOW_ARGS`` out (the slow-suppliers section runs
    QuoteFlow's defaults).
    """
    limits = bench.limits
    env = {
        "QUOTEFLOW_PROVIDER_URL": lab_url,
        "QUOTEFLOW_BUDGET": str(limits.budget_s),
        "QUOTEFLOW_INBOUND_LIMIT": str(limits.inbound),
        "QUOTEFLOW_OUTBOUND_LIMIT": str(limits.outbound),
        **(flags_to_env(bench.options.quoteflow_args) if bench_args else {}),
        **env,
    }
    port = free_port()
    gunicorn = start(
        name,
        [
            *(sys.executable, "-m", "gunicorn", "-c", "python:quoteflow.gunicorn_conf"),
            "quoteflow.app:gunicorn_app",
            *("--worker-class", worker_class),
            *("--workers", str(WORKERS), "--bind", f"{HOST}:{port}"),
        ],
        port,
        bench.log_dir,
        env=env,
    )
    deployment = Deployment(gunicorn, redis)
    deadline = time.monotonic() + 15
    while len(deployment.pids()["workers"]) != WORKERS:
        if time.monotonic() > deadline:
            deployment.stop()
            raise BenchError(f"gunicorn did not start {WORKERS} workers:\n{gunicorn.log_tail()}")
        time.sleep(0.05)
    return deployment


def start_fleet(bench: Bench, lab_url: str) -> Deployment:
    """redis-server, then QuoteFlow under gunicorn with ``QUOTEFLOW_REDIS_URL`` on it."""
    redis = start_redis(bench)
    try:
        url = f"redis://{HOST}:{redis.port}/0"
        return start_gunicorn(bench, FLEET, lab_url, {"QUOTEFLOW_REDIS_URL": url}, redis)
    except BaseException:
        stop(redis)
        raise


def start_split(bench: Bench, lab_url: str) -> Deployment:
    """QuoteFlow under gunicorn without Redis, each worker with 1/WORKERS of every limit."""
    flags = flags_to_env(bench.options.quoteflow_args)
    outbound = int(flags.get("QUOTEFLOW_OUTBOUND_LIMIT", bench.limits.outbound))
    default_share = default_catalogue(Settings(outbound_limit=outbound)).suppliers[0].share
    share = int(flags.get("QUOTEFLOW_SUPPLIER_SHARE", default_share))
    if outbound < WORKERS or share < WORKERS:
        raise BenchError(f"an outbound limit of {outbound} does not split over {WORKERS} workers")
    env = {
        "QUOTEFLOW_OUTBOUND_LIMIT": str(outbound // WORKERS),
        "QUOTEFLOW_SUPPLIER_SHARE": str(share // WORKERS),
    }
    return start_gunicorn(bench, SPLIT, lab_url, env)


def one_run(
    bench: Bench,
    deployments: dict[str, Deployment],
    workload: Workload,
    contender: str,
    index: int,
) -> dict[str, Any]:
    """Drive one contender once; CPU and (the fleet's) Redis commands around it."""
    single = bench.services["quoteflow"]
    deployment = deployments.get(contender)
    redis = deployments[FLEET].redis
    assert redis is not None

    def cpu_now() -> dict[int, float]:
        return deployment.cpu() if deployment else {single.pid: single.cpu()}

    bench.settle()
    bench.reset_lab()
    commands0 = command_counts(redis.port)
    cpu0 = cpu_now()
    run = run_wrk(
        bench.wrk,
        deployment.url if deployment else single.url,
        connections=workload.connections,
        duration_s=bench.options.duration_s,
        scenario=workload.scenario,
        out_dir=bench.raw_dir,
        tag=f"fleet-{index}-{contender}",
    )
    cpu1 = cpu_now()
    commands1 = command_counts(redis.port)
    if set(cpu1) != set(cpu0):
        raise BenchError(f"a {contender} process came or went during the run: {cpu0} → {cpu1}")
    cpu = {pid: cpu1[pid] - cpu0[pid] for pid in cpu1}
    redis_cpu = sum(cpu.get(pid, 0.0) for pid in deployment.pids()["redis"]) if deployment else 0
    calls = {
        name: count - commands0.get(name, 0)
        for name, count in commands1.items()
        if name != "info" and count != commands0.get(name, 0)
    }
    n200 = run.statuses.get(200, 0)
    total_cpu = sum(cpu.values())
    return {
        "contender": contender,
        "index": index,
        "duration_s": run.duration_s,
        "requests": run.requests,
        "statuses": {str(k): v for k, v in sorted(run.statuses.items())},
        "rate_200": run.rate(200),
        "cpu_s": total_cpu,
        "redis_cpu_s": redis_cpu,
        "cpu_ms_per_200": 1000 * total_cpu / n200 if n200 else None,
        "redis_calls": calls,
        "redis_calls_per_request": sum(calls.values()) / run.requests if run.requests else None,
        # INFO commandstats also counts the commands a script runs: the round
        # trips are the EVALSHAs (and EVALs, when a script is loaded again).
        "round_trips_per_request": (
            (calls.get("evalsha", 0) + calls.get("eval", 0)) / run.requests
            if run.requests
            else None
        ),
    }


def goodput_run(bench: Bench, fleet: Deployment) -> dict[str, Any]:
    """Issue 12: 50 ms suppliers, 4 × the inbound limit spread over the fleet's workers.

    The outbound limit allows limit ÷ (3 × 50 ms) answers a second (40 with 6
    slots); capacity stranded in one worker would cut that, so the fleet must
    reach 90 % of it, as the single process does under ``overload``.
    """
    latency_ms = 50
    bench.set_latency(latency_ms)
    bench.settle()
    run = run_wrk(
        bench.wrk,
        fleet.url,
        connections=4 * bench.limits.inbound,
        duration_s=bench.options.duration_s,
        scenario="normal",
        out_dir=bench.raw_dir,
        tag="fleet-goodput",
    )
    bench.set_latency(0)
    return {
        "latency_ms": latency_ms,
        "rate_200": run.rate(200),
        "allowed": bench.limits.allowed_goodput(latency_ms),
        "statuses": {str(k): v for k, v in sorted(run.statuses.items())},
    }


def frozen_run(bench: Bench, fleet: Deployment) -> dict[str, Any]:
    """Issue 18: the goodput run's load, Redis frozen (SIGSTOP) from ¼ to ¾ of the run.

    The lab's statistics are zeroed before the run, so its ``max_active``
    is the peak over the whole run: while frozen, and the switches to the
    safe share and back. Goodput while frozen is read from wrk's timeline
    (200s per 100 ms of the monotonic clock, ``post.lua``).
    """
    redis = fleet.redis
    assert redis is not None
    latency_ms = 50
    duration_s = max(2.0, round(2 * bench.options.duration_s))
    bench.set_latency(latency_ms)
    bench.settle()
    bench.reset_lab()
    moments: dict[str, float] = {}

    def freeze() -> None:
        os.kill(redis.pid, signal.SIGSTOP)
        moments["frozen"] = time.monotonic()

    def thaw() -> None:
        if "frozen" in moments and "thawed" not in moments:
            os.kill(redis.pid, signal.SIGCONT)
            moments["thawed"] = time.monotonic()

    timers = [
        threading.Timer(duration_s / 4, freeze),
        threading.Timer(3 * duration_s / 4, thaw),
    ]
    for timer in timers:
        timer.start()
    try:
        run = run_wrk(
            bench.wrk,
            fleet.url,
            connections=4 * bench.limits.inbound,
            duration_s=duration_s,
            scenario="normal",
            out_dir=bench.raw_dir,
            tag="fleet-frozen",
            timeline=True,
        )
    finally:
        for timer in timers:
            timer.cancel()
        thaw()  # never leave the fleet's Redis stopped
    bench.settle()
    status, _, stats = http("GET", bench.lab.url + "/stats")
    if status != 200:
        raise BenchError(f"lab /stats answered {status}")
    bench.set_latency(0)
    # Whole 100 ms slots inside the frozen spell only.
    first = int(moments["frozen"] * 10) + 1
    last = int(moments["thawed"] * 10) - 1
    slots = [run.timeline.get(slot, {}).get("n", 0) for slot in range(first, last)]
    return {
        "latency_ms": latency_ms,
        "frozen_s": round(moments["thawed"] - moments["frozen"], 3),
        "max_active": stats["max_active"],
        "limit": bench.limits.outbound,
        "rate_200_frozen": sum(slots) / (len(slots) / 10) if slots else None,
        "statuses": {str(k): v for k, v in sorted(run.statuses.items())},
    }


def run_order(rounds: int) -> list[str]:
    """Contenders in the order they run: blocks of A B C C B A, every other block mirrored."""
    order: list[str] = []
    for block in range(rounds):
        ahead = list(CONTENDERS if block % 2 == 0 else reversed(CONTENDERS))
        order += ahead + ahead[::-1]
    return order


def run_fleet(bench: Bench) -> dict[str, Any]:
    """Start both deployments, run every block, check the fleet still answers, stop them."""
    limits = bench.limits
    workload = Workload(
        "fleet",
        f"saturate: fleet ({WORKERS} gunicorn workers + redis-server), split ({WORKERS} workers,"
        " limits divided, no Redis) and the single process",
        connections=limits.inbound,
        latency_ms=0,
        rounds=bench.options.rounds,
        contenders=CONTENDERS,
    )
    bench.set_latency(0)
    deployments: dict[str, Deployment] = {}
    try:
        deployments[FLEET] = start_fleet(bench, bench.lab.url)
        deployments[SPLIT] = start_split(bench, bench.lab.url)
        for name, deployment in deployments.items():
            run_wrk(  # warm-up: connections, caches, the fleet's first leases
                bench.wrk,
                deployment.url,
                connections=limits.inbound,
                duration_s=bench.options.warmup_s,
                scenario="normal",
                out_dir=bench.raw_dir,
                tag=f"warmup-{name}",
            )
        runs = []
        for index, contender in enumerate(run_order(workload.rounds)):
            record = one_run(bench, deployments, workload, contender, index)
            print(progress_line(record), flush=True)
            runs.append(record)
        fleet = deployments[FLEET]
        goodput = goodput_run(bench, fleet)
        print(f"  fleet    goodput   {goodput['rate_200']:9.1f} 200/s at 50 ms", flush=True)
        # Counted before the frozen run, which falls back on purpose.
        downs = coordination_downs(fleet)
        frozen = frozen_run(bench, fleet)
        print(
            f"  fleet    frozen    {frozen['rate_200_frozen'] or 0:9.1f} 200/s at 50 ms, "
            f"lab peak {frozen['max_active']} in flight (limit {frozen['limit']})",
            flush=True,
        )
        time.sleep(2.0)  # back to leases (within 2 s of Redis answering)
        bench.settle()
        answers = http("POST", fleet.url + "/api/quotes", {"sku": "KB-001", "quantity": 1})
        body = answers[2] if isinstance(answers[2], dict) else {}
        still = answers[0] == 200 and len(body.get("quotes", [])) == 3
    finally:
        for deployment in deployments.values():
            deployment.stop()
    return {
        "workload": attrs.asdict(workload),
        "runs": runs,
        "goodput": goodput,
        "frozen": frozen,
        "fleet_still_answers": still,
        "coordination_down": downs,
    }


def coordination_downs(fleet: Deployment) -> int:
    """``coordination_down`` events the fleet's workers logged: fallbacks to the safe share.

    Any would mean the figures include spells of each worker on its own safe
    share (the outbound limit ÷ ``WORKERS``, not leases), e.g. a redis-server
    starved of CPU by the load on this very machine for longer than
    ``--redis-timeout``.
    """
    text = fleet.gunicorn.log_path.read_text(errors="replace")
    return text.count('"event":"coordination_down"')


def progress_line(run: dict[str, Any]) -> str:
    """One line per run, printed as it finishes."""
    per = run["cpu_ms_per_200"]
    calls = run["redis_calls_per_request"]
    return (
        f"  fleet    {run['contender']:<10}{run['rate_200']:9.1f} 200/s  "
        f"cpu {'–' if per is None else f'{per:.3f}'} ms per 200  "
        f"redis {'–' if calls is None else f'{calls:.2f}'} commands per request"
    )


def summarize(section: dict[str, Any], overload: dict[str, Any] | None = None) -> dict[str, Any]:
    """Medians per contender, and the CPU ratios per triple of neighbouring runs.

    ``overload``: the single process's summary of the ``overload`` workload in
    the same bench run, if it ran: its goodput (same 50 ms suppliers, same 32
    connections) is the fleet goodput's neighbour in the table.
    """
    runs = section["runs"]
    by: dict[str, list[dict[str, Any]]] = {c: [] for c in CONTENDERS}
    for run in runs:
        by[run["contender"]].append(run)
    names = ("fleet/single", "fleet/split", "split/single")
    ratios: dict[str, list[float | None]] = {name: [] for name in names}
    width = len(CONTENDERS)
    for first in range(0, len(runs) - width + 1, width):
        triple = {run["contender"]: run["cpu_ms_per_200"] for run in runs[first : first + width]}
        if set(triple) == set(CONTENDERS):
            for name in ratios:
                top, bottom = name.split("/")
                ratios[name].append(ratio(triple[top], triple[bottom]))
    return {
        "cpu_ms_per_200": {c: spread(r["cpu_ms_per_200"] for r in by[c]) for c in by},
        "rate_200": {c: spread(r["rate_200"] for r in by[c]) for c in by},
        "redis_cpu_share": spread(r["redis_cpu_s"] / r["cpu_s"] for r in by[FLEET] if r["cpu_s"]),
        "redis_calls_per_request": spread(r["redis_calls_per_request"] for r in by[FLEET]),
        "round_trips_per_request": spread(r["round_trips_per_request"] for r in by[FLEET]),
        "goodput": section.get("goodput"),
        "frozen": section.get("frozen"),
        "single_goodput": (overload or {}).get("rate_200"),
        "cpu_ratio": spread(ratios["fleet/single"]),
        "cpu_ratio_split": spread(ratios["fleet/split"]),
        "split_ratio": spread(ratios["split/single"]),
        "still_answers": section["fleet_still_answers"],
        "coordination_down": section.get("coordination_down"),
    }


def _cpu_row(summary: dict[str, Any], top: str, bottom: str, key: str, note: str = "") -> Target:
    """CPU per answer of two contenders and their ratio, reported without a target."""
    per = summary["cpu_ms_per_200"]
    return Target(
        "fleet",
        f"CPU per 200 (ms): {top} | {bottom}{note}",
        _fmt(per[top], 3),
        _fmt(per[bottom], 3),
        _fmt(summary.get(key), 2),
        "",
        None,
    )


def _figure(metric: str, fleet: str) -> Target:
    """A fleet figure reported without a target."""
    return Target("fleet", metric, fleet, "", "", "", None)


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The fleet rows of the bench's table (columns: fleet where QuoteFlow is, single beside it)."""

    cpu_ratio = summary["cpu_ratio"]
    goodput = summary.get("goodput")
    good_rows = []
    if goodput:
        wanted = 0.9 * goodput["allowed"]
        single = summary.get("single_goodput")
        good_rows.append(
            Target(
                "fleet",
                f"goodput at {goodput['latency_ms']} ms suppliers (200/s): fleet | single",
                f"{goodput['rate_200']:.1f}",
                _fmt(single) if single else "",
                f"{goodput['rate_200'] / single['median']:.2f}" if single else "",
                f"≥ {wanted:.1f} (90 % of {goodput['allowed']:.1f}, issue 12)",
                goodput["rate_200"] >= wanted,
            )
        )
    frozen = summary.get("frozen")
    if frozen:
        good_rows.append(
            Target(
                "fleet",
                f"lab's peak in flight, Redis frozen (SIGSTOP) {frozen['frozen_s']:.1f} s"
                f" mid-run, {frozen['latency_ms']} ms suppliers",
                str(frozen["max_active"]),
                "",
                "",
                f"≤ {frozen['limit']} (the limit; issue 18)",
                frozen["max_active"] <= frozen["limit"],
            )
        )
        rate = frozen.get("rate_200_frozen")
        if goodput and rate is not None:
            up = goodput["rate_200"]
            good_rows.append(
                Target(
                    "fleet",
                    "goodput (200/s): Redis frozen | up (the goodput run)",
                    f"{rate:.1f}",
                    f"{up:.1f}",
                    f"{rate / up:.2f}" if up else "",
                    "≥ 0.8 × up (issue 18)",
                    bool(up) and rate >= 0.8 * up,
                )
            )
    return [
        attrs.asdict(row)
        for row in (
            Target(
                "fleet",
                "CPU per 200 (ms): fleet | single",
                _fmt(summary["cpu_ms_per_200"][FLEET], 3),
                _fmt(summary["cpu_ms_per_200"][SINGLE], 3),
                _fmt(cpu_ratio, 2),
                f"≤ {TARGET} × single (issue 12)",
                None if cpu_ratio is None else cpu_ratio["median"] <= TARGET,
            ),
            _cpu_row(summary, FLEET, SPLIT, "cpu_ratio_split", " (no Redis, limits halved)"),
            _cpu_row(summary, SPLIT, SINGLE, "split_ratio"),
            Target(
                "fleet",
                "throughput (200/s): fleet | single",
                _fmt(summary["rate_200"][FLEET]),
                _fmt(summary["rate_200"][SINGLE]),
                "",
                "",
                None,
            ),
            _figure("throughput (200/s): split", _fmt(summary["rate_200"][SPLIT])),
            _figure(
                "Redis round trips (EVALSHA) per inbound request",
                _fmt(summary["round_trips_per_request"], 3),
            ),
            _figure(
                "Redis commands per inbound request (also those a script runs)",
                _fmt(summary["redis_calls_per_request"], 3),
            ),
            _figure(
                "redis-server's share of the fleet's CPU",
                _fmt(summary["redis_cpu_share"], 1, 100, " %"),
            ),
            *good_rows,
            Target(
                "fleet",
                "coordination_down events before the frozen run (fallbacks to the safe share)",
                str(summary.get("coordination_down")),
                "",
                "",
                "0: the figures are fleet mode's",
                summary.get("coordination_down") == 0,
            ),
            Target(
                "fleet",
                "all 3 quotes afterwards",
                "1/1" if summary["still_answers"] else "0/1",
                "",
                "",
                "all",
                bool(summary["still_answers"]),
            ),
        )
    ]
