"""Issue 36's slow-kind case: a burst whose boreal is slow, then ordinary requests at once.

What the slot rule must not do: learn from one kind of request that a
supplier is slow, and then skip it for the others. Each round, against a fresh
lab (boreal takes 2 s under ``scenario=slow``, the lab's own scenario) and a
fresh QuoteFlow (its defaults, the breaker off as the issue tried it, since
every slow request's boreal attempt is cut at the deadline):

1. ``burst`` requests at once asking ``scenario=slow`` — more than the inbound
   limit admits (12 for 8; the rest are 503), so every slot is taken by calls
   that will be cut, and what boreal "needs" is learned from them;
2. then ``ordinary`` requests at once (the inbound limit), every one of whose
   calls must wait for a slot: all must carry all three quotes;
3. with ``flaky``, as many ``scenario=flaky`` requests at once (boreal's first
   attempt a 503): boreal retried, and all three quoted.

Two configurations: QuoteFlow's defaults (12 slow, then 8 ordinary) and
``--inbound-limit 2 --outbound-limit 1`` (4 slow, then 2 ordinary, then 2
flaky). The target: every ordinary and flaky answer of every round complete.

Standalone (JSON on stdout, a line per configuration on stderr)::

    python -m bench.kinds
    python -m bench.kinds --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import attrs

from bench.procs import HOST, Service, free_port, start, stop
from bench.report import Target
from bench.slow import SUPPLIERS

ROOT = Path(__file__).resolve().parent.parent
NAME = "slow_kinds"
ROUNDS = 5
TIMEOUT_S = 10.0


@attrs.frozen
class Config:
    """One deployment of the case: QuoteFlow's limits and the round's shape."""

    name: str
    flags: tuple[str, ...]
    burst: int
    ordinary: int
    flaky: bool


CONFIGS = (
    Config("defaults", (), burst=12, ordinary=8, flaky=False),
    Config("limits_2_1", ("--inbound-limit", "2", "--outbound-limit", "1"), 4, 2, True),
)


async def _ask(session: aiohttp.ClientSession, url: str, scenario: str) -> tuple[int, list[str]]:
    """One request: its status and the suppliers it got a quote from."""
    body = {"quantity": 1, "scenario": scenario}
    async with session.post(url, json=body) as response:
        if response.status != 200:
            await response.read()
            return response.status, []
        answer: dict[str, Any] = await response.json()
    return 200, [quote["supplier"] for quote in answer["quotes"]]


async def _at_once(
    session: aiohttp.ClientSession, url: str, scenario: str, n: int
) -> list[tuple[int, list[str]]]:
    return list(await asyncio.gather(*(_ask(session, url, scenario) for _ in range(n))))


def _whole(answers: Sequence[tuple[int, list[str]]]) -> int:
    return sum(1 for status, quoted in answers if status == 200 and set(SUPPLIERS) <= set(quoted))


async def _rounds(url: str, config: Config, rounds: int) -> list[dict[str, Any]]:
    found = []
    timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for _ in range(rounds):
            burst = await _at_once(session, url, "slow", config.burst)
            ordinary = await _at_once(session, url, "normal", config.ordinary)
            record: dict[str, Any] = {
                "burst_admitted": sum(1 for status, _ in burst if status == 200),
                "ordinary": len(ordinary),
                "ordinary_complete": _whole(ordinary),
            }
            if config.flaky:
                flaky = await _at_once(session, url, "flaky", config.ordinary)
                record["flaky"] = len(flaky)
                record["flaky_complete"] = _whole(flaky)
            found.append(record)
    return found


def one_config(config: Config, rounds: int, log_dir: Path) -> dict[str, Any]:
    """A fresh lab and QuoteFlow in ``config``, ``rounds`` rounds: each round's counts."""
    services: list[Service] = []
    try:
        lab_port = free_port()
        lab = start(
            "lab-kinds",
            [sys.executable, "-m", "provider_lab", "--host", HOST, "--port", str(lab_port)],
            lab_port,
            log_dir,
            cwd=ROOT,
        )
        services.append(lab)
        port = free_port()
        argv = [sys.executable, "-m", "quoteflow", "--host", HOST, "--port", str(port)]
        argv += ["--provider-url", lab.url, "--breaker-failures", "0", *config.flags]
        quoteflow = start(f"quoteflow-kinds-{config.name}", argv, port, log_dir, cwd=ROOT)
        services.append(quoteflow)
        found = asyncio.run(_rounds(quoteflow.url + "/api/quotes", config, rounds))
    finally:
        for service in reversed(services):
            stop(service)
    asked = sum(r["ordinary"] + r.get("flaky", 0) for r in found)
    whole = sum(r["ordinary_complete"] + r.get("flaky_complete", 0) for r in found)
    return {
        "config": config.name,
        "flags": list(config.flags),
        "rounds": found,
        "asked": asked,
        "complete": whole,
        "met": whole == asked,
    }


def progress_line(run: dict[str, Any]) -> str:
    per_round = " ".join(
        f"{r['ordinary_complete']}/{r['ordinary']}"
        + (f"+{r['flaky_complete']}/{r['flaky']}" if "flaky" in r else "")
        for r in run["rounds"]
    )
    verdict = "met" if run["met"] else "NOT MET"
    return (
        f"  kinds    {run['config']:<11} complete after each slow burst: {per_round}"
        f"  ({run['complete']} of {run['asked']}: {verdict})"
    )


def run_kinds(rounds: int, log_dir: Path) -> list[dict[str, Any]]:
    """Both configurations, one after the other."""
    runs = []
    for config in CONFIGS:
        run = one_config(config, rounds, log_dir)
        print(progress_line(run), file=sys.stderr, flush=True)
        runs.append(run)
    return runs


def targets(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per configuration: every ordinary and flaky answer after a slow burst complete."""
    return [
        attrs.asdict(
            Target(
                NAME,
                f"{run['config']}: answers with all three quotes after each slow burst",
                f"{run['complete']} of {run['asked']}",
                "",
                "",
                "all (issue 36)",
                bool(run["met"]),
            )
        )
        for run in runs
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kinds", description=__doc__)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="quoteflow-kinds-") as logs:
        runs = run_kinds(args.rounds, Path(logs))
    json.dump(runs, sys.stdout, indent=2)
    print()
    return 0 if all(run["met"] for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
