"""The slow-suppliers section of ``make bench`` (issue 28): healthy suppliers at hundreds of ms.

In every other section the suppliers answer in 0–50 ms (or one of them is
slow), and QuoteFlow's outbound slots are rarely the bottleneck. Here each
case gets a FRESH QuoteFlow with its defaults (breaker on, budget 0.8 s,
inbound 8, outbound 6, share 4; ``python -m quoteflow`` with only its ports,
the lab's URL and ``--event-loop``; ``BENCH_QUOTEFLOW_ARGS`` is not passed
on), the lab's ``latency`` fault (or ``hang``) on the suppliers named,
and closed-loop callers: N asyncio tasks in this one client process sharing
one ``ClientSession`` (connector limit = N), each POSTing ``{"quantity": 1}``
to ``/api/quotes?explain=1`` in a loop with no think time except 50 ms after
a 503. Each answer's wall time is taken at the client. Every case runs once
under each event loop (asyncio, then uvloop when installed); in fleet mode
the loop is gunicorn's worker class.

Cases (``SECTION``) and issue 28's targets, for a 10 s run:

- ``all400``, 4 and 8 callers: atlas, boreal and cedar at 400 ms. ≥ 40
  answers with all three quotes, no ``circuit_open``, none later than the
  budget + 150 ms at the client, no 5xx but 503 (nor a client error);
- ``warm400``, 8 callers: as ``all400``, but QuoteFlow first answers 200
  requests with the suppliers at 0 ms: a supplier that slows down, whose
  estimate QuoteFlow must unlearn (not an issue-28 case): no
  ``circuit_open``, none late, no 5xx but 503; its complete answers are
  reported;
- ``boreal500``, 8 callers: boreal alone at 500 ms. boreal quoted ≥ 65 times,
  no ``circuit_open``, atlas and cedar in every 200, none late;
- ``fleet400``, 8 callers: ``all400`` against 2 gunicorn workers sharing the
  limits through a redis-server of their own (``bench/fleet.py``): ≥ 40
  complete answers, no ``circuit_open``, none late;
- ``boreal_hang``, 8 callers, 6 s: boreal hangs from the first request. Its
  circuit opens (some answers with boreal ``circuit_open``) and answers keep
  coming (more than 50 200s);
- ``spell400``, 4 callers (issue 36): all three at 400 ms for the first 4 s,
  then at 0 ms from T (the lab's faults cleared): of the answers that come
  from T + 1 s on, ≥ 98 % carry all three quotes; no ``circuit_open``, none
  late. The time from T to the first complete answer to a request sent after
  T is reported. Both spans scale with ``--duration``, as the counts do.

Counts (answers with all three quotes, boreal's quotes, 200s) are of answers
that arrived within the run's window; a caller starts no request after it,
and the answers still in flight then are awaited and judged for lateness,
``circuit_open`` and 5xx like every other. A shorter run (``--duration``;
``BENCH_SLOW_DURATION`` or ``--slow-duration`` under ``bench.run``) scales
the count targets by duration ÷ 10 s, and the table says so.

Standalone, to measure one case quickly (its figures as JSON on stdout)::

    python -m bench.slow --case all400 --callers 8 --loop uvloop
    python -m bench.slow --case fleet400
    python -m bench.slow --case all          # the whole section, both loops

It starts its own lab (and redis-server for ``fleet400``) and needs no wrk.
``--service URL --lab URL`` drives a QuoteFlow already running instead (not
fresh: its circuits and history are its own).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import aiohttp
import attrs

from bench import fleet
from bench.core import SLOW_FULL_S, Bench, Options
from bench.procs import HOST, BenchError, Service, free_port, http, start, stop
from bench.report import Target, _num
from bench.workloads import Limits

ROOT = Path(__file__).resolve().parent.parent
SUPPLIERS = ("atlas", "boreal", "cedar")
NAME = "slow_suppliers"
"""The section's name: in ``--only``, ``latest.json`` and the table."""
FULL_S = SLOW_FULL_S
"""The run length issue 28's targets are set for."""
GRACE_S = 0.15
"""Issue 28: no answer later than the budget + 150 ms at the client."""
PAUSE_AFTER_503_S = 0.05
REQUEST_TIMEOUT_S = 5.0
"""The client gives up on one request after this long (an error, never expected)."""
BODY = b'{"quantity": 1}'
HEADERS = {"Content-Type": "application/json"}

