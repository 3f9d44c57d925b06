"""The supplier-contracts section of ``make bench`` (issue 30): what an outbound rate costs.

A lab of its own (atlas, boreal, cedar answering at once), and QuoteFlow
against it at saturate (connections = the inbound limit) with three
catalogues of the same three suppliers:

- ``none``: no ``rate`` on any supplier;
- ``unreached``: ``rate = "1000000/1s"`` on every supplier, far above what
  the workload sends, so every attempt is metered and none waits or is
  refused: what the rate costs when it is far from the limit;
- ``reached``: ``rate = "200/1s"`` on every supplier, which the workload
  does reach: attempts wait for their turn or answer ``rate_limited``.

Each as a single process and as a fleet (2 gunicorn workers on a
redis-server of their own, as ``bench/fleet.py`` starts them), in blocks of
unreached none reached reached none unreached (every other block mirrored),
so that a noisy neighbour hurts each alike. For each run: CPU milliseconds
per answer (200) of QuoteFlow's own processes (the single process; the
gunicorn master and its workers, summed), redis-server's apart; the share
of answers in which each supplier's code is ``rate_limited`` (wrk reads the
bodies, ``post.lua``'s ``BENCH_CODES``); what the lab was sent per supplier
a second; Redis round trips (``EVALSHA``) per request.

The headline figures are ``unreached ÷ none`` in CPU per answer, as ratios
within a half-block and then their median, single and fleet: a rate the
workload never reaches must be nearly free (target ≤ 1.1 for both).
``reached ÷ none`` and the ``rate_limited`` shares are reported.

Last, the lab holds atlas to 20 calls a second (``PUT /contracts/atlas``:
``429`` with ``Retry-After`` past it) and each mode is driven with a
catalogue giving atlas ``rate = "19/1s"`` (a call under, as
docs/suppliers.md advises), ``"20/1s"`` (the lab's own figure) and none: the
lab's ``rate_refused`` for atlas, 0 a call under (issue 30's target), what
arrival jitter costs at the same figure, and what QuoteFlow's 429 pauses
alone leave without a rate.

Standalone: ``python -m bench.contracts [--rounds 3] [--duration 4] [--latency-ms 0]``
(``--latency-ms 400``: the same with suppliers that take 400 ms).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from bench import fleet
from bench.catalogue import settle
from bench.procs import HOST, BenchError, Service, free_port, http, start, stop
from bench.report import Target, _fmt, median_text, reported, target_line
from bench.stats import ratio, spread
from bench.wrk import find_wrk, run_wrk

if TYPE_CHECKING:
    from bench.core import Bench

NAME = "supplier_contracts"
THREE = ("atlas", "boreal", "cedar")
MODES = ("single", "fleet")
UNREACHED = "1000000/1s"
"""Far above what one machine answers: every attempt metered, none waits."""
REACHED = "200/1s"
"""Per supplier, below what saturate sends (hundreds of answers a second)."""
LAB_RATE = "20/1s"
UNDER_LAB_RATE = "19/1s"
"""A call under the lab's rate, as docs/suppliers.md advises: arrival jitter is then never a 429."""
CONTRACTED = "atlas"
"""The supplier the lab holds to ``LAB_RATE`` in the last runs."""
CONTENDERS = ("unreached", "none", "reached")
"""In this order, so that ``none`` runs beside each of the others."""
RATES: dict[str, str | None] = {"none": None, "unreached": UNREACHED, "reached": REACHED}
PAIRS = (("unreached", "none"), ("reached", "none"))
TARGET = 1.1
"""Issue 30: CPU per answer with a rate never reached at most 1.1 × none, single and fleet."""
MIN_ROUNDS = 3
ROOT = Path(__file__).resolve().parent.parent
Contender = Service | fleet.Deployment


def write_catalogue(path: Path, lab_url: str, rates: dict[str, str | None]) -> Path:
    """A catalogue of the three lab suppliers, each with its ``rate`` from ``rates``, if any."""
    path.write_text(
        "".join(
            f'[[supplier]]\nname = "{name}"\nurl = "{lab_url}/quotes/{name}"\n'
            + (f'rate = "{rates[name]}"\n' if rates.get(name) else "")
            + "\n"
            for name in THREE
        )
    )
    return path


