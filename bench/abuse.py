"""``python -m bench.abuse``: a client that hoards a server's connections, as an attacker would.

It opens ``--idle`` connections that never send a byte and ``--dribble``
connections that send a request head one header line every ``--line-every``
seconds, and holds them until its standard input closes. With
``--reconnect-after``, a connection the server closes is opened again after
that many seconds (an attacker that keeps trying); without it, it stays closed.

It prints one line when every idle connection has been opened once::

    ready {"idle": 3000, "dribbling": 100}

and, when its input closes, one last line before it exits::

    done {"idle_opened": 3000, "idle_closed_by_server": 2744, "heads_refused_408": 100, ...}

Used by ``tests/test_connections.py`` and the ``abuse`` row of ``make bench``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
from collections import Counter
from collections.abc import Sequence

CONNECTING_AT_ONCE = 64
"""Connects in flight at once: below the server's listen backlog (aiohttp's is 128), so
none is dropped and retried a second later."""


class Abuser:
    """The hoarded connections and what the server did to them."""

    def __init__(self, host: str, port: int, reconnect_after: float | None) -> None:
        self.host = host
        self.port = port
        self.reconnect_after = reconnect_after
        self.stop = asyncio.Event()
        self.counts: Counter[str] = Counter()
        self._connecting = asyncio.Semaphore(CONNECTING_AT_ONCE)

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        async with self._connecting:
            return await asyncio.open_connection(self.host, self.port)

    async def idle(self, opened: asyncio.Event | None) -> None:
        """One connection that never sends a byte, held until ``stop``."""
        while True:
            try:
                reader, writer = await self._open()
            except OSError:
                self.counts["connect_failed"] += 1
                await asyncio.sleep(self.reconnect_after or 0.1)
                continue
            self.counts["idle_opened"] += 1
            if opened is not None:
                opened.set()
                opened = None
            closed = asyncio.ensure_future(reader.read())
            stopped = asyncio.ensure_future(self.stop.wait())
            await asyncio.wait((closed, stopped), return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            writer.close()
            if self.stop.is_set():
                closed.cancel()
                return
            self.counts["idle_closed_by_server"] += 1
            if self.reconnect_after is None:
                await self.stop.wait()
                return
            await asyncio.sleep(self.reconnect_after)

    async def dribble(self, every: float) -> None:
        """One connection sending a head a line at a time, reopened once the server closes it."""
        while not self.stop.is_set():
            try:
                reader, writer = await self._open()
            except OSError:
                self.counts["connect_failed"] += 1
                await asyncio.sleep(every)
                continue
            self.counts["dribbles_opened"] += 1
            answer = asyncio.ensure_future(reader.read())
            line = b"GET /health HTTP/1.1\r\n"
            while not answer.done() and not self.stop.is_set():
                try:
                    writer.write(line)
                except (ConnectionError, RuntimeError):
                    break
                line = b"X-Dribble: one more line\r\n"
                await asyncio.wait((answer,), timeout=every)
            refused = (
                answer.done()
                and not answer.cancelled()
                and answer.exception() is None
                and answer.result().startswith(b"HTTP/1.1 408 ")
            )
            if refused:
                self.counts["heads_refused_408"] += 1
            answer.cancel()
            writer.close()


async def run(args: argparse.Namespace) -> dict[str, int]:
    """Open everything, say ``ready``, hold until standard input closes."""
    abuser = Abuser(args.host, args.port, args.reconnect_after)
    opened = [asyncio.Event() for _ in range(args.idle)]
    tasks = [asyncio.create_task(abuser.idle(event)) for event in opened]
    tasks += [asyncio.create_task(abuser.dribble(args.line_every)) for _ in range(args.dribble)]
    await asyncio.gather(*(event.wait() for event in opened))
    print("ready " + json.dumps({"idle": args.idle, "dribbling": args.dribble}), flush=True)
    loop = asyncio.get_running_loop()
    await loop.run_in_executor(None, sys.stdin.read)
    abuser.stop.set()
    await asyncio.gather(*tasks, return_exceptions=True)
    return dict(abuser.counts)


def main(argv: Sequence[str] | None = None) -> int:
    """Hoard connections to ``--host:--port`` until standard input closes."""
    parser = argparse.ArgumentParser(prog="python -m bench.abuse", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle", type=int, default=3000, help="connections that send nothing")
    parser.add_argument("--dribble", type=int, default=0, help="connections dribbling a head")
    parser.add_argument("--line-every", type=float, default=1.0, help="seconds between lines")
    parser.add_argument(
        "--reconnect-after", type=float, default=None, help="re-open a closed connection"
    )
    args = parser.parse_args(argv)
    # Each connection is a descriptor here too: take every one the system allows.
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    counts = asyncio.run(run(args))
    print("done " + json.dumps(counts), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
