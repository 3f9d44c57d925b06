"""The fleet's clock: how long leases are trusted, how often a worker syncs, how long it waits.

Every value is in seconds. They hang together: a worker renews its record every
``HEARTBEAT``, Redis drops it ``TTL`` after its last sync, and it uses its leases
only ``LEASE_TRUST`` after the sync that renewed them (a margin below ``TTL``).
"""

from __future__ import annotations

from typing import Final

TTL: Final = 1.0
"""Seconds after its last sync that a silent worker is dropped, with what it held."""
HEARTBEAT: Final = TTL / 3
"""Seconds between syncs of a worker with nothing to ask (its lease renewal)."""
LEASE_TRUST: Final = TTL * 0.75
"""Seconds after a sync was sent that its leases are used; a margin below ``TTL``."""
POLL: Final = 0.05
"""Seconds between syncs while local waiters got less than they wanted.

A safety net: slots that come back are announced on ``<p>:freed`` at once;
the poll only covers a lost message and a fair part that changed.
"""
LINGER: Final = 0.05
"""Seconds an idle slot waits for a local taker before the sync that gives it back.

At saturate a worker's slot for one supplier is idle now and then for a few
ms, between one request's attempt and the next one's. With 5 ms, under a
loaded CPU, such slots went back and were asked for again at once, each time
two syncs and a ``freed`` message (0.5–0.9 EVALSHA per answered request); one
``POLL`` keeps them, and a worker that stopped still gives them back at once
by human measure.
"""
IDLE_SLACK: Final = 0.005
"""How much sooner than ``LINGER`` an idle slot may be found old enough (two clocks, ms ticks)."""
RECONNECT: Final = 0.5
"""Seconds between tries while Redis is out of reach."""
RETRY_SOON: Final = 0.1
"""Seconds before the first try after a sync failed: one slow call is often just that."""
LISTEN_WAKE: Final = 0.25
"""Longest wait of the listener's read; it then checks whether it should stop."""
WANT_FRESH: Final = 3 * POLL
"""Seconds a reported want counts: a worker that still waits re-syncs every ``POLL``."""
QUIET: Final = HEARTBEAT + 0.05
"""Seconds without grants after Redis was found emptied: every holder reports first."""
LOOP_LATE: Final = 0.005
"""How late a Redis call's deadline may fire before the loop, not Redis, counts as slow.

Past it the deadline is put off (``deadline.LoopFairTimeout``): a reply that
came in time may be waiting, unread, for a loop busy with requests.
"""
LATE_LOOP_MOST: Final = HEARTBEAT
"""The most a busy loop may add to a Redis call's time limit, in all."""
FIRST_SYNC_TRIPS: Final = 4
"""Round trips a sync may need while the worker is not up, in ``redis_timeout``\\ s.

A new connection, an ``EVALSHA`` answered ``NOSCRIPT`` (a restarted Redis),
``SCRIPT LOAD`` and the ``EVALSHA`` again. Held to one round trip's limit, a
worker booting on a loaded machine fell back before it ever joined.
"""
JOIN_PATIENCE: Final = 2 * TTL
"""Seconds a worker whose first syncs time out keeps trying before it sends on its own.

A Redis that refuses the connection is down: a new worker then sends one
attempt at a time at once. One whose first sync is slow (a loaded machine,
a ``HUP`` starting new workers under load) is not cut off: its one attempt
at a time beside workers holding whole shares would pass them. It sends
nothing for this long — its calls wait for a slot as long as their
deadlines allow — then, Redis still silent, one attempt at a time (the
documented case of a worker started while Redis is away).
"""
PAST_GRACE_EVERY: Final = 60.0
"""Seconds between two warnings that a worker is still on its own past the outage grace."""


def narrow(budget: float) -> float:
    """Seconds a worker gone local keeps within its own leases before its whole safe share.

    Cut off alone, its record lapses ``TTL`` after its last sync and becomes a
    ghost; the others' next sync (a ``HEARTBEAT``, and one more for the
    conversion's) cuts what they are granted beyond it, and their attempts
    already sent run on, each for up to a budget. Until then the slots its
    safe share would add may be theirs. (Redis gone for every worker: their
    leases lapse sooner, at ``LEASE_TRUST``.) Each second of it costs goodput
    while Redis is down for everyone: a worker holds few leases when its
    suppliers answer fast. A cart's call may run past the budget, up to its
    supplier's read timeout: that overlap is left open.
    """
    return TTL + 2 * HEARTBEAT + budget