def catalogues(lab_url: str, into: Path) -> dict[str, Path]:
    """One catalogue per contender, ``lab20`` (atlas at the lab's own rate, the others free)
    and ``lab19`` (atlas a call under it)."""
    found = {
        name: write_catalogue(into / f"{name}.toml", lab_url, dict.fromkeys(THREE, rate))
        for name, rate in RATES.items()
    }
    found["lab20"] = write_catalogue(into / "lab20.toml", lab_url, {CONTRACTED: LAB_RATE})
    found["lab19"] = write_catalogue(into / "lab19.toml", lab_url, {CONTRACTED: UNDER_LAB_RATE})
    return found


def _single(bench: Bench, name: str, catalogue: Path) -> Service:
    """One QuoteFlow process with the bench's limits and flags, and ``catalogue``."""
    port = free_port()
    limits = bench.limits
    return start(
        f"contracts-single-{name}",
        [
            *(sys.executable, "-m", "quoteflow", "--host", HOST, "--port", str(port)),
            *("--budget", str(limits.budget_s), "--inbound-limit", str(limits.inbound)),
            *("--outbound-limit", str(limits.outbound), "--suppliers", str(catalogue)),
            *bench.options.quoteflow_args,
        ],
        port,
        bench.log_dir,
        cwd=ROOT,
    )


def _fleet(bench: Bench, name: str, lab_url: str, catalogue: Path) -> fleet.Deployment:
    """redis-server, then 2 gunicorn workers on it with ``catalogue``."""
    redis = fleet.start_redis(bench)
    try:
        env = {
            "QUOTEFLOW_REDIS_URL": f"redis://{HOST}:{redis.port}/0",
            "QUOTEFLOW_SUPPLIERS_FILE": str(catalogue),
        }
        return fleet.start_gunicorn(bench, f"contracts-fleet-{name}", lab_url, env, redis)
    except BaseException:
        stop(redis)
        raise


def _cpu(contender: Contender) -> tuple[dict[int, float], dict[int, float]]:
    """CPU seconds so far of QuoteFlow's own processes, and of redis-server's, by pid."""
    if isinstance(contender, Service):
        return {contender.pid: contender.cpu()}, {}
    every = contender.cpu()
    redis = set(contender.pids()["redis"])
    return (
        {pid: s for pid, s in every.items() if pid not in redis},
        {pid: s for pid, s in every.items() if pid in redis},
    )


def _lab_stats(lab: Service) -> dict[str, Any]:
    status, _, body = http("GET", lab.url + "/stats?summary=1", timeout=30)
    if status != 200 or not isinstance(body, dict):
        raise BenchError(f"lab /stats answered {status}")
    return body


def _reset(lab: Service, within_s: float = 10.0) -> None:
    """Zero the lab's counts (refused while requests are in flight: settle first)."""
    deadline = time.monotonic() + within_s
    while True:
        settle(lab)
        status, _, body = http("POST", lab.url + "/reset")
        if status == 200:
            return
        if time.monotonic() > deadline:
            raise BenchError(f"lab refused to reset: {status} {body}")


def codes_of(inspected: dict[str, float]) -> dict[str, dict[str, int]]:
    """Each supplier's failure codes in the 200s, from ``post.lua``'s ``code <s> <code>``."""
    found: dict[str, dict[str, int]] = {}
    for key, count in inspected.items():
        kind, _, rest = key.partition(" ")
        supplier, _, code = rest.partition(" ")
        if kind == "code" and code:
            found.setdefault(supplier, {})[code] = int(count)
    return found


