"""The safe share: what one worker may send on its own while it cannot reach Redis.

Doorman's *safe capacity*: a client cut off from the server keeps to the
capacity divided by the clients it knows, never the whole. Here: the limit
(and each supplier's share) divided by the live workers the last successful
sync reported, rounded down, and at least 1 — so the workers together stay
within the limit however many lose Redis at once, as long as there are no
more workers than the limit.

Why not the fair part the last sync computed? Fair parts are cut from the
demands of the moment, each worker's at a different moment: a worker that was
idle at its last sync had a part of 0, one that was busy the whole limit, and
both may be busy once Redis is gone. Only an equal split holds without
knowing what the others will do.

A supplier's share smaller than the workers (a share of 1, 2 workers): the
rounding down gives 0, and the first ``share`` workers of the last sync's
list (by worker id) get one slot each, the others none — that supplier is
then ``timeout`` (or ``no_slot_in_time``) from them while Redis is out, and
its share holds. More workers than the outbound limit (8 workers, a limit of
6): the floor makes it 1, and the fleet may send one attempt per worker — 8
— until Redis is back; a worker that could send nothing at all would answer
every request with nothing but failures. A worker that has never reached
Redis knows no fleet and sends one attempt at a time.
"""

from __future__ import annotations


def safe_share(limit: int, workers: int, rank: int | None = None) -> int:
    """One worker's part of ``limit`` among ``workers`` (0: unknown) when on its own.

    ``rank``: this worker's place among them (0 first), for a supplier's
    share smaller than the workers: then the first ``limit`` workers get one
    slot each and the others none, so a share of 1 is never 2 in flight.
    Without it (the outbound limit), at least 1.
    """
    if workers <= 0:
        return 1
    part = limit // workers
    if part or rank is None:
        return max(1, part)
    return 1 if rank < limit else 0
