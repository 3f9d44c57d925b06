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

Coming back: for a while after a sync put its leases in force again, a worker
asks for no more than its safe share (``capped_wants``) and gives back what it
leased beyond it (``trimmed_leases``), since the others may still be on their
own and Redis has lost their records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


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


def capped_wants(
    held: Sequence[int], want: Sequence[int], total: int, per: Sequence[int]
) -> list[int]:
    """Wants cut so that held + want stays within the safe share, per supplier and in all.

    ``held``, ``want`` and ``per`` (each supplier's safe share) are per
    supplier, in one order; ``total`` is the safe share of the limit. For a
    while after a sync put the leases in force, other workers may still be
    on their own: Redis lost their records while it was away (or never had
    them), so it would grant this worker slots they are using. Each of them
    keeps to its safe share until its own next try (one ``RECONNECT``);
    asking for no more than ours keeps the sum within the limit meanwhile.
    Cut from the supplier that would hold most.
    """
    capped = [max(0, min(w, p - h)) for h, w, p in zip(held, want, per, strict=True)]
    excess = sum(held) + sum(capped) - total
    while excess > 0 and any(capped):
        most = max((i for i, w in enumerate(capped) if w), key=lambda i: held[i] + capped[i])
        capped[most] -= 1
        excess -= 1
    return capped


def trimmed_leases(
    held: Mapping[str, int], leased: Mapping[str, int], total: int, per: Mapping[str, int]
) -> dict[str, int]:
    """The leases to keep within the safe share: what is in use, and idle ones up to the share.

    Grants were asked for within the safe share (``capped_wants``), but slots
    taken on a worker's own limits while that sync was on its way come on top
    of them. An idle lease beyond a supplier's safe share goes back, then idle
    ones of the supplier leased most until the whole is within ``total``; a
    slot in use is never taken back.
    """
    kept = {supplier: max(h, min(leased[supplier], per[supplier])) for supplier, h in held.items()}
    excess = sum(kept.values()) - total
    while excess > 0:
        idle = [supplier for supplier, h in held.items() if kept[supplier] > h]
        if not idle:
            break
        most = max(idle, key=kept.__getitem__)
        kept[most] -= 1
        excess -= 1
    return kept
