"""Fleet mode: the outbound limit, each supplier's share and each retry budget, held in Redis.

Every worker process (gunicorn worker, machine) that shares one Redis obeys one
outbound limit, one share per supplier and one retry bucket per supplier —
while Redis answers. Redis is **off the request path**: capacity is *leased*
to workers (YouTube's Doorman), and a request only ever waits on a local future.

    request ──acquire(boreal)──▶ FleetSlots ──(leased slot idle? take it: no Redis)
                                     │ no: queue locally, ask for a sync
                                     ▼
    Coordinator ── one sync = one EVALSHA of sync.lua ▶ Redis
      (background,  this worker's absolute state:     <p>:workers ZSET   id → expiry (ms)
       at most one  held, want, retry pool per        <p>:state   HASH   id → "atlas 2 1 8.0
       sync in      supplier; token deposit and                   boreal 0 0 6.5 cedar 1 0 8.0
       flight)      withdrawal                                    <ms of this record>"
                    ◀── grants, allowance, tokens     <p>:tokens  HASH   supplier → bucket level
                                                      <p>:epoch   STRING when this state began
      listener ◀── SUBSCRIBE <p>:freed ── PUBLISH "freed <id>" / "wanted <id>" / "reset <id>"

The package, one module per concern, each importing only those below it:

    coordinator.py  Coordinator: the Redis client, the sync, heartbeat, listener, fallback
    release.py      release_process: a dead worker's records freed by its gunicorn master
    holdings.py     fleet_holdings: what Redis says each live worker holds
    hosts.py        HostCheck: each host's settings stated in Redis, differences flagged
    listener.py     listen: the fleet's channel (freed, wanted, reset, switched, paused)
    client.py       redis_client: one server, or the primary the sentinels name
    script.py       the sync script's keys, arguments and reply
    sync.lua        the script one sync runs in Redis (read once, sent by EVALSHA)
    deadline.py     LoopFairTimeout: a sync's time limit, which our busy loop cannot trip
    leases.py       FleetSlots: leased slots, what a sync reports and takes, the fallback
    waiters.py      LocalWaiters: this worker's calls waiting, per supplier, in turn
    idle.py         IdleClock: how long a leased slot has stood idle (the LINGER rule)
    safe.py         safe_share, capped_wants: what a worker may send on its own, and ask on return
    budget.py       FleetRetryBudget, FleetHedgeBudget: pools drawn from the fleet's buckets
    timing.py       TTL, HEARTBEAT, POLL, LINGER ...: the clock every part keeps to

**Leases.** Per supplier a worker keeps ``leased`` (slots Redis granted it),
``in use`` (attempts running, never more than ``leased`` while Redis is up) and
a FIFO of local waiters. A released slot is handed to the next local waiter
for that supplier; a slot nobody here waits for is *idle*, and goes back at
the first sync after it has been idle for ``LINGER`` (a check is due then)
unless a taker of our own comes first. A worker that
holds more than its fair allowance gives the slot back instead of handing it
on: that is what stops one busy worker keeping every slot while another waits.
So does a worker at its allowance whose leases are lopsided (two of cedar,
none of atlas, atlas waiting): every request asks all three suppliers, so it
would finish nothing until a cedar slot went idle. When the last sync found
atlas grantable but for the full limit, it gives the cedar slot back, and the
same sync grants it the supplier it holds fewest of.

**When a worker syncs.** Never more than one sync in flight; what is asked
meanwhile folds into the next. A request for a sync only schedules a *check*:
when it comes due, the worker syncs if Redis counts its holdings or its
waiters wrong, if a slot has been idle for ``LINGER``, if the last sync saw a
slot it could get, on the heartbeat,
on the ``POLL`` safety net while it waits — or when a message says a slot was
freed elsewhere (then always). What sorted itself out meanwhile (an idle slot
taken again, a waiter served by a local hand-over) costs no round trip.
Measured with two saturated workers (0 ms suppliers): about 0.05 round trips
per answered request, ~20 syncs a second per worker whatever the load.

**The script** (``sync.lua``; arguments and reply in ``Coordinator._sync``).
One call: (1) reads Redis' own clock (``TIME``: one clock for the fleet);
(2) drops workers whose expiry has passed, with everything they held;
(3) records this worker's held and want (the whole truth, never a delta) with
a new expiry ``ttl`` ahead; (4) sums every live worker's held and want (a want
counts for ``WANT_FRESH`` only: a worker that still waits says so again);
(5) computes this worker's fair allowance — max-min ("water-filling") division
of the limit among the workers' demands (held + want), and of each share
likewise; (6) grants what it wants, one slot at a time, each to the supplier
it holds fewest of, up to the share, the limit and — when others wait too —
its allowance;
(7) settles the retry tokens; (8) publishes on ``<p>:freed``: ``freed`` when it
lowered what this worker holds, or dropped a dead worker, while someone
waits and the limit has room left (a traded slot frees nothing); ``wanted``
(at most once per ``POLL``) when this worker waits below its fair part
because others hold more than theirs (they sync at once, learn their smaller
part, and give back on release). A worker ignores its own.
Redis runs a script as one atomic step: no other client's command runs in the
middle, so checking the limit and taking a slot can never interleave with
another worker's — the whole check-and-take of ``OutboundSlots``, fleet-wide.

**A dead worker** (SIGKILL, hang, cut off) stops syncing; the first sync of
any worker after its expiry (``ttl`` = 1 s after its last sync; live workers
renew every ``HEARTBEAT``) drops it, and its slots are free again. A worker
trusts its leases only ``LEASE_TRUST`` after the sync that renewed them, so
a worker that stalls (without dying) does not go on using what Redis has
already given away.

**Redis emptied** (restarted, ``FLUSHALL``): every sync states the whole
truth, so the next heartbeat of each worker rebuilds the state, nothing is
double-counted. A worker that had joined and finds the epoch gone starts a new
one and publishes ``reset``: every worker reports at once, and for ``QUIET``
(one heartbeat and a bit) the script grants nothing, until everyone who held
slots has said so — the limit holds across the flush too.

**Fairness.** Two workers that both always wait get the limit's halves (three
slots each of six, two of each supplier's four); a remainder that does not
divide evenly goes round the workers once a second. Within a worker, waiters
are served first come, first served per supplier.

**Fallback: the safe share.** Any Redis error, or no reply within
``redis_timeout``: the worker is *down* — one ``coordination_down`` warning,
``quoteflow_coordination_up`` 0 — and keeps, on its own, to its *safe share*
(``safe.py``, Doorman's safe capacity): the limit and each share divided by
the live workers the last sync reported, rounded down, at least 1. Never the
whole limit: the workers together stay within it however many lose Redis at
once. Its waiters are re-checked against that at once. For
``timing.narrow`` after going down it keeps within its own leases too, since
the others may still be starting attempts on theirs, or running those granted
beside its ghost (``FleetSlots.go_local``).
It tries a sync ``RETRY_SOON`` later, then every ``RECONNECT`` seconds (a
worker back within ``TTL`` keeps its record); the first that succeeds reports
what it holds right now and brings the leases back (``coordination_up``) —
asking, for a while, for no more than the safe share, since the others may
still be on their own and Redis has lost their records
(``safe.capped_wants``). No request ever awaits Redis, so Redis down,
slow or emptied never costs an answer its budget.

**Slow Redis or a late loop.** The time limit is Redis': when it fires late
because our own loop was busy (a long turn serving requests), the reply may
have come in time and wait unread in the socket, so the limit looks again
once the loop has read it (``deadline.LoopFairTimeout``; counted as
``late_loop`` syncs, not failures). Fired on time with no reply, Redis is slow.
A sync while not up may need four round trips (``FIRST_SYNC_TRIPS``) and gets
that many time limits.

**Retry budget.** One bucket per supplier in ``<p>:tokens`` (a missing field
is a full bucket). Each worker keeps a pool withdrawn from it, as large as
one burst of its own (``FleetRetryBudget``); ``try_spend`` stays synchronous
and local. Every token lives in the bucket or in one pool, and the script
caps the bucket at the capacity less every live worker's pool, so the fleet
together holds one bucket, not one per worker. Tokens carried by a sync whose
answer never came are dropped, not re-sent: at worst a few retries fewer,
never a token counted twice. On its own, a worker's bucket holds its safe
share of the capacity (``FleetRetryBudget.go_local``).

**A worker cut off alone** (the others still reach Redis) cannot tell that
from Redis being gone, and keeps to its safe share. So when its record lapses
(``TTL``) the script keeps it as a *ghost* for ``--redis-outage-grace``
(``<p>:ghosts``), holding the larger of its last holdings and its safe share,
and grants the others only the rest; back on Redis, its first sync replaces
the ghost with what it holds. One that said goodbye, or whose gunicorn master
saw it exit (``release.py``), is dropped at once.

**Another server** (a Sentinel failover, a restore from disk): the script
compares the server's run id with ``<p>:server`` after a failure and once a
second; a different one is a reset, as an emptied Redis, and every rate is
spent at that moment (``<p>:switched``, read by ``callers/quota.lua``).

What is left open, on purpose: a worker alone past the grace keeps its safe
share (logged once a minute); more workers than the limit send one attempt
each (``safe.py``), and so does a worker started while Redis is away, above the
others' shares; a worker that stalls longer than
``LEASE_TRUST`` with attempts already sent (they run on) can overlap with
slots Redis re-granted meanwhile; a worker *started* while Redis is empty
again (not one that had joined) does not trigger ``QUIET``; and on Python 3.11
a cancellation can be lost inside redis-py's connect (``asyncio.wait_for``),
which is why the background loops also stop on a flag (``close``).
"""

