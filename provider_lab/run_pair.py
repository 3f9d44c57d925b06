"""``make run``: the provider lab and QuoteFlow together, until Ctrl-C.

Starts ``python -m provider_lab`` and ``python -m quoteflow`` (pointed at the
lab) as child processes, waits until both answer ``GET /health``, prints where
they are and a ready-to-paste ``curl``, and on SIGINT/SIGTERM stops QuoteFlow,
then the lab, escalating to SIGKILL after a few seconds. If either child dies,
the other is stopped too. QuoteFlow is only ever a process here, never imported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from collections.abc import Sequence
from typing import Final

import aiohttp

READY_WITHIN_S: Final = 20.0
STOP_WITHIN_S: Final = 5.0


async def wait_ready(
    url: str, process: asyncio.subprocess.Process, session: aiohttp.ClientSession
) -> bool:
    """Poll ``url/health`` until it answers 200; ``False`` if the process exits first."""
    loop = asyncio.get_running_loop()
    end = loop.time() + READY_WITHIN_S
    while loop.time() < end and process.returncode is None:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            async with session.get(f"{url}/health") as response:
                if response.status == 200:
                    return True
        await asyncio.sleep(0.1)
    return False


async def stop_child(process: asyncio.subprocess.Process, within_s: float = STOP_WITHIN_S) -> None:
    """SIGTERM, then SIGKILL if it is still there after ``within_s`` seconds."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), within_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


def _banner(lab_url: str, service_url: str, extra: Sequence[str] = ()) -> str:
    body = '{"quantity":2,"scenario":"flaky"}'
    lines = [
        f"provider lab  {lab_url}   (faults: {lab_url}/faults, stats: {lab_url}/stats)",
        f"QuoteFlow     {service_url}",
        "",
        "Try:",
        f"  curl -s -X POST {service_url}/api/quotes "
        f"-H 'Content-Type: application/json' -d '{body}'",
    ]
    if "--cache-size" in extra:
        lines += [
            "and, to see the quote cache (ask twice: boreal's quote comes back with age_s):",
            f'  curl -s -X PUT {lab_url}/cache-control/boreal -d \'{{"value": "max-age=10"}}\'',
        ]
    lines += [
        'and, to try slow suppliers (every one answers after 400 ms; {"ms": 0} undoes it):',
        f"  curl -s -X PUT {lab_url}/latency -d '{{\"ms\": 400}}'",
        "",
        "make demo drives every scenario and fault against this pair. Ctrl-C stops both.",
    ]
    return "\n".join(lines)


async def run(host: str, lab_port: int, service_port: int, extra: Sequence[str]) -> int:
    """Start both, wait for a signal or a child's death, stop both; the exit code."""
    lab_url = f"http://{host}:{lab_port}"
    service_url = f"http://{host}:{service_port}"
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    python = sys.executable
    lab = await asyncio.create_subprocess_exec(
        python, "-m", "provider_lab", "--host", host, "--port", str(lab_port)
    )
    children = [lab]
    try:
        service = await asyncio.create_subprocess_exec(
            python,
            "-m",
            "quoteflow",
            "--host",
            host,
            "--port",
            str(service_port),
            "--provider-url",
            lab_url,
            *extra,
        )
        children.insert(0, service)  # stopped first: it is the lab's client
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
            ready = await asyncio.gather(
                wait_ready(lab_url, lab, session), wait_ready(service_url, service, session)
            )
        if not all(ready):
            names = [
                n for n, ok in zip(("provider lab", "QuoteFlow"), ready, strict=True) if not ok
            ]
            print(f"run: {' and '.join(names)} did not start; stopping", file=sys.stderr)
            return 1
        print(_banner(lab_url, service_url, extra), flush=True)
        waiters: list[asyncio.Task[object]] = [asyncio.create_task(stop.wait())]
        waiters += [asyncio.create_task(child.wait()) for child in children]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        if not stop.is_set():
            print("run: a process exited; stopping the other", file=sys.stderr)
            return 1
        print("\nrun: stopping QuoteFlow and the provider lab", flush=True)
        return 0
    finally:
        for child in children:
            await stop_child(child)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m provider_lab.run_pair [--host] [--lab-port] [--port] [-- quoteflow flags]``."""
    parser = argparse.ArgumentParser(
        prog="python -m provider_lab.run_pair",
        description="Run the provider lab and QuoteFlow together until Ctrl-C.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--lab-port", type=int, default=9101)
    parser.add_argument("--port", type=int, default=9100, help="QuoteFlow's port")
    parser.add_argument("extra", nargs="*", help="more QuoteFlow flags, after --")
    args = parser.parse_args(argv)
    return asyncio.run(run(args.host, args.lab_port, args.port, args.extra))


if __name__ == "__main__":
    raise SystemExit(main())
