"""When a worker gives a freed slot back so that a supplier it lacks gets one (``FleetSlots``).

Every request asks every supplier: a worker whose leases are two of cedar
and none of atlas, with atlas waiters, finishes nothing until an atlas slot
comes. At its whole allowance, with the limit taken, no grant comes unless it
gives a slot back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping


def lopsided(
    supplier: str,
    leased: Mapping[str, int],
    leased_total: int,
    allowed_total: int,
    free: Mapping[str, int],
    grantable: Mapping[str, int],
    live: Callable[[str], int],
) -> bool:
    """Whether a freed slot of ``supplier`` should go back so a supplier we lack gets one.

    ``leased``: this worker's leases per supplier, ``leased_total`` in all;
    ``allowed_total``: its whole allowance; ``free``, ``grantable``: what the
    last sync could have granted it per supplier, and could but for the
    limit; ``live``: its waiters per supplier. Traded only when the last sync
    found atlas grantable but for the limit (its share has room, our part of
    it too): the sync that takes the cedar slot back then grants the supplier
    we hold fewest of first
    (``sync.lua``).
    """
    mine = leased[supplier]
    if mine < 2 or leased_total < allowed_total:
        return False
    return any(
        leased[other] + 1 < mine
        and not free[other]  # else its waiters' own sync gets it, nothing to trade
        and grantable[other]  # else Redis would hand back the same supplier
        and live(other)
        for other in leased
        if other != supplier
    )