Fault = Mapping[str, object]


@attrs.frozen
class Case:
    """One lab setting and deployment; the callers are chosen per run."""

    name: str
    what: str
    faults: Mapping[str, Fault]
    """Lab faults per supplier for the whole run (``PUT /faults/{supplier}``)."""
    callers: int = 8
    """Callers when none are given (the standalone client)."""
    fleet: bool = False
    """2 gunicorn workers on Redis instead of one process."""
    share: float = 1.0
    """The run's length as a share of the section's duration (the hang case: 6 of 10 s)."""
    warm_up: int = 0
    """Requests answered at once before the faults are set: what QuoteFlow learns first."""
    spell: float = 0.0
    """The faults' share of the run (0: all of it); cleared then, at T, with the callers on."""


def _latency(ms: int) -> Fault:
    return {"kind": "latency", "ms": ms}


CASES: dict[str, Case] = {
    case.name: case
    for case in (
        Case(
            "all400",
            "atlas, boreal and cedar at 400 ms",
            {s: _latency(400) for s in SUPPLIERS},
        ),
        Case(
            "warm400",
            "warmed up at 0 ms (200 requests), then all three at 400 ms",
            {s: _latency(400) for s in SUPPLIERS},
            warm_up=200,
        ),
        Case(
            "boreal500",
            "boreal at 500 ms, atlas and cedar at 0 ms",
            {"boreal": _latency(500)},
        ),
        Case(
            "fleet400",
            "fleet mode (2 gunicorn workers, Redis): all three at 400 ms",
            {s: _latency(400) for s in SUPPLIERS},
            fleet=True,
        ),
        Case(
            "boreal_hang",
            "boreal hangs from the first request",
            {"boreal": {"kind": "hang"}},
            share=0.6,
        ),
        Case(
            "spell400",
            "all three at 400 ms for 4 s, then at 0 ms from T",
            {s: _latency(400) for s in SUPPLIERS},
            callers=4,
            spell=0.4,
        ),
    )
}
SPELL_MARGIN: Final = 0.1
"""After a spell, answers are judged from T + this share of the run (1 s of 10 s)."""
SECTION: tuple[tuple[str, int], ...] = (
    ("all400", 4),
    ("all400", 8),
    ("warm400", 8),
    ("boreal500", 8),
    ("fleet400", 8),
    ("boreal_hang", 8),
    ("spell400", 4),
)
"""(case, callers) in the order the section runs them, each under every loop."""


def have_uvloop() -> bool:
    """Whether uvloop is installed (then every case also runs on it)."""
    return importlib.util.find_spec("uvloop") is not None


def loops() -> tuple[str, ...]:
    """The event loops each case runs under: asyncio's, and uvloop's when installed."""
    return ("asyncio", "uvloop") if have_uvloop() else ("asyncio",)


# -- the closed-loop client ---------------------------------------------------


@attrs.frozen
class Answer:
    """What one request got, as the client saw it."""

    done_s: float
    """When the answer was in, seconds from the start of the run."""
    latency_s: float
    status: int | None
    """None: no HTTP answer (``error`` says why)."""
    quoted: tuple[str, ...] = ()
    failures: Mapping[str, str] = attrs.field(factory=dict)
    stopped: Mapping[str, str] = attrs.field(factory=dict)
    elapsed_ms: float | None = None
    error: str | None = None


def _answer(done_s: float, latency_s: float, status: int, raw: bytes) -> Answer:
    if status != 200:
        return Answer(done_s, latency_s, status)
    try:
        body = json.loads(raw)
        quoted = tuple(quote["supplier"] for quote in body["quotes"])
        failures = {failure["supplier"]: failure["code"] for failure in body["failures"]}
        bill = body.get("explain", {}).get("suppliers", {})
        stopped = {name: str(part.get("stopped")) for name, part in bill.items()}
        elapsed = float(body["elapsed_ms"])
    except (ValueError, KeyError, TypeError) as exc:
        return Answer(done_s, latency_s, status, error=f"bad 200 body: {type(exc).__name__}")
    return Answer(done_s, latency_s, status, quoted, failures, stopped, elapsed)


