"""The fleet past one host and one Redis: the promises shown, each with its fault named.

Real servers and real sockets: redis-server, a replica and three sentinels
(Debian's ``redis-sentinel``, else ``redis-server --sentinel``) started and
killed here; a TCP proxy this test owns stands for one host's network link.
Each "host" is two coordinators in this process, as two gunicorn workers are
(gunicorn itself is ``tests/fleet/``'s). Attempts are counted at QuoteFlow's
own slots: never more in flight than a supplier's share, nor than the limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import socket
import subprocess
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from quoteflow.config import Settings
from quoteflow.fleet import Coordinator
from quoteflow.fleet.hosts import HOSTS_KEY
from quoteflow.fleet.timing import JOIN_PATIENCE
from tests.process import free_port
from tests.redis_server import RedisServer, redis_server_binary
from tests.test_fleet import Meter

SUPPLIERS = ("atlas", "boreal", "cedar")
SHARES = {"atlas": 1, "boreal": 4, "cedar": 2}
LIMIT = 6


def kept(meter: Meter) -> bool:
    """Whether no supplier ever had more in flight than its share, nor all more than the limit."""
    within = all(meter.peak[s] <= share for s, share in SHARES.items())
    return within and meter.peak_total <= LIMIT


@contextlib.asynccontextmanager
async def fleet(settings: list[Settings], meter: Meter) -> AsyncIterator[list[Coordinator]]:
    """Coordinators joined and kept busy (16 attempts each at once); closed afterwards."""
    started = [Coordinator(s, suppliers=SUPPLIERS, shares=SHARES) for s in settings]
    load: list[asyncio.Task[None]] = []
    try:
        for coordinator in started:
            await coordinator.start()
        await until(lambda: all(c.up for c in started), within=5.0)
        load = [
            asyncio.create_task(meter.keep_busy(c, 3600, hold=0.01))
            for c in started
            for _ in range(16)
        ]
        yield started
    finally:
        for task in load:
            task.cancel()
        await asyncio.gather(*load, return_exceptions=True)
        for coordinator in started:
            await coordinator.close()


async def until(condition: Callable[[], bool], within: float) -> float:
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > within:
            raise AssertionError(f"not within {within} s")
        await asyncio.sleep(0.01)
    return time.monotonic() - started


class Link:
    """A TCP proxy to Redis: one host's network link, which the test cuts and restores."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.port = free_port()
        self.cut = False
        self._pipes: set[asyncio.StreamWriter] = set()
        self._served: set[asyncio.Task[Any]] = set()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.cut:
            writer.transport.abort()
            return
        task = asyncio.current_task()
        assert task is not None
        self._served.add(task)
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            self._served.discard(task)
            return
        self._pipes |= {writer, up_writer}

        async def pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await source.read(65536):
                    if self.cut:
                        break  # bytes on a cut link go nowhere
                    sink.write(data)
                    await sink.drain()
            sink.transport.abort()

        await asyncio.gather(pump(reader, up_writer), pump(up_reader, writer))
        self._pipes -= {writer, up_writer}
        self._served.discard(task)

    def sever(self) -> None:
        """Cut: every connection through the link dies, and new ones are refused."""
        self.cut = True
        for pipe in list(self._pipes):
            pipe.transport.abort()

    async def close(self) -> None:
        """Cut every connection, stop listening, and wait until each pipe has ended."""
        self.sever()
        if self._served:
            await asyncio.wait(set(self._served), timeout=2.0)
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def settings_for(url: str, **more: Any) -> Settings:
    return Settings(redis_url=url, outbound_limit=LIMIT, redis_timeout=0.1, budget=0.5, **more)


async def test_two_hosts_one_cut_off_from_redis_keep_every_share(
    redis_server: RedisServer,
) -> None:
    """Host A reaches Redis directly, host B through a link cut for 2 s and restored: no share
    and not the limit is passed — before, during (B on its safe shares, A holding them back)
    and after — and B's workers coordinate again once the link is back."""
    link = Link(redis_server.port)
    await link.start()
    meter = Meter()
    direct = settings_for(redis_server.url)
    proxied = settings_for(f"redis://127.0.0.1:{link.port}/0")
    try:
        async with fleet([direct, direct, proxied, proxied], meter) as (a1, a2, b1, b2):
            await asyncio.sleep(0.5)
            assert kept(meter), (dict(meter.peak), meter.peak_total)
            link.sever()
            await until(lambda: not b1.up and not b2.up, within=2.0)
            await asyncio.sleep(2.0)  # past the TTL, the lease trust and a budget
            assert kept(meter), (dict(meter.peak), meter.peak_total)
            link.cut = False
            await until(lambda: b1.up and b2.up, within=3.0)
            done = meter.done[b1.worker_id] + meter.done[b2.worker_id]
            await until(lambda: meter.done[b1.worker_id] + meter.done[b2.worker_id] > done, 3.0)
            await asyncio.sleep(0.5)
            assert kept(meter), (dict(meter.peak), meter.peak_total)
            await until(lambda: {c.workers for c in (a1, a2, b1, b2)} == {4}, 3.0)
    finally:
        await link.close()


