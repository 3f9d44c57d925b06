"""A fleet worker in a process of its own: takes slots, says so, and holds them until killed.

``python -m tests.fleet_worker REDIS_URL SUPPLIER COUNT`` prints ``holding`` once it
holds ``COUNT`` slots of ``SUPPLIER``; the SIGKILL test then kills it without a
goodbye, as a crash or the OOM killer would.
"""

from __future__ import annotations

import asyncio
import sys

from quoteflow.config import Settings
from quoteflow.fleet import Coordinator


async def hold(url: str, supplier: str, count: int) -> None:
    """Join the fleet, take ``count`` slots of ``supplier`` and never give them back."""
    coordinator = Coordinator(
        Settings(redis_url=url, redis_timeout=0.2), suppliers=("atlas", "boreal", "cedar")
    )
    await coordinator.start()
    for _ in range(count):
        await coordinator.slots.acquire(supplier)
    print("holding", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(hold(sys.argv[1], sys.argv[2], int(sys.argv[3])))
