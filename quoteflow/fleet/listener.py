"""The fleet's channel, ``<p>:freed``: what one worker tells the others between syncs.

Messages, each ``<kind> <sender> [...]``:

    freed <id>                a sync lowered what a worker holds while others wait
    wanted <id>               a worker waits below its fair part: those above it sync
    reset <id>                Redis was found emptied: every worker reports at once
    switched <id>             the fleet is on another server (a failover): as reset
    paused <id> <supplier> <ms>   a supplier asked (429) to wait: every worker waits

A lost message costs a little time, never a promise: the heartbeat and the
poll carry the same news a moment later.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from quoteflow.fleet.timing import LISTEN_WAKE, RECONNECT

if TYPE_CHECKING:
    from redis.asyncio import Redis


async def listen(
    redis: Redis,
    channel: str,
    *,
    listening: Callable[[], bool],
    heard: Callable[[bytes], None],
    errors: tuple[type[BaseException], ...],
) -> None:
    """Hand every message on ``channel`` to ``heard`` while ``listening()``; resubscribe on error.

    A read has a time limit, not a blocking wait, so the loop also stops on
    ``listening()`` turning false: on Python 3.11 a cancellation that meets
    redis-py inside its connect can be lost (``Coordinator.close``).
    """
    while listening():
        pubsub = redis.pubsub()
        try:
            async with asyncio.timeout(RECONNECT):
                await pubsub.subscribe(channel)
            while listening():
                message = await pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=LISTEN_WAKE
                )
                if message is not None:
                    heard(bytes(message["data"]))
        except errors:
            pass
        finally:
            # Untyped before redis-py 8.2, typed since: Any suits both.
            await cast(Any, pubsub).aclose()
        if listening():
            await asyncio.sleep(RECONNECT)


def pause_of(data: bytes, own: bytes) -> tuple[str, float] | None:
    """``paused <worker> <supplier> <ms>`` from another worker → (supplier, seconds)."""
    parts = data.split(b" ")
    if len(parts) != 4 or parts[1] == own or not parts[3].isdigit():
        return None
    return parts[2].decode(errors="replace"), int(parts[3]) / 1000
