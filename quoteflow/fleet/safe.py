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

More workers than the limit (8 workers, a limit of 6; or more workers than a
supplier's share): the rounding down gives 0, the floor makes it 1, and the
fleet may then send one attempt per worker — 8 — until Redis is back. A
worker never sends nothing, or its every request would end in ``timeout``;
keep the outbound limit (and each share) at least the number of workers when
that matters. A worker that has never reached Redis knows no fleet and sends
one attempt at a time.
"""

from __future__ import annotations


def safe_share(limit: int, workers: int) -> int:
    """One worker's part of ``limit`` among ``workers`` (0: unknown) when on its own."""
    if workers <= 0:
        return 1
    return max(1, limit // workers)