def one_run(
    bench: Bench,
    lab: Service,
    contender: Contender,
    *,
    mode: str,
    name: str,
    index: int,
    duration_s: float,
) -> dict[str, Any]:
    """Drive one contender once at saturate; its CPU, the codes, what the lab saw."""
    _reset(lab)
    redis = contender.redis if isinstance(contender, fleet.Deployment) else None
    commands0 = fleet.command_counts(redis.port) if redis else {}
    own0, redis0 = _cpu(contender)
    run = run_wrk(
        bench.wrk,
        contender.url,
        connections=bench.limits.inbound,
        duration_s=duration_s,
        scenario="normal",
        out_dir=bench.raw_dir,
        tag=f"contracts-{index}-{mode}-{name}",
        codes=True,
    )
    own1, redis1 = _cpu(contender)
    commands1 = fleet.command_counts(redis.port) if redis else {}
    if set(own1) != set(own0):
        raise BenchError(f"a {mode} {name} process came or went during the run: {own0} → {own1}")
    settle(lab)
    stats = _lab_stats(lab)
    own_cpu = sum(own1[pid] - own0[pid] for pid in own1)
    redis_cpu = sum(redis1[pid] - redis0.get(pid, 0.0) for pid in redis1)
    n200 = run.statuses.get(200, 0)
    codes = codes_of(run.inspected)
    evalsha = commands1.get("evalsha", 0) - commands0.get("evalsha", 0)
    return {
        "mode": mode,
        "contender": name,
        "index": index,
        "duration_s": run.duration_s,
        "requests": run.requests,
        "statuses": {str(k): v for k, v in sorted(run.statuses.items())},
        "rate_200": run.rate(200),
        "cpu_s": own_cpu,
        "cpu_ms_per_200": 1000 * own_cpu / n200 if n200 else None,
        "redis_cpu_s": redis_cpu if redis else None,
        "cpu_ms_per_200_with_redis": (
            1000 * (own_cpu + redis_cpu) / n200 if redis and n200 else None
        ),
        "evalsha_per_request": evalsha / run.requests if redis and run.requests else None,
        "codes": codes,
        "rate_limited_share": {
            s: codes.get(s, {}).get("rate_limited", 0) / n200 if n200 else None for s in THREE
        },
        "lab_sent_per_s": {
            s: stats["per_supplier"].get(s, 0) / run.duration_s if run.duration_s else None
            for s in THREE
        },
        "lab_rate_refused": {s: stats["rate_refused"].get(s, 0) for s in THREE},
    }


def progress_line(run: dict[str, Any]) -> str:
    """One line per run, printed as it finishes."""
    per = run["cpu_ms_per_200"]
    limited = max((v or 0.0) for v in run["rate_limited_share"].values())
    trips = run["evalsha_per_request"]
    return (
        f"  contracts {run['mode']:<6} {run['contender']:<9}{run['rate_200']:9.1f} 200/s  "
        f"cpu {'–' if per is None else f'{per:.3f}'} ms per 200  "
        f"rate_limited ≤ {100 * limited:.1f} %"
        + ("" if trips is None else f"  {trips:.2f} EVALSHA per request")
    )


def run_order(rounds: int) -> list[tuple[str, str]]:
    """(mode, contender): per round a block of each mode, A B C C B A, mirrored every other."""
    order: list[tuple[str, str]] = []
    for block in range(rounds):
        ahead = list(CONTENDERS if block % 2 == 0 else reversed(CONTENDERS))
        for mode in MODES:
            order += [(mode, name) for name in ahead + ahead[::-1]]
    return order


def coordination_downs(deployment: fleet.Deployment) -> int:
    """Fallbacks logged by the workers: slots' ``coordination_down`` and the rates' own."""
    text = deployment.gunicorn.log_path.read_text(errors="replace")
    return text.count('"event":"coordination_down"') + text.count(
        '"event":"quota_coordination_down"'
    )


def lab_rate_runs(
    bench: Bench,
    lab: Service,
    contenders: dict[str, Contender],
    *,
    duration_s: float,
    first_index: int,
) -> list[dict[str, Any]]:
    """The lab holds atlas to ``LAB_RATE``; each mode once with ``lab20``, ``lab19`` and ``none``.

    Before each run the lab and QuoteFlow are left idle for a window and a
    half, so both start with the whole quota.
    """
    status, _, body = http("PUT", f"{lab.url}/contracts/{CONTRACTED}", {"rate": LAB_RATE})
    if status != 200:
        raise BenchError(f"lab refused the contract {LAB_RATE}: {status} {body}")
    runs = []
    try:
        index = first_index
        for mode in MODES:
            for name in ("lab20", "lab19", "none"):
                settle(lab)
                time.sleep(1.5)
                record = one_run(
                    bench,
                    lab,
                    contenders[f"{mode}-{name}"],
                    mode=mode,
                    name=name,
                    index=index,
                    duration_s=duration_s,
                )
                record["lab_contract"] = {CONTRACTED: LAB_RATE}
                refused = record["lab_rate_refused"][CONTRACTED]
                share = record["rate_limited_share"][CONTRACTED] or 0.0
                print(
                    f"  contracts {mode:<6} {name:<9}{record['rate_200']:9.1f} 200/s  "
                    f"lab {CONTRACTED} at {LAB_RATE}: {refused} refused (429), "
                    f"{record['lab_sent_per_s'][CONTRACTED]:.1f} sent/s, "
                    f"{CONTRACTED} rate_limited {100 * share:.1f} %",
                    flush=True,
                )
                runs.append(record)
                index += 1
    finally:
        http("DELETE", f"{lab.url}/contracts/{CONTRACTED}")
    return runs


