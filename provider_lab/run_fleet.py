"""``make fleet``: redis-server, the provider lab and QuoteFlow under gunicorn, until Ctrl-C.

Like ``make run`` (``run_pair.py``), but QuoteFlow runs in fleet mode: a
gunicorn master with N aiohttp workers (2 by default) sharing one Redis for
the outbound limit, the supplier shares and the retry budgets. Starts, as
child processes and in this order, a redis-server without persistence on its
own port, the lab, and gunicorn with ``QUOTEFLOW_PROVIDER_URL`` and
``QUOTEFLOW_REDIS_URL`` set (other ``QUOTEFLOW_*`` variables of the caller's
environment are passed on). Waits until each answers, prints where they are
and what to try, and on Ctrl-C or SIGTERM stops gunicorn (a graceful drain),
then the lab, then Redis. If any child dies, the others are stopped too.
The children run in sessions of their own, so Ctrl-C reaches only this
runner, which stops them in that order. QuoteFlow is only ever a process here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import shlex
import shutil
import signal
import sys
from collections.abc import Sequence
from typing import Final

import aiohttp

from provider_lab.run_pair import READY_WITHIN_S, stop_child, wait_ready

REDIS_INSTALL: Final = "apt-get update && apt-get install -y redis-server"
GUNICORN_STOP_WITHIN_S: Final = 35.0
"""gunicorn drains its workers on SIGTERM (up to its graceful timeout, 30 s)."""


def gunicorn_command(host: str, port: int, workers: int, extra: Sequence[str]) -> list[str]:
    """The fleet's gunicorn command line (without the interpreter)."""
    return [
        "gunicorn",
        *("-c", "python:quoteflow.gunicorn_conf"),
        "quoteflow.app:gunicorn_app",
        *("--worker-class", "aiohttp.GunicornUVLoopWebWorker"),
        *("--workers", str(workers)),
        *("--bind", f"{host}:{port}"),
        *extra,
    ]


async def redis_ready(host: str, port: int, process: asyncio.subprocess.Process) -> bool:
    """Send PING until redis-server answers PONG; ``False`` if it exits first."""
    loop = asyncio.get_running_loop()
    end = loop.time() + READY_WITHIN_S
    while loop.time() < end and process.returncode is None:
        with contextlib.suppress(OSError, TimeoutError):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(b"PING\r\n")
                if await asyncio.wait_for(reader.readline(), 1) == b"+PONG\r\n":
                    return True
            finally:
                writer.close()
        await asyncio.sleep(0.05)
    return False


def _banner(
    redis_url: str, redis_port: int, lab_url: str, service_url: str, workers: int, shown: str
) -> str:
    body = '{"quantity":2,"scenario":"flaky"}'
    return "\n".join(
        [
            f"redis-server  {redis_url}   (no persistence; try: redis-cli -p {redis_port} monitor)",
            f"provider lab  {lab_url}   (faults: {lab_url}/faults, stats: {lab_url}/stats)",
            f"QuoteFlow     {service_url}   (gunicorn, {workers} workers, limits held in Redis)",
            "",
            "Started as:",
            f"  {shown}",
            "",
            "Try:",
            f"  curl -s -X POST {service_url}/api/quotes "
            f"-H 'Content-Type: application/json' -d '{body}'",
            f"  curl -s {service_url}/metrics | grep quoteflow_requests_total"
            "   # the whole host, whichever worker answers",
            "",
            "make demo drives every scenario and fault against this fleet. Ctrl-C stops all three.",
        ]
    )


async def run(
    host: str, lab_port: int, service_port: int, redis_port: int, workers: int, extra: Sequence[str]
) -> int:
    """Start all three, wait for a signal or a child's death, stop them; the exit code."""
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        print(f"fleet: redis-server is not installed; install it with:\n    {REDIS_INSTALL}")
        return 2
    lab_url = f"http://{host}:{lab_port}"
    service_url = f"http://{host}:{service_port}"
    redis_url = f"redis://{host}:{redis_port}/0"
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    # Each child in a session of its own: Ctrl-C reaches us, and we stop them in order.
    children: list[tuple[str, asyncio.subprocess.Process]] = []
    try:
        redis = await asyncio.create_subprocess_exec(
            *(redis_server, "--bind", host, "--port", str(redis_port)),
            *("--save", "", "--appendonly", "no"),
            start_new_session=True,
        )
        children.insert(0, ("redis-server", redis))
        lab = await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "provider_lab", "--host", host, "--port", str(lab_port)),
            start_new_session=True,
        )
        children.insert(0, ("provider lab", lab))
        settings = {"QUOTEFLOW_PROVIDER_URL": lab_url, "QUOTEFLOW_REDIS_URL": redis_url}
        command = gunicorn_command(host, service_port, workers, extra)
        fleet = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            *command,
            env={**os.environ, **settings},
            start_new_session=True,
        )
        children.insert(0, ("QuoteFlow", fleet))  # stopped first: the others' client
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1)) as session:
            ready = await asyncio.gather(
                redis_ready(host, redis_port, redis),
                wait_ready(lab_url, lab, session),
                wait_ready(service_url, fleet, session),
            )
        names = ("redis-server", "provider lab", "QuoteFlow")
        if not all(ready):
            missing = [name for name, ok in zip(names, ready, strict=True) if not ok]
            print(f"fleet: {' and '.join(missing)} did not start; stopping", file=sys.stderr)
            return 1
        shown = " ".join(f"{k}={v}" for k, v in settings.items()) + " " + shlex.join(command)
        print(
            _banner(redis_url, redis_port, lab_url, service_url, workers, shown),
            flush=True,
        )
        waiters: list[asyncio.Task[object]] = [asyncio.create_task(stop.wait())]
        waiters += [asyncio.create_task(child.wait()) for _, child in children]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for waiter in waiters:
            waiter.cancel()
        if not stop.is_set():
            dead = [name for name, child in children if child.returncode is not None]
            print(f"fleet: {', '.join(dead)} exited; stopping the others", file=sys.stderr)
            return 1
        print("\nfleet: stopping QuoteFlow, the provider lab and redis-server", flush=True)
        return 0
    finally:
        for name, child in children:
            await stop_child(child, GUNICORN_STOP_WITHIN_S if name == "QuoteFlow" else 5.0)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m provider_lab.run_fleet [--host] [--lab-port] [--port] [--redis-port] ...``."""
    parser = argparse.ArgumentParser(
        prog="python -m provider_lab.run_fleet",
        description="Run redis-server, the provider lab and a QuoteFlow fleet until Ctrl-C.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--lab-port", type=int, default=9101)
    parser.add_argument("--port", type=int, default=9100, help="QuoteFlow's port")
    parser.add_argument("--redis-port", type=int, default=9102)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn workers (2)")
    parser.add_argument("extra", nargs="*", help="more gunicorn options, after --")
    args = parser.parse_args(argv)
    return asyncio.run(
        run(args.host, args.lab_port, args.port, args.redis_port, args.workers, args.extra)
    )


if __name__ == "__main__":
    raise SystemExit(main())