async def _caller(
    session: aiohttp.ClientSession, url: str, began: float, end: float, answers: list[Answer]
) -> None:
    """Ask, read the answer, ask again, until ``end``; 50 ms of rest after a 503 only."""
    while (sent := time.perf_counter()) < end:
        try:
            async with session.post(url, data=BODY, headers=HEADERS) as response:
                raw = await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError) as exc:
            now = time.perf_counter()
            answers.append(Answer(now - began, now - sent, None, error=type(exc).__name__))
            await asyncio.sleep(PAUSE_AFTER_503_S)  # never a hot loop on a refused connection
            continue
        now = time.perf_counter()
        answers.append(_answer(now - began, now - sent, status, raw))
        if status == 503:
            await asyncio.sleep(PAUSE_AFTER_503_S)


@attrs.frozen
class SpellEnd:
    """The lab's faults cleared ``after_s`` into a run: the end of a spell, at T."""

    lab_url: str
    after_s: float


async def _end_spell(spell: SpellEnd, began: float) -> float:
    """Clear the lab's faults at ``spell.after_s``; T, seconds from ``began``, once it has."""
    await asyncio.sleep(max(0.0, began + spell.after_s - time.perf_counter()))
    async with aiohttp.ClientSession() as lab, lab.delete(spell.lab_url + "/faults") as response:
        if response.status != 200:
            raise BenchError(f"lab refused to clear its faults: {response.status}")
    return time.perf_counter() - began


async def drive(
    service_url: str, callers: int, duration_s: float, *, explain: bool = True
) -> list[Answer]:
    """``callers`` closed-loop callers for ``duration_s``: every answer they got."""
    answers, _ = await _drive(service_url, callers, duration_s, explain, None)
    return answers


async def _drive(
    service_url: str, callers: int, duration_s: float, explain: bool, spell: SpellEnd | None
) -> tuple[list[Answer], float | None]:
    url = service_url + "/api/quotes" + ("?explain=1" if explain else "")
    connector = aiohttp.TCPConnector(limit=callers)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    answers: list[Answer] = []
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar()
    ) as session:
        began = time.perf_counter()
        end = began + duration_s
        ended = None if spell is None else asyncio.ensure_future(_end_spell(spell, began))
        await asyncio.gather(*(_caller(session, url, began, end, answers) for _ in range(callers)))
        return answers, None if ended is None else await ended


def client_loop_factory() -> tuple[str, Callable[[], asyncio.AbstractEventLoop]]:
    """The client's own loop: uvloop when installed (the cheaper generator), else asyncio's."""
    if have_uvloop():
        import uvloop

        return "uvloop", uvloop.new_event_loop
    return "asyncio", asyncio.new_event_loop


def run_client(
    service_url: str, callers: int, duration_s: float, *, explain: bool = True
) -> tuple[list[Answer], str]:
    """``drive`` on the client's loop, from synchronous code; the answers and that loop."""
    answers, _, name = run_client_spell(service_url, callers, duration_s, None, explain=explain)
    return answers, name


def run_client_spell(
    service_url: str,
    callers: int,
    duration_s: float,
    spell: SpellEnd | None,
    *,
    explain: bool = True,
) -> tuple[list[Answer], float | None, str]:
    """``run_client``, with a spell's end when given: the answers, T (or None) and the loop."""
    name, factory = client_loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        answers, spell_t = runner.run(_drive(service_url, callers, duration_s, explain, spell))
    return answers, spell_t, name


# -- figures ------------------------------------------------------------------