async def test_a_host_whose_settings_differ_is_flagged(redis_server: RedisServer) -> None:
    """Two masters on one Redis, one with another outbound limit: each flags the other."""
    a = Coordinator(settings_for(redis_server.url), suppliers=SUPPLIERS, shares=SHARES)
    b_settings = Settings(redis_url=redis_server.url, outbound_limit=8, redis_timeout=0.1)
    b = Coordinator(b_settings, suppliers=SUPPLIERS, shares=SHARES)
    a.hosts.master, b.hosts.master = "host-a/1", "host-b/1"
    client = Redis.from_url(redis_server.url)
    try:
        for coordinator in (a, b):
            await coordinator.start()
        await a.hosts.check(client, LIMIT, SHARES)
        await b.hosts.check(client, 8, SHARES)
        await a.hosts.check(client, LIMIT, SHARES)
        assert a.hosts.differ == {"host-b/1": ["outbound_limit 8 (not 6)"]}
        assert b.hosts.differ == {"host-a/1": ["outbound_limit 6 (not 8)"]}
        # Put right (b restarted with the fleet's limit), the flag goes.
        await b.hosts.check(client, LIMIT, SHARES)
        await a.hosts.check(client, LIMIT, SHARES)
        assert a.hosts.differ == {}
    finally:
        for coordinator in (a, b):
            await coordinator.close()
        await client.delete(HOSTS_KEY)
        await client.aclose()


# -- Redis Sentinel -------------------------------------------------------------------


def sentinel_command(config: Path) -> list[str]:
    found = shutil.which("redis-sentinel")
    if found is not None:
        return [found, str(config)]
    return [redis_server_binary(), str(config), "--sentinel"]


