"""``python -m bench.instructions REV``: QuoteFlow's instructions per answer, this tree and ``REV``.

Wall-clock CPU on these shared machines moves by ±10 % with the neighbours;
callgrind counts instructions, which do not. Each tree's QuoteFlow runs under
``valgrind --tool=callgrind --instr-atstart=no`` beside one provider lab
(suppliers at 0 ms); after a warm-up, counting is switched on with
``callgrind_control`` for a fixed number of requests, a fixed number at a time
(8: saturate, the inbound limit), and off again. Printed: the user-space
instructions of the QuoteFlow process per 200 answer — its kernel share (the
socket work) is not in them, so ratios here overstate CPU ratios a little.

Under callgrind QuoteFlow runs some 50 times slower, so whatever it does by
the clock happens relatively more often per request: the learned attempt
time, re-ranked at most every 20 ms for attempts that wait for a slot
(``retry.RANK_EVERY``), is re-ranked at nearly every read here, which a
real-speed process does not pay (about 1 % at saturate).
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from bench.procs import BenchError, Service, free_port, start, stop
from bench.versus import export

ROOT = Path(__file__).resolve().parent.parent
WARM_UP = 200
COUNTED = 400


async def _load(url: str, requests: int, at_once: int) -> int:
    """``requests`` quote requests, ``at_once`` at a time; how many were answered 200."""
    left = requests
    answered = 0
    async with aiohttp.ClientSession() as session:

        async def caller() -> None:
            nonlocal left, answered
            while left > 0:
                left -= 1
                async with session.post(url, json={"quantity": 1}) as response:
                    await response.read()
                    answered += response.status == 200

        await asyncio.gather(*(caller() for _ in range(at_once)))
    return answered


def one_converted(lab_url: str, work: Path) -> tuple[str, ...]:
    """Flags that make boreal quote in euros, converted at the lab's rates: one of three.

    boreal still answers the lab's five keys; its catalogue entry says they are
    euros, so every answer converts its quote (line and shipping) at a cross rate.
    """
    catalogue = work / "one-converted.toml"
    catalogue.write_text(
        "".join(
            f'[[supplier]]\nname = "{name}"\nurl = "{lab_url}/quotes/{name}"\n'
            + ('currency = "EUR"\n' if name == "boreal" else "")
            for name in ("atlas", "boreal", "cedar")
        )
    )
    return ("--suppliers", str(catalogue), "--fx-rates", f"{lab_url}/fx/eurofxref-daily.xml")


def count(
    tree: Path, lab_url: str, work: Path, name: str, at_once: int, extra: Sequence[str] = ()
) -> float:
    """Instructions per answer of the QuoteFlow in ``tree``, counted over ``COUNTED`` requests."""
    port = free_port()
    out = work / f"callgrind.{name}"
    argv = [
        "valgrind",
        "--tool=callgrind",
        "--instr-atstart=no",
        f"--callgrind-out-file={out}",
        *(sys.executable, "-m", "quoteflow", "--port", str(port), "--provider-url", lab_url),
        *("--log-level", "warning", "--event-loop", "uvloop"),
        *extra,
    ]
    env = {"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"}
    service: Service = start(name, argv, port, work, cwd=tree, env=env, ready_timeout=120)
    url = service.url + "/api/quotes"
    try:
        asyncio.run(_load(url, WARM_UP, at_once))
        subprocess.run(
            ["callgrind_control", "-i", "on", str(service.pid)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        answered = asyncio.run(_load(url, COUNTED, at_once))
        subprocess.run(
            ["callgrind_control", "-i", "off", str(service.pid)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    finally:
        stop(service, timeout=60)
    total = 0
    for dump in work.glob(f"callgrind.{name}*"):
        for line in dump.read_text(errors="replace").splitlines():
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
    if not answered or not total:
        raise BenchError(f"{name}: {answered} answers, {total} instructions counted")
    return total / answered


def main(argv: Sequence[str] | None = None) -> int:
    """Count both trees, this one last; print each and the ratio."""
    parser = argparse.ArgumentParser(prog="python -m bench.instructions", description=__doc__)
    parser.add_argument("rev", help="the commit to compare against, e.g. main")
    parser.add_argument("--at-once", type=int, default=8, help="requests in flight (8)")
    parser.add_argument(
        "--one-converted",
        action="store_true",
        help="this tree with boreal in euros at the lab's rates (one quote of three converted)",
    )
    args = parser.parse_args(argv)
    for command in ("valgrind", "callgrind_control"):
        if shutil.which(command) is None:
            print(f"{command} not found: apt-get install -y valgrind", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory(prefix="quoteflow-instructions-") as scratch:
        work = Path(scratch)
        lab_port = free_port()
        lab_argv = [sys.executable, "-m", "provider_lab", "--port", str(lab_port)]
        lab = start("lab", lab_argv, lab_port, work, cwd=ROOT)
        try:
            before = count(export(args.rev, work), lab.url, work, "before", args.at_once)
            print(f"{args.rev:<10} {before:>12,.0f} instructions per answer", flush=True)
            extra = one_converted(lab.url, work) if args.one_converted else ()
            after = count(ROOT, lab.url, work, "after", args.at_once, extra)
            print(f"{'this tree':<10} {after:>12,.0f} instructions per answer")
            print(f"after ÷ before {after / before:.3f}")
        finally:
            stop(lab)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