def measure(bench: Bench, *, rounds: int, duration_s: float, latency_ms: int = 0) -> dict[str, Any]:
    """Start the lab and every contender, run every block and the lab-rate runs, stop them.

    ``latency_ms``: how long the lab takes to answer each call (0: at once).
    """
    contenders: dict[str, Contender] = {}
    services: list[Service] = []
    scratch = Path(tempfile.mkdtemp(prefix="bench-contracts-"))
    try:
        lab_port = free_port()
        lab = start(
            "lab-contracts",
            [sys.executable, "-m", "provider_lab", "--port", str(lab_port)],
            lab_port,
            bench.log_dir,
            cwd=ROOT,
        )
        services.append(lab)
        if latency_ms:
            http("PUT", lab.url + "/latency", {"ms": latency_ms})
        files = catalogues(lab.url, scratch)
        for name, path in files.items():
            contenders[f"single-{name}"] = _single(bench, name, path)
            contenders[f"fleet-{name}"] = _fleet(bench, name, lab.url, path)
        checks = {}
        for key, contender in contenders.items():
            _, _, answer = http("POST", contender.url + "/api/quotes", {"quantity": 1})
            checks[key] = isinstance(answer, dict) and len(answer.get("quotes", [])) == 3
            run_wrk(  # warm-up: connections, caches, the fleet's first leases
                bench.wrk,
                contender.url,
                connections=bench.limits.inbound,
                duration_s=bench.options.warmup_s,
                scenario="normal",
                out_dir=bench.raw_dir,
                tag=f"warmup-contracts-{key}",
                codes=True,
            )
        runs = []
        for index, (mode, name) in enumerate(run_order(rounds)):
            record = one_run(
                bench,
                lab,
                contenders[f"{mode}-{name}"],
                mode=mode,
                name=name,
                index=index,
                duration_s=duration_s,
            )
            print(progress_line(record), flush=True)
            runs.append(record)
        lab_rate = lab_rate_runs(
            bench, lab, contenders, duration_s=duration_s, first_index=len(runs)
        )
        downs = {
            key: coordination_downs(c)
            for key, c in contenders.items()
            if isinstance(c, fleet.Deployment)
        }
    finally:
        for contender in contenders.values():
            if isinstance(contender, fleet.Deployment):
                contender.stop()
            else:
                stop(contender)
        for service in services:
            stop(service)
        shutil.rmtree(scratch, ignore_errors=True)
    return {
        "rates": {
            **RATES,
            "lab20": {CONTRACTED: LAB_RATE},
            "lab19": {CONTRACTED: UNDER_LAB_RATE},
        },
        "lab_rate": LAB_RATE,
        "contracted": CONTRACTED,
        "latency_ms": latency_ms,
        "runs": runs,
        "lab_rate_runs": lab_rate,
        "all_three_quoted": checks,
        "coordination_down": downs,
    }


def run_contracts(bench: Bench) -> dict[str, Any]:
    """The section as ``make bench`` runs it."""
    return measure(
        bench,
        rounds=max(MIN_ROUNDS, bench.options.rounds),
        duration_s=bench.options.duration_s,
    )