from quoteflow.fleet.budget import FleetHedgeBudget, FleetRetryBudget
from quoteflow.fleet.coordinator import Coordinator
from quoteflow.fleet.deadline import LoopFairTimeout
from quoteflow.fleet.holdings import fleet_holdings
from quoteflow.fleet.leases import FLEET, JOINING, LOCAL, FleetSlots
from quoteflow.fleet.safe import safe_share
from quoteflow.fleet.script import SCRIPT
from quoteflow.fleet.timing import (
    FIRST_SYNC_TRIPS,
    HEARTBEAT,
    IDLE_SLACK,
    LATE_LOOP_MOST,
    LEASE_TRUST,
    LINGER,
    LISTEN_WAKE,
    LOOP_LATE,
    POLL,
    QUIET,
    RECONNECT,
    RETRY_SOON,
    TTL,
    WANT_FRESH,
)

__all__ = [
    "FIRST_SYNC_TRIPS",
    "FLEET",
    "HEARTBEAT",
    "IDLE_SLACK",
    "JOINING",
    "LATE_LOOP_MOST",
    "LEASE_TRUST",
    "LINGER",
    "LISTEN_WAKE",
    "LOCAL",
    "LOOP_LATE",
    "POLL",
    "QUIET",
    "RECONNECT",
    "RETRY_SOON",
    "SCRIPT",
    "TTL",
    "WANT_FRESH",
    "Coordinator",
    "FleetHedgeBudget",
    "FleetRetryBudget",
    "FleetSlots",
    "LoopFairTimeout",
    "fleet_holdings",
    "safe_share",
]