class Replicated:
    """A primary, a replica and three sentinels (quorum 2, down-after 1 s) on free ports."""

    def __init__(self, directory: Path, *, introduced: bool = True) -> None:
        """``introduced``: each sentinel is told the others and the replica in its config
        (ready at once); else they find each other as a deployment's do (5 s or so)."""
        self.directory = directory
        self.introduced = introduced
        self.primary = free_port()
        self.replica = free_port()
        self.sentinels = [free_port() for _ in range(3)]
        self.processes: list[subprocess.Popen[bytes]] = []
        self.servers: dict[int, subprocess.Popen[bytes]] = {}

    def _server(self, port: int, *more: str) -> None:
        argv = [redis_server_binary(), "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        # A replica's full sync lands in an RDB file in its directory: the test's own.
        process = subprocess.Popen(
            [
                *argv,
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--loglevel",
                "warning",
                *more,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.processes.append(process)
        self.servers[port] = process

    def start(self) -> None:
        # No 5 s wait for more replicas before the first full sync (Redis 7's default).
        self._server(self.primary, "--repl-diskless-sync-delay", "0")
        self._server(self.replica, "--replicaof", "127.0.0.1", str(self.primary))
        # Replicating, not only linked: a write to the primary reaches the replica.
        wait_for(lambda: inline(self.primary, "SET", "qf-test:marker", "1") == b"+OK\r\n")
        wait_for(lambda: b"$1\r\n1" in inline(self.replica, "GET", "qf-test:marker"))
        # Each sentinel is told the others and the replica (and its own id) up front:
        # found by their hello messages, every 2 s, they took 5 s more to be ready.
        ids = {port: f"{port:040x}" for port in self.sentinels}
        for port in self.sentinels:
            config = self.directory / f"sentinel-{port}.conf"
            others = "".join(
                f"sentinel known-sentinel qf 127.0.0.1 {other} {ids[other]}\n"
                for other in self.sentinels
                if other != port
            )
            told = f"sentinel known-replica qf 127.0.0.1 {self.replica}\n{others}"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self.directory}\n"
                f"sentinel myid {ids[port]}\n"
                f"sentinel monitor qf 127.0.0.1 {self.primary} 2\n"
                "sentinel down-after-milliseconds qf 1000\n"
                "sentinel failover-timeout qf 3000\n" + (told if self.introduced else "")
            )
            process = subprocess.Popen(
                sentinel_command(config), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            self.processes.append(process)
        # Ready for a failover once each sentinel knows the replica and the two others.
        for port in self.sentinels:
            wait_for(functools.partial(knows_all, port), within=15)

    def kill_primary(self) -> None:
        self.servers[self.primary].kill()
        self.servers[self.primary].wait()

    def stop(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


def knows_all(sentinel: int) -> bool:
    """Whether a sentinel knows the replica and both other sentinels."""
    return b"slaves=1,sentinels=3" in info(sentinel, "sentinel")


def info(port: int, section: str) -> bytes:
    """``INFO section`` (b"" if nobody answers)."""
    return inline(port, "INFO", section)


def inline(port: int, *words: str) -> bytes:
    """One inline command over a plain socket: its raw reply (b"" if nobody answers)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(" ".join(words).encode() + b"\r\n")
            sock.settimeout(1)
            return sock.recv(65536)
    except OSError:
        return b""


def wait_for(condition: Callable[[], bool], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within} s")
        time.sleep(0.05)


def through_sentinels(sentinels: tuple[tuple[str, int], ...]) -> Settings:
    """A worker's settings on the primary ``sentinels`` name as ``qf``."""
    return Settings(
        redis_sentinel=sentinels,
        redis_master="qf",
        outbound_limit=LIMIT,
        redis_timeout=0.1,
        budget=0.5,
    )


async def failover(servers: Replicated, workers: list[Coordinator], within: float) -> float:
    """Under load, kill the primary: seconds until every worker syncs on the promoted one,
    having found the switch (and having lost Redis first)."""
    await asyncio.sleep(0.5)
    servers.kill_primary()
    killed = time.monotonic()
    await until(lambda: not all(w.up for w in workers), within=3.0)
    await until(lambda: all(w.up and w.switches >= 1 for w in workers), within=within)
    return time.monotonic() - killed


@pytest.fixture
def replicated(tmp_path: Path) -> Iterator[Replicated]:
    servers = Replicated(tmp_path)
    try:
        servers.start()
        yield servers
    finally:
        servers.stop()


async def test_a_failover_keeps_every_share_and_the_fleet_follows_the_promoted_replica(
    replicated: Replicated,
) -> None:
    """Kill the primary under load: no share or limit passed; within 10 s every worker syncs on
    the promoted replica, having found the switch (a reset: quiet period, rates spent).

    The first sentinel listed is on a host that never answers (a socket that reads nothing):
    each time the workers look for the primary they must get past it.
    """
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)

    dead_host = await asyncio.start_server(silent, "127.0.0.1", 0)
    sentinels = (
        ("127.0.0.1", dead_host.sockets[0].getsockname()[1]),
        *(("127.0.0.1", port) for port in replicated.sentinels),
    )
    settings = through_sentinels(sentinels)
    meter = Meter()
    async with fleet([settings, settings], meter) as workers:
        took = await failover(replicated, workers, within=10.0)
        assert took <= 10.0
        promoted = Redis(port=replicated.replica)
        try:
            assert (await promoted.get("quoteflow:switched")) is not None
            assert await promoted.zcard("quoteflow:workers") == 2
        finally:
            await promoted.aclose()
        done = sum(meter.done[w.worker_id] for w in workers)
        await until(lambda: sum(meter.done[w.worker_id] for w in workers) > done, 3.0)
        assert kept(meter), (dict(meter.peak), meter.peak_total)
    for writer in accepted:
        writer.transport.abort()
    dead_host.close()
    await dead_host.wait_closed()


async def test_a_new_worker_slow_to_join_sends_nothing_until_its_patience_is_spent() -> None:
    """A new worker whose first syncs time out (a Redis that accepts and never answers, as a
    HUP under load can make it) is not on its own yet: it sends nothing while others may hold
    whole shares; past ``JOIN_PATIENCE``, Redis still silent, one attempt at a time."""
    accepted: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        accepted.append(writer)  # read nothing, answer nothing

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    worker = Coordinator(
        settings_for(f"redis://127.0.0.1:{port}/0"), suppliers=SUPPLIERS, shares=SHARES
    )
    try:
        await worker.start()
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(worker.slots.acquire("boreal"), JOIN_PATIENCE - 0.5)
        await asyncio.wait_for(worker.slots.acquire("boreal"), 2.0)
        assert time.monotonic() - started >= JOIN_PATIENCE - 0.1
        assert worker.slots.local_limit == 1  # no fleet it knows of: one at a time
        worker.slots.release("boreal")
    finally:
        await worker.close()
        for writer in accepted:
            writer.transport.abort()
        server.close()
        await server.wait_closed()