def summarize(section: dict[str, Any]) -> dict[str, Any]:
    """Medians per mode and contender; each pair's ratios within a half-block, then the median."""
    summary: dict[str, Any] = {}
    for mode in MODES:
        runs = [r for r in section["runs"] if r["mode"] == mode]

        def per(name: str, key: str, runs: list[dict[str, Any]] = runs) -> Any:
            return spread(r[key] for r in runs if r["contender"] == name)

        medians = {
            name: {
                "rate_200": per(name, "rate_200"),
                "cpu_ms_per_200": per(name, "cpu_ms_per_200"),
                "cpu_ms_per_200_with_redis": per(name, "cpu_ms_per_200_with_redis"),
                "evalsha_per_request": per(name, "evalsha_per_request"),
                "rate_limited_share": {
                    s: spread(r["rate_limited_share"][s] for r in runs if r["contender"] == name)
                    for s in THREE
                },
                "lab_sent_per_s": {
                    s: spread(r["lab_sent_per_s"][s] for r in runs if r["contender"] == name)
                    for s in THREE
                },
                "rate_limited_answers": sum(
                    sum(r["codes"].get(s, {}).get("rate_limited", 0) for s in THREE)
                    for r in runs
                    if r["contender"] == name
                ),
            }
            for name in CONTENDERS
        }
        size = len(CONTENDERS)
        halves = [runs[i : i + size] for i in range(0, len(runs), size)]
        pairs: dict[str, Any] = {}
        for top, bottom in PAIRS:
            found: dict[str, list[float | None]] = {"throughput": [], "cpu": [], "cpu_redis": []}
            for half in halves:
                by = {r["contender"]: r for r in half}
                if top in by and bottom in by:
                    a, b = by[top], by[bottom]
                    found["throughput"].append(ratio(a["rate_200"], b["rate_200"]))
                    found["cpu"].append(ratio(a["cpu_ms_per_200"], b["cpu_ms_per_200"]))
                    found["cpu_redis"].append(
                        ratio(a["cpu_ms_per_200_with_redis"], b["cpu_ms_per_200_with_redis"])
                    )
            pairs[f"{top}/{bottom}"] = {key: spread(values) for key, values in found.items()}
        lab_rate = {
            r["contender"]: {
                "rate_refused": r["lab_rate_refused"][section["contracted"]],
                "sent_per_s": r["lab_sent_per_s"][section["contracted"]],
                "rate_limited_share": r["rate_limited_share"][section["contracted"]],
                "rate_200": r["rate_200"],
            }
            for r in section["lab_rate_runs"]
            if r["mode"] == mode
        }
        summary[mode] = {"medians": medians, "ratios": pairs, "lab_rate": lab_rate}
    summary["lab_rate"] = section["lab_rate"]
    summary["contracted"] = section["contracted"]
    summary["latency_ms"] = section.get("latency_ms", 0)
    summary["all_three_quoted"] = all(section["all_three_quoted"].values())
    summary["coordination_down"] = sum(section["coordination_down"].values())
    return summary


