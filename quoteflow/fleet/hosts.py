"""Hosts that share one Redis: what each one states, and a flag when two disagree.

Every worker writes what it keeps to — its key prefix, the outbound limit,
each supplier's share — under ``quoteflow-hosts`` (one hash for every fleet
on that Redis db, whatever their prefixes), every ``EVERY`` seconds. Then it
reads the others' and compares them with its own, skipping its own master's
workers (they read one configuration) and entries not renewed for
``STALE`` seconds:

- same prefix, another outbound limit or another share of a supplier both
  name: the fleet's promises are whichever worker synced last — flagged;
- another prefix, a supplier both name: two fleets each keeping their own
  share of one supplier, which then sees both — flagged. Two fleets on one
  Redis with no supplier in common are what ``--redis-prefix`` is for.

A disagreement is one ``fleet_settings_differ`` warning per difference seen
(again if it changes) and ``quoteflow_fleet_settings_differ`` 1 while it lasts:
flagged, never averaged or fixed here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

from quoteflow.logs import log_event

if TYPE_CHECKING:
    from redis.asyncio import Redis

log = logging.getLogger("quoteflow")

HOSTS_KEY: Final = "quoteflow-hosts"
"""One hash per Redis db, under no prefix: hosts of fleets with other prefixes must meet."""
EVERY: Final = 5.0
"""Seconds between two statements (and comparisons) of one worker."""
STALE: Final = 3 * EVERY
"""Seconds after which a statement no longer counts: its worker is gone."""


def worker_identity() -> str:
    """``<host>/<pid>/<random>``: unique in the fleet; its master frees it by host and pid."""
    return f"{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:12]}"


def master_of() -> str:
    """``<host>/<master pid>``: a gunicorn master and its workers state one configuration."""
    return f"{socket.gethostname()}/{os.getppid()}"


def differences(own: Mapping[str, Any], other: Mapping[str, Any]) -> list[str]:
    """What ``other`` states that contradicts ``own`` (the module's docstring); [] if nothing."""
    common = sorted(set(own["shares"]) & set(other["shares"]))
    if other["prefix"] != own["prefix"]:
        if not common:
            return []
        return [f"redis_prefix {other['prefix']!r} (not {own['prefix']!r}) for {', '.join(common)}"]
    found = []
    if other["limit"] != own["limit"]:
        found.append(f"outbound_limit {other['limit']} (not {own['limit']})")
    for name in common:
        if other["shares"][name] != own["shares"][name]:
            found.append(f"{name} share {other['shares'][name]} (not {own['shares'][name]})")
    return found


class HostCheck:
    """One worker's statement under ``HOSTS_KEY`` and its look at the others'."""

    def __init__(self, worker_id: str, prefix: str, master: str | None = None) -> None:
        self.worker_id = worker_id
        self.prefix = prefix
        self.master = master or master_of()
        self.differ: dict[str, list[str]] = {}
        """Masters whose statement contradicts ours, with what differs."""

    async def check(self, redis: Redis, limit: int, shares: Mapping[str, int]) -> None:
        """State ours, read every live statement, and flag what contradicts ours.

        One clock for every host, Redis' own; of each other master only its
        newest statement counts (workers a reload retired still have theirs).
        """
        seconds, micros = await redis.time()
        now_ms = seconds * 1000 + micros // 1000
        own = {"prefix": self.prefix, "limit": limit, "shares": dict(shares)}
        stated = json.dumps({**own, "master": self.master, "at": now_ms})
        async with redis.pipeline(transaction=False) as pipe:
            pipe.hset(HOSTS_KEY, self.worker_id, stated)
            pipe.pexpire(HOSTS_KEY, round(STALE * 1000))
            pipe.hgetall(HOSTS_KEY)
            _, _, everyone = await pipe.execute()
        newest: dict[str, dict[str, Any]] = {}
        stale = []
        for worker, raw in everyone.items():
            try:
                other = json.loads(raw)
                if now_ms - other["at"] > STALE * 1000:
                    stale.append(worker)
                elif (
                    other["master"] != self.master
                    and other["at"] >= newest.get(other["master"], {"at": -1})["at"]
                ):
                    newest[other["master"]] = other
            except (ValueError, KeyError, TypeError):
                continue  # not ours to judge: another version's statement
        if stale:
            await redis.hdel(HOSTS_KEY, *stale)
        differ = {}
        for master, other in newest.items():
            found = differences(own, other)
            if found:
                differ[master] = found
        for master, found in differ.items():
            if self.differ.get(master) != found:
                fields = {"worker": self.worker_id, "other_host": master, "differs": found}
                log_event(log, logging.WARNING, "fleet_settings_differ", fields)
        self.differ = differ

    async def keep_checking(
        self,
        redis: Redis,
        *,
        limit: int,
        shares: Mapping[str, int],
        up: Callable[[], bool],
        running: Callable[[], bool],
        errors: tuple[type[BaseException], ...],
        call_limit: float,
    ) -> None:
        """``check`` while ``running()``: a second after start-up, then every ``EVERY`` s."""
        wait = 1.0
        while running():
            await asyncio.sleep(wait)
            wait = EVERY
            if not up():
                continue  # Redis away: the coordinator says so already
            with contextlib.suppress(*errors):
                async with asyncio.timeout(call_limit):
                    await self.check(redis, limit, shares)
