"""What Redis says each live worker holds: ``fleet_holdings``, for tests and operators."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from redis.asyncio import Redis


async def fleet_holdings(client: Redis, prefix: str) -> dict[str, dict[str, int]]:
    """Slots each live worker holds per supplier, as Redis has them (for tests and operators).

    A hedge bucket's entry (``<supplier>#hedge``, no slots) is listed with 0.
    """
    seconds, micros = await client.time()
    now = seconds * 1000 + micros // 1000
    live = {
        (worker.decode() if isinstance(worker, bytes) else str(worker))
        for worker in await client.zrangebyscore(f"{prefix}:workers", f"({now}", "+inf")
    }
    holdings: dict[str, dict[str, int]] = {}
    for worker, record in (await client.hgetall(f"{prefix}:state")).items():
        name = worker.decode() if isinstance(worker, bytes) else str(worker)
        if name not in live:
            continue
        fields = (record.decode() if isinstance(record, bytes) else str(record)).split()
        # Groups of four (name, held, want, pool), then the record's time and
        # what the worker knew then (``script.py``).
        last = len(fields) - (len(fields) - 1) % 4 - 1
        holdings[name] = {fields[i]: int(fields[i + 1]) for i in range(0, last, 4)}
    return holdings