def _quantile(ordered: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0–1) of sorted values, nearest rank; None for none."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def figures(answers: Iterable[Answer], window_s: float, budget_s: float) -> dict[str, Any]:
    """Everything issue 28 asks of one run, from the client's answers."""
    answers = list(answers)
    inside = [a for a in answers if a.done_s <= window_s]
    ok = [a for a in answers if a.status == 200]
    ok_inside = [a for a in inside if a.status == 200]
    failures: dict[str, Counter[str]] = {s: Counter() for s in SUPPLIERS}
    stopped: dict[str, Counter[str]] = {s: Counter() for s in SUPPLIERS}
    for answer in ok:
        for supplier, code in answer.failures.items():
            failures.setdefault(supplier, Counter())[code] += 1
        for supplier, why in answer.stopped.items():
            stopped.setdefault(supplier, Counter())[why] += 1
    quoted: Counter[str] = Counter(s for a in ok_inside for s in a.quoted)
    latencies = sorted(a.latency_s * 1000 for a in answers if a.status is not None)
    ok_latencies = sorted(a.latency_s * 1000 for a in ok)
    late_after_ms = (budget_s + GRACE_S) * 1000
    elapsed = [a.elapsed_ms for a in ok if a.elapsed_ms is not None]
    statuses = Counter(str(a.status) for a in answers if a.status is not None)
    return {
        "window_s": window_s,
        "answers": len(answers),
        "answers_in_window": len(inside),
        "tail_ms": round(1000 * max((a.done_s - window_s for a in answers), default=0.0), 1),
        "statuses": dict(sorted(statuses.items())),
        "errors": dict(Counter(a.error for a in answers if a.error)),
        "complete": sum(1 for a in ok_inside if len(set(a.quoted) & set(SUPPLIERS)) == 3),
        "ok_in_window": len(ok_inside),
        "quoted": {s: quoted.get(s, 0) for s in SUPPLIERS},
        "failures": {s: dict(c.most_common()) for s, c in failures.items()},
        "stopped": {s: dict(c.most_common()) for s, c in stopped.items()},
        "circuit_open": {s: failures.get(s, Counter())["circuit_open"] for s in SUPPLIERS},
        "missing_atlas_or_cedar": sum(1 for a in ok if not {"atlas", "cedar"} <= set(a.quoted)),
        "server_5xx": sum(
            n for code, n in statuses.items() if code.startswith("5") and code != "503"
        ),
        "latency_ms": {
            "p50": _round(_quantile(latencies, 0.50)),
            "p99": _round(_quantile(latencies, 0.99)),
            "max": _round(latencies[-1] if latencies else None),
            "p99_200": _round(_quantile(ok_latencies, 0.99)),
            "max_200": _round(ok_latencies[-1] if ok_latencies else None),
        },
        "late_after_ms": round(late_after_ms, 1),
        "late": sum(1 for ms in latencies if ms > late_after_ms),
        "elapsed_ms_max": _round(max(elapsed, default=None)),
    }


def _complete(answer: Answer) -> bool:
    return answer.status == 200 and set(SUPPLIERS) <= set(answer.quoted)