def _shares(found: dict[str, Any]) -> str:
    """Each supplier's median share of answers ``rate_limited``, as percentages."""
    return ", ".join(f"{s} {_fmt(found[s], 1, 100, ' %')}" for s in THREE)


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The section's rows: unreached ÷ none ≤ 1.1 single and fleet, the rest reported."""
    rows = []
    contracted, lab_rate = summary["contracted"], summary["lab_rate"]
    for mode in MODES:
        entry = summary[mode]
        per = entry["medians"]
        found = entry["ratios"]["unreached/none"]["cpu"]
        rows.append(
            Target(
                NAME,
                f"CPU per 200 (ms), {mode}: rate {UNREACHED} (never reached) | none",
                _fmt(per["unreached"]["cpu_ms_per_200"], 3),
                _fmt(per["none"]["cpu_ms_per_200"], 3),
                _fmt(found, 2),
                f"≤ {TARGET} × none (issue 30)",
                None if found is None else found["median"] <= TARGET,
            )
        )
        unreached_limited = per["unreached"]["rate_limited_answers"]
        rows.append(
            Target(
                NAME,
                f"answers with a supplier rate_limited, {mode}: rate {UNREACHED}",
                str(unreached_limited),
                "",
                "",
                "0 (else the rate was reached)",
                unreached_limited == 0,
            )
        )
        reached = entry["ratios"]["reached/none"]["cpu"]
        rows.append(
            reported(
                NAME,
                f"CPU per 200 (ms), {mode}: rate {REACHED} (reached) | none",
                _fmt(per["reached"]["cpu_ms_per_200"], 3),
                _fmt(per["none"]["cpu_ms_per_200"], 3),
                _fmt(reached, 2),
            )
        )
        rows.append(
            reported(
                NAME,
                f"share of answers with the supplier rate_limited, {mode}: rate {REACHED}",
                _shares(per["reached"]["rate_limited_share"]),
            )
        )
        rows.append(
            reported(
                NAME,
                f"lab's calls a second per supplier, {mode}: rate {REACHED}",
                ", ".join(f"{s} {_fmt(per['reached']['lab_sent_per_s'][s])}" for s in THREE),
            )
        )
        if mode == "fleet":
            with_redis = entry["ratios"]["unreached/none"]["cpu_redis"]
            rows.append(
                reported(
                    NAME,
                    f"CPU per 200 (ms) with redis-server, fleet: rate {UNREACHED} | none",
                    _fmt(per["unreached"]["cpu_ms_per_200_with_redis"], 3),
                    _fmt(per["none"]["cpu_ms_per_200_with_redis"], 3),
                    _fmt(with_redis, 2),
                )
            )
            rows.append(
                reported(
                    NAME,
                    f"Redis round trips (EVALSHA) per request, fleet: rate {UNREACHED} | none",
                    _fmt(per["unreached"]["evalsha_per_request"], 3),
                    _fmt(per["none"]["evalsha_per_request"], 3),
                )
            )
        ran = entry["lab_rate"]
        if {"lab20", "lab19", "none"} <= set(ran):
            refused = {name: ran[name]["rate_refused"] for name in ("lab20", "lab19", "none")}
            rows.append(
                Target(
                    NAME,
                    f"lab's 429s for {contracted} held to {lab_rate}, {mode}:"
                    f" catalogue rate {UNDER_LAB_RATE} | none",
                    str(refused["lab19"]),
                    str(refused["none"]),
                    "",
                    "0 a call under the lab's rate (issue 30)",
                    refused["lab19"] == 0,
                )
            )
            rows.append(
                Target(
                    NAME,
                    f"lab's 429s for {contracted} held to {lab_rate}, {mode}:"
                    f" catalogue rate {lab_rate}, the lab's own",
                    str(refused["lab20"]),
                    "",
                    "",
                    "reported (arrival jitter)",
                    None,
                )
            )
    rows.append(
        Target(
            NAME,
            "coordination_down events in the fleets (fallbacks to rate / live workers)",
            str(summary["coordination_down"]),
            "",
            "",
            "0: the figures are fleet mode's",
            summary["coordination_down"] == 0,
        )
    )
    quoted = bool(summary["all_three_quoted"])
    rows.append(
        Target(NAME, "every contender: all three quoted", str(quoted), "", "", "True", quoted)
    )
    return [attrs.asdict(row) for row in rows]


def table(summary: dict[str, Any]) -> str:
    """The section's lines for the report."""
    title = f"supplier contracts (saturate, lab at {summary['latency_ms']} ms)"
    lines = ["", f"{title:<40} throughput ratio   CPU per 200 ratio"]
    for mode in MODES:
        for pair, found in summary[mode]["ratios"].items():
            tp, cpu = (median_text(found[key]) for key in ("throughput", "cpu"))
            lines.append(f"  {mode:<6} {pair:<22} {tp:>10}   {cpu:>12}")
    contracted, lab_rate = summary["contracted"], summary["lab_rate"]
    for mode in MODES:
        ran = summary[mode]["lab_rate"]
        shown = ", ".join(f"{name} {found['rate_refused']}" for name, found in ran.items())
        lines.append(f"  {mode:<6} lab's 429s for {contracted} at {lab_rate}: {shown}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    from bench.core import Bench, parse_options
    from bench.workloads import Limits

    parser = argparse.ArgumentParser(prog="python -m bench.contracts", description=__doc__)
    parser.add_argument("--rounds", type=int, default=MIN_ROUNDS)
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--latency-ms", type=int, default=0)
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-contracts-out-"))
    try:
        # `--only` this section: BENCH_ONLY is bench.run's, whose other sections are not known here.
        flags = ["--duration", str(args.duration), "--rounds", "1", "--out", str(scratch)]
        options = parse_options([*flags, "--only", NAME], (NAME,))
        bench = Bench(options, Limits(), find_wrk())
        section = measure(
            bench, rounds=args.rounds, duration_s=args.duration, latency_ms=args.latency_ms
        )
    except BenchError as exc:
        print(f"bench.contracts: {exc}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    summary = summarize(section)
    print(table(summary))
    for target in targets(summary):
        print(target_line(target))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