def spell_figures(answers: Iterable[Answer], spell_t: float, margin_s: float) -> dict[str, Any]:
    """After a spell ends at ``spell_t``: how whole the answers are from T + ``margin_s`` on.

    Every answer that came from then on is judged (a 503 or an error is not
    complete). The first complete answer after T is of a request sent after
    T, so that one begun in the spell does not count.
    """
    judged = [a for a in answers if a.done_s >= spell_t + margin_s]
    whole = sum(map(_complete, judged))
    fresh = [a.done_s for a in answers if _complete(a) and a.done_s - a.latency_s >= spell_t]
    return {
        "t_s": round(spell_t, 3),
        "judged_from_s": round(spell_t + margin_s, 3),
        "answers": len(judged),
        "complete": whole,
        "complete_share": round(whole / len(judged), 4) if judged else None,
        "first_complete_ms": round(1000 * (min(fresh) - spell_t), 1) if fresh else None,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


# -- one run: a fresh QuoteFlow, the lab's faults, the callers ----------------


def _start_single(bench: Bench, tag: str, loop: str) -> Service:
    port = free_port()
    return start(
        tag,
        [
            *(sys.executable, "-m", "quoteflow", "--host", HOST, "--port", str(port)),
            *("--provider-url", bench.lab.url, "--event-loop", loop),
        ],
        port,
        bench.log_dir,
        cwd=ROOT,
    )


def _start_fleet(bench: Bench, tag: str, loop: str) -> fleet.Deployment:
    redis = fleet.start_redis(bench)
    try:
        return fleet.start_gunicorn(
            bench,
            tag,
            bench.lab.url,
            {"QUOTEFLOW_REDIS_URL": f"redis://{HOST}:{redis.port}/0"},
            redis,
            worker_class=fleet.WORKER_CLASSES[loop],
            bench_args=False,
        )
    except BaseException:
        stop(redis)
        raise


def set_faults(lab_url: str, faults: Mapping[str, Fault]) -> None:
    """Replace every supplier's faults with the case's (none for those it does not name)."""
    status, _, body = http("DELETE", lab_url + "/faults")
    if status != 200:
        raise BenchError(f"lab refused to clear its faults: {status} {body}")
    for supplier, fault in faults.items():
        status, _, body = http("PUT", f"{lab_url}/faults/{supplier}", dict(fault))
        if status != 200:
            raise BenchError(f"lab refused fault {fault} for {supplier}: {status} {body}")


def one_run(
    bench: Bench,
    case: Case,
    callers: int,
    loop: str,
    duration_s: float,
    *,
    explain: bool = True,
) -> dict[str, Any]:
    """Start a fresh QuoteFlow (or fleet) on ``loop``, load it, stop it; the run's figures."""
    tag = f"slow-{case.name}-{callers}-{loop}"
    window_s = round(duration_s * case.share, 3)
    bench.set_latency(0)
    single: Service | None = None
    deployment: fleet.Deployment | None = None
    try:
        set_faults(bench.lab.url, {} if case.warm_up else case.faults)
        bench.settle()
        bench.reset_lab()
        try:
            if case.fleet:
                deployment = _start_fleet(bench, tag, loop)
                url = deployment.url
            else:
                single = _start_single(bench, tag, loop)
                url = single.url
            if case.warm_up:
                # A supplier that slows down: QuoteFlow knows it fast, then it is not.
                for _ in range(case.warm_up):
                    http("POST", url + "/api/quotes", {"quantity": 1})
                set_faults(bench.lab.url, case.faults)
            spell = SpellEnd(bench.lab.url, duration_s * case.spell) if case.spell else None
            answers, spell_t, client_loop = run_client_spell(
                url, callers, window_s, spell, explain=explain
            )
            downs = fleet.coordination_downs(deployment) if deployment else None
        finally:
            if deployment is not None:
                deployment.stop()
            if single is not None:
                stop(single)
        bench.settle()
        _, _, lab_stats = http("GET", bench.lab.url + "/stats?summary=1", timeout=30)
    finally:
        http("DELETE", bench.lab.url + "/faults")  # the next section's lab has none
    record: dict[str, Any] = {
        "case": case.name,
        "what": case.what,
        "callers": callers,
        "loop": loop,
        "client_loop": client_loop,
        "fleet": case.fleet,
        "explain": explain,
        **figures(answers, window_s, bench.limits.budget_s),
        "lab": {
            "per_supplier": lab_stats.get("per_supplier", {}),
            "max_active": lab_stats.get("max_active"),
            "answers": lab_stats.get("answers", {}),
        },
    }
    if downs is not None:
        record["coordination_down"] = downs
    if spell_t is not None:
        record["spell"] = spell_figures(answers, spell_t, duration_s * SPELL_MARGIN)
    return record


def progress_line(run: dict[str, Any]) -> str:
    """One line per run, printed as it finishes."""
    statuses = " ".join(f"{k}:{v}" for k, v in run["statuses"].items())
    opened = "/".join(str(run["circuit_open"][s]) for s in SUPPLIERS)
    quoted = "/".join(str(run["quoted"][s]) for s in SUPPLIERS)
    lat = run["latency_ms"]
    spell = run.get("spell")
    return (
        f"  slow     {run['case']:<12}×{run['callers']:<2} {run['loop']:<8}"
        f"complete {run['complete']:>4}  quoted a/b/c {quoted}  [{statuses}]  "
        f"circuit_open a/b/c {opened}  p99 {_num(lat['p99'])} max {_num(lat['max'])} ms  "
        f"late {run['late']}"
        + (f"  errors {run['errors']}" if run["errors"] else "")
        + (f"  after T {_spell(run)}" if spell else "")
    )


def run_slow(bench: Bench) -> dict[str, Any]:
    """Every case of ``SECTION`` under every loop, each against a fresh QuoteFlow."""
    duration_s = bench.options.slow_duration_s
    runs = []
    for case_name, callers in SECTION:
        for loop in loops():
            record = one_run(bench, CASES[case_name], callers, loop, duration_s)
            print(progress_line(record), flush=True)
            runs.append(record)
    return {"duration_s": duration_s, "loops": list(loops()), "runs": runs}


# -- targets ------------------------------------------------------------------


@attrs.frozen
class Check:
    """One target of issue 28 for one kind of case: its value and whether it is met."""

    metric: str
    target: Callable[[float], str]
    """The target's text, given the scale (duration ÷ 10 s)."""
    value: Callable[[dict[str, Any]], str]
    met: Callable[[dict[str, Any], float], bool]
    scaled: bool = False
    """A count, whose target scales with the run's length."""


def _circuit_open(run: dict[str, Any]) -> int:
    return int(sum(run["circuit_open"].values()))


def _spell(run: dict[str, Any]) -> str:
    spell = run["spell"]
    first = spell["first_complete_ms"]
    return (
        f"{spell['complete']} of {spell['answers']} complete from T + "
        f"{spell['judged_from_s'] - spell['t_s']:g} s, first {_num(first)} ms after T"
    )


def _spell_met(run: dict[str, Any]) -> bool:
    spell = run.get("spell")
    return bool(spell and spell["answers"] and spell["complete"] >= 0.98 * spell["answers"])


def _late(run: dict[str, Any]) -> str:
    return f"{run['late']} (max {_num(run['latency_ms']['max'])} ms)"


def _scaled(count: float, scale: float) -> str:
    return f"{count * scale:g}" + ("" if scale == 1 else f" ({count:g} × {scale:g})")


NONE_LATE = Check(
    "answers later than budget + 150 ms at the client (slowest)",
    lambda scale: "0",
    _late,
    lambda run, scale: run["late"] == 0,
)
NO_CIRCUIT_OPEN = Check(
    "circuit_open failure codes",
    lambda scale: "0",
    lambda run: str(_circuit_open(run)),
    lambda run, scale: _circuit_open(run) == 0,
)
COMPLETE = Check(
    "answers with all 3 quotes",
    lambda scale: "≥ " + _scaled(40, scale),
    lambda run: str(run["complete"]),
    lambda run, scale: run["complete"] >= 40 * scale,
    scaled=True,
)
NO_5XX = Check(
    "5xx other than 503 | client errors",
    lambda scale: "0 | 0",
    lambda run: f"{run['server_5xx']} | {sum(run['errors'].values())}",
    lambda run, scale: run["server_5xx"] == 0 and not run["errors"],
)
CHECKS: dict[str, tuple[Check, ...]] = {
    "all400": (COMPLETE, NO_CIRCUIT_OPEN, NONE_LATE, NO_5XX),
    # Unlearning a fast estimate costs answers for a while (27–47 complete in
    # 10 s, docs/retries.md): reported; what must hold is that nobody is ejected.
    "warm400": (NO_CIRCUIT_OPEN, NONE_LATE, NO_5XX),
    "boreal500": (
        Check(
            "boreal quoted",
            lambda scale: "≥ " + _scaled(65, scale),
            lambda run: str(run["quoted"]["boreal"]),
            lambda run, scale: run["quoted"]["boreal"] >= 65 * scale,
            scaled=True,
        ),
        NO_CIRCUIT_OPEN,
        Check(
            "200s missing atlas or cedar",
            lambda scale: "0",
            lambda run: f"{run['missing_atlas_or_cedar']} of {run['statuses'].get('200', 0)}",
            lambda run, scale: (
                run["missing_atlas_or_cedar"] == 0 and run["statuses"].get("200", 0) > 0
            ),
        ),
        NONE_LATE,
    ),
    "fleet400": (COMPLETE, NO_CIRCUIT_OPEN, NONE_LATE),
    "boreal_hang": (
        Check(
            "answers with boreal circuit_open",
            lambda scale: "≥ 1",
            lambda run: str(run["circuit_open"]["boreal"]),
            lambda run, scale: run["circuit_open"]["boreal"] >= 1,
        ),
        Check(
            "200s",
            lambda scale: "> " + _scaled(50, scale),
            lambda run: str(run["ok_in_window"]),
            lambda run, scale: run["ok_in_window"] > 50 * scale,
            scaled=True,
        ),
    ),
    # Issue 36: a spell of slowness is unlearned within a second of its end.
    "spell400": (
        Check(
            "answers after the spell (T + 1 s on) with all 3 quotes",
            lambda scale: "≥ 98 %",
            _spell,
            lambda run, scale: _spell_met(run),
        ),
        NO_CIRCUIT_OPEN,
        NONE_LATE,
        NO_5XX,
    ),
}


def _figure_rows(runs: Mapping[str, dict[str, Any]]) -> list[tuple[str, dict[str, str]]]:
    """Figures reported without a target: answers by status, latency, stopped reasons."""

    def statuses(run: dict[str, Any]) -> str:
        return " ".join(f"{k}:{v}" for k, v in run["statuses"].items()) or "–"

    def latency(run: dict[str, Any]) -> str:
        lat = run["latency_ms"]
        return f"{_num(lat['p99'])} / {_num(lat['max'])}"

    def quoted(run: dict[str, Any]) -> str:
        return "/".join(str(run["quoted"][s]) for s in SUPPLIERS)

    return [
        ("answers by status", {loop: statuses(run) for loop, run in runs.items()}),
        ("quotes a/b/c", {loop: quoted(run) for loop, run in runs.items()}),
        ("client latency p99 / max (ms)", {loop: latency(run) for loop, run in runs.items()}),
    ]


def summarize(section: dict[str, Any]) -> dict[str, Any]:
    """The runs by case and callers, then loop; the scale the targets are judged at."""
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for run in section["runs"]:
        by.setdefault(f"{run['case']}×{run['callers']}", {})[run["loop"]] = run
    duration = float(section["duration_s"])
    return {"duration_s": duration, "scale": duration / FULL_S, "runs": by}


def judge(run: dict[str, Any], scale: float) -> list[dict[str, Any]]:
    """Each target of ``run``'s case: metric, value, target, met (the standalone client's)."""
    return [
        {
            "metric": check.metric,
            "value": check.value(run),
            "target": check.target(scale),
            "met": check.met(run, scale),
        }
        for check in CHECKS[run["case"]]
    ]


def targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The section's rows of the table: one per target and case, asyncio | uvloop beside it."""
    scale = float(summary["scale"])
    note = "" if scale == 1 else f", targets scaled to {summary['duration_s']:g} s"
    rows: list[Target] = []
    for label, runs in summary["runs"].items():
        case = CASES[label.split("×")[0]]
        seconds = summary["duration_s"] * case.share
        where = f"{label} {seconds:g} s"
        asyncio_run, uvloop_run = runs.get("asyncio"), runs.get("uvloop")
        for check in CHECKS[case.name]:
            present = [run for run in (asyncio_run, uvloop_run) if run is not None]
            rows.append(
                Target(
                    NAME,
                    f"{where}: {check.metric} (asyncio | uvloop)",
                    check.value(asyncio_run) if asyncio_run else "–",
                    check.value(uvloop_run) if uvloop_run else "–",
                    "",
                    f"{check.target(scale)} (issue 28{note if check.scaled else ''})",
                    bool(present) and all(check.met(run, scale) for run in present),
                )
            )
        figure_rows = _figure_rows(runs)
        if COMPLETE not in CHECKS[case.name]:
            complete = {loop: str(run["complete"]) for loop, run in runs.items()}
            figure_rows.insert(0, ("answers with all 3 quotes (reported)", complete))
        for metric, values in figure_rows:
            rows.append(
                Target(
                    NAME,
                    f"{where}: {metric} (asyncio | uvloop)",
                    values.get("asyncio", "–"),
                    values.get("uvloop", "–"),
                    "",
                    "",
                    None,
                )
            )
    return [attrs.asdict(row) for row in rows]


# -- standalone ---------------------------------------------------------------


def _standalone_bench(out_dir: Path, duration_s: float) -> Bench:
    """A ``Bench`` with only a lab of its own: enough for ``one_run``."""
    options = Options(
        duration_s=duration_s,
        rounds=1,
        only=(NAME,),
        out_dir=out_dir,
        plots=False,
        profile=False,
        warmup_s=0.0,
        quoteflow_args=(),
        bare_args=(),
        slow_duration_s=duration_s,
    )
    bench = Bench(options, Limits(), wrk="")
    port = free_port()
    bench.services["lab"] = start(
        "lab", [sys.executable, "-m", "provider_lab", "--port", str(port)], port, bench.log_dir
    )
    return bench


def _external(service: str, lab: str, case: Case, callers: int, duration_s: float) -> Any:
    """Drive a QuoteFlow already running (not fresh: its breakers and history are its own)."""
    set_faults(lab, case.faults)
    spell = SpellEnd(lab, duration_s * case.spell) if case.spell else None
    try:
        answers, spell_t, client_loop = run_client_spell(
            service, callers, duration_s * case.share, spell
        )
    finally:
        http("DELETE", lab + "/faults")
    extra = (
        {}
        if spell_t is None
        else {"spell": spell_figures(answers, spell_t, duration_s * SPELL_MARGIN)}
    )
    return {
        "case": case.name,
        "callers": callers,
        "loop": "external",
        "client_loop": client_loop,
        "service": service,
        **figures(answers, duration_s * case.share, Limits().budget_s),
        **extra,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bench.slow``: one case (or all) with fresh processes; figures as JSON."""
    parser = argparse.ArgumentParser(
        prog="python -m bench.slow",
        description="Closed-loop callers against QuoteFlow with slow suppliers (issue 28).",
    )
    parser.add_argument("--case", default="all400", choices=[*CASES, "all"])
    parser.add_argument("--callers", type=int, help="default: the case's (8)")
    parser.add_argument(
        "--loop",
        choices=("asyncio", "uvloop", "both"),
        default="uvloop" if have_uvloop() else "asyncio",
        help="QuoteFlow's event loop (default: uvloop when installed); --case all runs both",
    )
    parser.add_argument(
        "--duration", type=float, default=FULL_S, help="seconds (10; targets scale with it)"
    )
    parser.add_argument("--no-explain", action="store_true", help="ask without ?explain=1")
    parser.add_argument("--out", type=Path, help="logs directory (default: a temporary one)")
    parser.add_argument("--service", help="drive this running QuoteFlow instead (with --lab)")
    parser.add_argument("--lab", help="the running lab behind --service")
    args = parser.parse_args(argv)
    if args.duration <= 0 or (args.callers is not None and args.callers < 1):
        parser.error("--duration must be positive and --callers at least 1")
    if bool(args.service) != bool(args.lab):
        parser.error("--service and --lab go together")
    scale = args.duration / FULL_S
    if args.service:
        case = CASES["all400" if args.case == "all" else args.case]
        run = _external(args.service, args.lab, case, args.callers or case.callers, args.duration)
        run["targets"] = judge(run, scale)
        print(json.dumps(run, indent=1))
        return 0
    if args.case == "all":
        plan = [(CASES[name], callers, loop) for name, callers in SECTION for loop in loops()]
    else:
        case = CASES[args.case]
        chosen = loops() if args.loop == "both" else (args.loop,)
        plan = [(case, args.callers or case.callers, loop) for loop in chosen]
    with tempfile.TemporaryDirectory(prefix="bench-slow-") as scratch:
        bench = _standalone_bench(args.out or Path(scratch), args.duration)
        runs = []
        try:
            for case, callers, loop in plan:
                run = one_run(
                    bench, case, callers, loop, args.duration, explain=not args.no_explain
                )
                run["targets"] = judge(run, scale)
                print(progress_line(run), file=sys.stderr, flush=True)
                runs.append(run)
        except BenchError as exc:
            print(f"bench.slow: {exc}", file=sys.stderr)
            return 1
        finally:
            bench.stop_all()
    print(json.dumps(runs[0] if len(runs) == 1 else runs, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
