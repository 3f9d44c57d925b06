"""Fleet mode: the outbound limit, each supplier's share and each retry budget, held in Redis.

Every worker process (gunicorn worker, machine) that shares one Redis obeys one
outbound limit, one share per supplier and one retry bucket per supplier —
while Redis answers. Redis is **off the request path**: capacity is *leased*
to workers (YouTube's Doorman), and a request only ever waits on a local future.

    request ──acquire(boreal)──▶ FleetSlots ──(leased slot idle? take it: no Redis)
                                     │ no: queue locally, ask for a sync
                                     ▼
    Coordinator ── one sync = one EVALSHA of SCRIPT ──▶ Redis
      (background,  this worker's absolute state:     <p>:workers ZSET   id → expiry (ms)
       at most one  held, want, retry pool per        <p>:state   HASH   id → "atlas 2 1 8.0
       sync in      supplier; token deposit and                   boreal 0 0 6.5 cedar 1 0 8.0
       flight)      withdrawal                                    <ms of this record>"
                    ◀── grants, allowance, tokens     <p>:tokens  HASH   supplier → bucket level
                                                      <p>:epoch   STRING when this state began
      listener ◀── SUBSCRIBE <p>:freed ── PUBLISH "freed <id>" / "wanted <id>" / "reset <id>"

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

**The script** (``SCRIPT``; arguments and reply in ``Coordinator._sync``).
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

**Fallback.** Any Redis error, or a call past ``redis_timeout``: the worker is
*down* — one ``coordination_down`` warning, ``quoteflow_coordination_up`` 0 —
and enforces the limit and the shares on its own, like ``OutboundSlots`` (so
the fleet may then send up to N × the limit); its waiters are re-checked
against those limits at once. It tries a sync every ``RECONNECT`` seconds;
the first that succeeds reports what it holds right now and brings the
leases back (``coordination_up``). No request ever awaits Redis, so Redis
down, slow or emptied never costs an answer its budget.

**Retry budget.** One bucket per supplier in ``<p>:tokens`` (a missing field
is a full bucket). Each worker keeps a pool withdrawn from it, as large as
one burst of its own (``FleetRetryBudget``); ``try_spend`` stays synchronous
and local. Every token lives in the bucket or in one pool, and the script
caps the bucket at the capacity less every live worker's pool, so the fleet
together holds one bucket, not one per worker. Tokens carried by a sync whose
answer never came are dropped, not re-sent: at worst a few retries fewer,
never a token counted twice.

What is left open, on purpose: a worker that stalls longer than
``LEASE_TRUST`` with attempts already sent (they run on) can overlap with
slots Redis re-granted meanwhile; a worker *started* while Redis is empty
again (not one that had joined) does not trigger ``QUIET``; and on Python 3.11
a cancellation can be lost inside redis-py's connect (``asyncio.wait_for``),
which is why the background loops also stop on a flag (``close``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from quoteflow.config import Settings
from quoteflow.logs import log_event
from quoteflow.retry import RetryBudget

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript

log = logging.getLogger("quoteflow")

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
LISTEN_WAKE: Final = 0.25
"""Longest wait of the listener's read; it then checks whether it should stop."""
WANT_FRESH: Final = 3 * POLL
"""Seconds a reported want counts: a worker that still waits re-syncs every ``POLL``."""
QUIET: Final = HEARTBEAT + 0.05
"""Seconds without grants after Redis was found emptied: every holder reports first."""

JOINING, FLEET, LOCAL = "joining", "fleet", "local"
"""Modes of ``FleetSlots``: before the first sync, leases in force, own limits."""

SCRIPT: Final = """
local id = ARGV[1]
local ttl, limit, share = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local fresh, quiet_ms = tonumber(ARGV[5]), tonumber(ARGV[6])
local joined, bye = ARGV[7] == '1', ARGV[8] == '1'
local may_announce = ARGV[12] == '1'
local capacity, channel, n = tonumber(ARGV[9]), ARGV[10], tonumber(ARGV[11])
local names, held, want, deposit, withdraw, pool = {}, {}, {}, {}, {}, {}
for i = 1, n do
  local b = 12 + 6 * (i - 1)
  names[i], held[i], want[i] = ARGV[b + 1], tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  deposit[i], withdraw[i] = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
  pool[i] = tonumber(ARGV[b + 6])
end

-- "atlas 2 1 0.5 boreal 0 0 3 cedar 1 0 2 <ms>" -> {name -> {held, want, pool}}, ms
local function parse(record)
  local f = {}
  for token in string.gmatch(record, '%S+') do f[#f + 1] = token end
  local entry = {}
  for i = 1, #f - 1, 4 do
    entry[f[i]] = {tonumber(f[i + 1]), tonumber(f[i + 2]), tonumber(f[i + 3])}
  end
  return entry, tonumber(f[#f])
end

local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)

-- (2) Workers silent for ttl are gone; so is what they held.
local dropped = 0
local dead = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, wid in ipairs(dead) do
  local record = redis.call('HGET', KEYS[2], wid)
  if record then
    for _, hw in pairs(parse(record)) do dropped = dropped + hw[1] end
    redis.call('HDEL', KEYS[2], wid)
  end
  redis.call('ZREM', KEYS[1], wid)
end

-- An emptied Redis (restart, FLUSHALL) has no epoch. Found so by a worker that
-- had joined, it grants nothing for quiet_ms: every holder reports first.
local epoch = tonumber(redis.call('GET', KEYS[4]))
local reset = false
if not epoch then
  epoch = now - quiet_ms
  if joined then epoch, reset = now, true end
  redis.call('SET', KEYS[4], epoch)
end
local quiet = now < epoch + quiet_ms

-- Whether this worker now holds fewer slots of some supplier than its last record said.
local previous = redis.call('HGET', KEYS[2], id)
local lowered = false
local function lower(now_held)
  if previous then
    local entry = parse(previous)
    for i = 1, n do
      local before = entry[names[i]]
      if before and before[1] > now_held[i] then lowered = true end
    end
  end
end

-- (4) Everyone else: what they hold, and what they want if they said so lately.
local held_all, total_all, others, others_want, pools = {}, 0, {}, 0, {}
for i = 1, n do held_all[names[i]], pools[names[i]] = 0, 0 end
local rows = redis.call('HGETALL', KEYS[2])
for k = 1, #rows, 2 do
  if rows[k] ~= id then
    local entry, at = parse(rows[k + 1])
    local live = at + fresh > now
    local demand = {id = rows[k], total = 0, per = {}}
    for name, hw in pairs(entry) do
      local w = live and hw[2] or 0
      held_all[name] = (held_all[name] or 0) + hw[1]
      pools[name] = (pools[name] or 0) + hw[3]
      total_all = total_all + hw[1]
      demand.per[name] = hw[1] + w
      demand.total = demand.total + hw[1] + w
      others_want = others_want + w
    end
    others[#others + 1] = demand
  end
end

local starved, full = false, false
local function publish()
  if reset then
    redis.call('PUBLISH', channel, 'reset ' .. id)
  elseif others_want > 0 and (lowered or dropped > 0) and not full then
    redis.call('PUBLISH', channel, 'freed ' .. id)
  elseif starved then
    redis.call('PUBLISH', channel, 'wanted ' .. id)
    return 1
  end
  return 0
end

-- (7) Tokens: deposits first, then a withdrawal of whole tokens. Every token is
-- in the bucket or in a worker's pool, so the bucket holds at most the capacity
-- less every pool: the fleet together never has more than one bucket.
local levels = redis.call('HMGET', KEYS[3], unpack(names))
local taken, level = {}, {}
local writes = {}
for i = 1, n do
  local room = math.max(0, capacity - pools[names[i]] - pool[i])
  local l = math.min(room, (tonumber(levels[i]) or room) + deposit[i])
  local t = 0
  if not bye then t = math.max(0, math.min(withdraw[i], math.floor(l))) end
  taken[i], level[i] = t, l - t
  if l ~= tonumber(levels[i]) or t > 0 then
    writes[#writes + 1] = names[i]
    writes[#writes + 1] = string.format('%.6f', level[i])
  end
end
if #writes > 0 then redis.call('HSET', KEYS[3], unpack(writes)) end

if bye then
  redis.call('ZREM', KEYS[1], id)
  redis.call('HDEL', KEYS[2], id)
  local none = {}
  for i = 1, n do none[i] = 0 end
  lower(none)
  publish()
  return {0, 0, 0, #others}
end

local mine, my_demand = 0, 0
for i = 1, n do
  mine = mine + held[i]
  my_demand = my_demand + held[i] + want[i]
  held_all[names[i]] = held_all[names[i]] + held[i]
end
total_all = total_all + mine

-- (5) Max-min fair division of cap among demands: the small ones in full, the
-- rest an equal part each; the slots left over rotate among them every second.
local function fill(cap, my, key)
  local list = {{id = id, d = my}}
  for _, o in ipairs(others) do
    local d = o.total
    if key then d = o.per[key] or 0 end
    list[#list + 1] = {id = o.id, d = d}
  end
  table.sort(list, function(a, b)
    if a.d == b.d then return a.id < b.id end
    return a.d < b.d
  end)
  local left, i = cap, 1
  while i <= #list and list[i].d * (#list - i + 1) <= left do
    if list[i].id == id then return my end
    left = left - list[i].d
    i = i + 1
  end
  local rest = {}
  for j = i, #list do rest[#rest + 1] = list[j].id end
  table.sort(rest)
  local m = #rest
  local part = math.floor(left / m)
  local extra = left - part * m
  local start = math.floor(now / 1000) % m
  for j = 1, m do
    if rest[j] == id then
      if (j - 1 - start) % m < extra then return part + 1 end
      return part
    end
  end
  return my
end

local allowed_total = fill(limit, my_demand, nil)
local allowed = {}
for i = 1, n do allowed[i] = fill(share, held[i] + want[i], names[i]) end

-- (6) Grants, one slot at a time, each to the wanted supplier this worker
-- holds fewest of (ties rotate): every request asks every supplier, so a
-- worker with two cedar slots and no atlas slot finishes nothing.
local granted, room, cap = {}, {}, {}
local room_total, cap_total = limit - total_all, math.huge
for i = 1, n do
  granted[i] = 0
  room[i] = share - held_all[names[i]]
  cap[i] = math.huge
  if others_want > 0 then cap[i] = allowed[i] - held[i] end
end
if others_want > 0 then cap_total = allowed_total - mine end
if not quiet then
  local start = now % n
  while room_total > 0 and cap_total > 0 do
    local best
    for j = 0, n - 1 do
      local i = (start + j) % n + 1
      if granted[i] < want[i] and room[i] > 0 and cap[i] > 0
          and (not best or held[i] + granted[i] < held[best] + granted[best]) then
        best = i
      end
    end
    if not best then break end
    granted[best], room[best], cap[best] = granted[best] + 1, room[best] - 1, cap[best] - 1
    room_total, cap_total = room_total - 1, cap_total - 1
  end
end

-- A slot given back and taken again in the same call (a lopsided lease
-- traded) frees nothing for anyone else: no message then.
full = room_total <= 0

-- Still waiting below its fair part while the slots are taken: someone holds
-- more than theirs, and learns it now rather than at its next heartbeat.
local after = mine
for i = 1, n do after = after + granted[i] end
for i = 1, n do
  if may_announce and not quiet and granted[i] < want[i] and after < allowed_total
      and (room_total == 0 or (room[i] == 0 and held[i] + granted[i] < allowed[i])) then
    starved = true
  end
end

local after_grants = {}
for i = 1, n do after_grants[i] = held[i] + granted[i] end
lower(after_grants)

-- (3) This worker's whole truth, with a new expiry.
local parts = {}
for i = 1, n do
  parts[#parts + 1] = names[i]
  parts[#parts + 1] = held[i] + granted[i]
  parts[#parts + 1] = want[i] - granted[i]
  parts[#parts + 1] = string.format('%.3f', pool[i] + taken[i])
end
parts[#parts + 1] = now
redis.call('HSET', KEYS[2], id, table.concat(parts, ' '))
redis.call('ZADD', KEYS[1], now + ttl, id)
-- Keys of a fleet that stopped altogether vanish on their own.
redis.call('PEXPIRE', KEYS[1], 10 * ttl)
redis.call('PEXPIRE', KEYS[2], 10 * ttl)

local announced = publish()

local reply = {quiet and 1 or 0, others_want > 0 and 1 or 0, allowed_total, #others + 1,
  announced}
for i = 1, n do
  local free = math.max(0, math.min(room[i], room_total, cap[i], cap_total))
  -- Could have been granted, were the limit not full: worth trading a slot for.
  local grantable = math.max(0, math.min(room[i], cap[i]))
  if quiet then free, grantable = 0, 0 end
  reply[#reply + 1] = granted[i]
  reply[#reply + 1] = allowed[i]
  reply[#reply + 1] = free
  reply[#reply + 1] = grantable
  reply[#reply + 1] = taken[i]
  reply[#reply + 1] = string.format('%.6f', level[i])
end
return reply
"""


class FleetSlots:
    """Outbound slots leased from the fleet's Redis; this process's own limits while it is away.

    Satisfies ``slots.OutboundLimiter``. Every call comes from the event
    loop's thread and nothing between checking and taking a slot awaits, as in
    ``OutboundSlots``; the ``Coordinator`` moves leases in and out between
    requests (``report`` before a sync, ``apply`` after it).
    """

    def __init__(
        self,
        limit: int,
        share: int,
        suppliers: Iterable[str],
        *,
        need_sync: Callable[[float], None],
        lapsed: Callable[[], None],
    ) -> None:
        self.limit = limit
        self.share = share
        self.mode = JOINING
        self.in_use = 0
        """Slots this process's attempts hold now."""
        self._held = dict.fromkeys(suppliers, 0)
        self.leased = dict.fromkeys(self._held, 0)
        """Slots Redis granted this worker, per supplier; at least ``held`` in fleet mode."""
        self.leased_total = 0
        self.allowed = dict.fromkeys(self._held, share)
        self.allowed_total = limit
        self.free = dict.fromkeys(self._held, 0)
        """Slots the last sync could still have granted us, per supplier."""
        self.grantable = dict.fromkeys(self._held, 0)
        """Slots the last sync could have granted us but for the whole limit, per supplier."""
        self.others_waiting = False
        self.unmet = dict.fromkeys(self._held, 0)
        """Waiters Redis knows of (reported, not granted), per supplier."""
        self._idle_since: dict[str, float | None] = dict.fromkeys(self._held)
        """Since when (monotonic) a leased slot of each supplier has been idle, if one is."""
        self._reported = dict.fromkeys(self._held, 0)
        self._recorded = dict.fromkeys(self._held, 0)
        """What Redis counts as ours after the last sync, per supplier."""
        self.valid_until = -math.inf
        self._waiting: dict[str, collections.deque[tuple[int, asyncio.Future[None]]]] = {
            supplier: collections.deque() for supplier in self._held
        }
        self._order = itertools.count()
        self._need_sync = need_sync
        self._lapsed = lapsed

    def held(self, supplier: str) -> int:
        """Slots ``supplier``'s attempts hold now, in this process."""
        return self._held[supplier]

    @property
    def waiting(self) -> int:
        """Attempts of this process waiting for a slot."""
        return sum(self._live(queue) for queue in self._waiting.values())

    async def acquire(self, supplier: str) -> None:
        """Take a slot for ``supplier``: an idle leased one at once, else wait in turn."""
        if (
            self.mode == FLEET
            and self._held[supplier] < self.leased[supplier]
            and not self._waiting[supplier]
        ):
            if time.monotonic() < self.valid_until:
                self._take(supplier)
                return
            self._lapsed()  # no renewal in time: Redis may have given these away
        if (
            self.mode == LOCAL
            and self.in_use < self.limit
            and self._held[supplier] < self.share
            and not self._waiting[supplier]
        ):
            self._take(supplier)
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (next(self._order), granted)
        queue = self._waiting[supplier]
        queue.append(entry)
        if self.mode != LOCAL:
            # At once if the last sync saw a slot we could get, or Redis does
            # not know yet that we wait (then nobody would tell us of a freed
            # slot). Otherwise a slot must be freed first, and its holder's
            # sync announces it.
            soon = self.mode == JOINING or self.free[supplier] > 0 or self._unannounced(supplier)
            self._need_sync(0.0 if soon else POLL)
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(supplier)  # handed a slot, then cancelled before using it
            else:
                with contextlib.suppress(ValueError):  # already skipped by a hand-out
                    queue.remove(entry)
                self._check_want(supplier)
            raise

    def release(self, supplier: str) -> None:
        """Give back ``supplier``'s slot: to Redis if we hold too many, else to a local waiter."""
        self._held[supplier] -= 1
        self.in_use -= 1
        if self.mode == FLEET and time.monotonic() >= self.valid_until:
            self._lapsed()  # handing the slot on would use a lease Redis may have given away
        if self.mode == FLEET:
            if (
                self.leased[supplier] > self.allowed[supplier]
                or self.leased_total > self.allowed_total
                or self._lopsided(supplier)
            ):
                # Above our fair part while others wait, or worth more as a
                # slot of a supplier we lack: back to the fleet, not on locally.
                self.leased[supplier] -= 1
                self.leased_total -= 1
                self._need_sync(0.0)  # leased < recorded: the check finds it worth a sync
            elif self._hand_over(supplier):
                self._check_want(supplier)
            else:
                # Idle: a taker of our own usually comes within a few ms under
                # load; if none has within LINGER, the slot goes back.
                self._need_sync(LINGER)
            self._clock_idle(supplier)
        elif self.mode == LOCAL:
            self._hand_out_local()

    # -- the coordinator's side -------------------------------------------------------

    def report(self) -> tuple[list[int], list[int]]:
        """What this worker holds and wants per supplier, for a sync; long-idle slots go back.

        A slot is leased only while used or about to be: one idle for
        ``LINGER`` goes back here, so an idle worker strands nothing. One idle
        for less (between one request's attempt and the next request's, at
        saturate) is kept, while the leases are in force and we hold no more
        than our fair part (per supplier and in all): given back by a sync
        that happened to come, it would cost the next request a round trip to
        get it again. Outside fleet mode the truth is simply what runs now.
        """
        held, want = [], []
        now = time.monotonic()
        # Only leases still in force, and only within our whole fair part: a
        # worker above it gives every idle slot back.
        may_keep = (
            self.mode == FLEET
            and now < self.valid_until
            and self.leased_total <= self.allowed_total
        )
        for supplier, queue in self._waiting.items():
            keep = self._held[supplier]
            if may_keep and not self._idle_long(supplier, now):
                keep = max(keep, min(self.leased[supplier], self.allowed[supplier]))
            self.leased[supplier] = self._recorded[supplier] = keep
            self._clock_idle(supplier)
            self._reported[supplier] = self._live(queue)
            held.append(keep)
            want.append(self._reported[supplier])
        self.leased_total = sum(self.leased.values())
        return held, want

    def apply(
        self,
        granted: list[int],
        allowed: list[int],
        allowed_total: int,
        free: list[int],
        grantable: list[int],
        others_waiting: bool,
        sent_at: float,
    ) -> float | None:
        """Take a sync's answer: leases in force, grants handed to waiters.

        Returns how soon the next sync should come, or None for the heartbeat.
        """
        self.mode = FLEET
        self.valid_until = sent_at + LEASE_TRUST
        self.allowed_total = allowed_total
        self.others_waiting = others_waiting
        undercounted = False
        for index, supplier in enumerate(self._held):
            self.unmet[supplier] = self._reported[supplier] - granted[index]
            # Redis now counts what we reported plus the grants; give-backs
            # made meanwhile are still counted there, so the next check syncs.
            self._recorded[supplier] += granted[index]
            self.leased[supplier] += granted[index]
            if self._held[supplier] > self.leased[supplier]:
                # Taken under local limits while this sync was on its way
                # (just back from a fallback): tell Redis at once.
                self.leased[supplier] = self._held[supplier]
                undercounted = True
            self.allowed[supplier] = allowed[index]
            self.free[supplier] = free[index]
            self.grantable[supplier] = grantable[index]
            while self._held[supplier] < self.leased[supplier] and self._hand_over(supplier):
                pass
            self._clock_idle(supplier)
        self.leased_total = sum(self.leased.values())
        if undercounted:
            return 0.0
        if any(map(self._live, self._waiting.values())):
            return POLL
        if self.leased_total > self.in_use:
            return LINGER
        return None

    def worth_syncing(self, since_last: float) -> bool:
        """Whether Redis has us wrong, or could give us something, ``since_last`` s after a sync.

        Asked when a requested sync comes due: whatever sorted itself out
        meanwhile (an idle slot taken again, a waiter served by a local
        hand-over) costs no round trip.
        """
        now = time.monotonic()
        for supplier, queue in self._waiting.items():
            if self.leased[supplier] != self._recorded[supplier]:
                return True  # given back, or taken on local limits: Redis counts wrong
            if self._idle_long(supplier, now):
                return True  # no taker of our own came within LINGER: back to the fleet
            live = self._live(queue)
            if live:
                if self._unannounced(supplier) or self.free[supplier] > 0 or since_last >= POLL:
                    return True  # nobody would tell us of a slot, or Redis could grant, or the poll
            elif self.unmet[supplier] and since_last >= POLL:
                # Redis still counts waiters that are gone (served by a local
                # hand-over, most often): told at the poll, not at once; Redis
                # stops counting a want after WANT_FRESH anyway.
                return True
        return False

    def _unannounced(self, supplier: str) -> bool:
        """``supplier``'s waiters need Redis to know of them now: no slot of ours will come.

        Redis does not count them, and this worker holds no lease of that
        supplier whose release would hand it on. With a lease in use here, the
        waiter is usually served by a local hand-over within a few ms; Redis
        learns of the want at the ``POLL`` if it still waits.
        """
        return not self.unmet[supplier] and not self.leased[supplier]

    def heard(self, message: bytes) -> bool:
        """Whether a message on ``<p>:freed`` calls for a sync now."""
        if message == b"reset":
            return True  # Redis was emptied: it must learn what we hold
        if message == b"wanted":
            return self.leased_total > 0  # our fair part may have shrunk
        return self.waiting > 0

    def go_local(self) -> None:
        """Redis is out of reach: this process's own limits, for every waiter at once."""
        self.mode = LOCAL
        self._hand_out_local()

    # -- helpers ----------------------------------------------------------------------

    @staticmethod
    def _live(queue: collections.deque[tuple[int, asyncio.Future[None]]]) -> int:
        return sum(1 for _, granted in queue if not granted.done())

    def _check_want(self, supplier: str) -> None:
        """The last waiter for ``supplier`` is gone: soon, Redis should stop counting it."""
        if self.unmet[supplier] and not self._live(self._waiting[supplier]):
            self._need_sync(LINGER)  # worth_syncing finds unmet without waiters

    def _lopsided(self, supplier: str) -> bool:
        """Whether a freed slot of ``supplier`` should go back so a supplier we lack gets one.

        Every request asks every supplier: a worker whose leases are two of
        cedar and none of atlas, with atlas waiters, finishes nothing until an
        atlas slot comes. At its whole allowance, with the limit taken, no
        grant comes unless it gives a slot back. Traded only when the last
        sync found atlas grantable but for the limit (its share has room, our
        part of it too): the sync that takes the cedar slot back then grants
        the supplier we hold fewest of first (``SCRIPT``).
        """
        mine = self.leased[supplier]
        if mine < 2 or self.leased_total < self.allowed_total:
            return False
        return any(
            self.leased[other] + 1 < mine
            and not self.free[other]  # else its waiters' own sync gets it, nothing to trade
            and self.grantable[other]  # else Redis would hand back the same supplier
            and any(not granted.done() for _, granted in queue)
            for other, queue in self._waiting.items()
            if other != supplier
        )

    def _take(self, supplier: str) -> None:
        self._held[supplier] += 1
        self.in_use += 1
        if self._held[supplier] >= self.leased[supplier]:
            self._idle_since[supplier] = None

    def _clock_idle(self, supplier: str) -> None:
        """Start (or stop) the clock of ``supplier``'s idle leases."""
        if self._held[supplier] >= self.leased[supplier]:
            self._idle_since[supplier] = None
        elif self._idle_since[supplier] is None:
            self._idle_since[supplier] = time.monotonic()

    def linger_left(self) -> float:
        """Seconds until the oldest idle slot has been idle for ``LINGER`` (inf: none is)."""
        since = [at for at in self._idle_since.values() if at is not None]
        if not since:
            return math.inf
        return max(0.0, min(since) + LINGER - time.monotonic())

    def _idle_long(self, supplier: str, now: float) -> bool:
        """Whether a leased slot of ``supplier`` has been idle for ``LINGER``."""
        since = self._idle_since[supplier]
        return since is not None and now - since >= LINGER - IDLE_SLACK

    def _hand_over(self, supplier: str) -> bool:
        """The slot just freed (or granted) goes to ``supplier``'s first live waiter."""
        queue = self._waiting[supplier]
        while queue:
            _, granted = queue.popleft()
            if not granted.done():  # else cancelled, about to leave
                self._take(supplier)
                granted.set_result(None)
                return True
        return False

    def _hand_out_local(self) -> None:
        """Own limits: the oldest waiter whose supplier is under its share, while slots are free."""
        while self.in_use < self.limit:
            chosen: str | None = None
            first = -1
            for supplier, queue in self._waiting.items():
                while queue and queue[0][1].done():
                    queue.popleft()
                fits = bool(queue) and self._held[supplier] < self.share
                if fits and (chosen is None or queue[0][0] < first):
                    chosen, first = supplier, queue[0][0]
            if chosen is None:
                return
            _, granted = self._waiting[chosen].popleft()
            self._take(chosen)
            granted.set_result(None)


class FleetRetryBudget:
    """One supplier's retry budget: a local pool drawn from the fleet's bucket in Redis.

    Satisfies ``retry.RetryLimiter``; nothing here awaits. Spending and
    paying off touch only the pool. A pool below half its ``target`` asks the
    next sync (at once, while the bucket had tokens) to withdraw up to the
    target; what is earned or paid back above it is deposited at the next
    sync. While Redis is out of reach ``local``, a full per-process
    ``RetryBudget``, decides instead.

    The target is one burst of this worker: every request it serves at once
    may need its retry in the same millisecond (eight 503s together), before
    any sync could answer. Pools count against the bucket (see ``SCRIPT``),
    so a larger pool never lets the fleet spend more than one bucket.
    """

    def __init__(
        self,
        capacity: float,
        earn_per_request: float,
        *,
        burst: int,
        need_sync: Callable[[float], None],
    ) -> None:
        self.capacity = capacity
        self.earn_per_request = earn_per_request
        self.target = min(capacity, max(2.0, burst))
        self.local = RetryBudget(capacity, earn_per_request)
        self.fleet = False
        self.pool = 0.0
        """Tokens withdrawn from the fleet's bucket, ours to spend."""
        self.bucket = capacity
        """The fleet bucket's level at the last sync."""
        self._surplus = 0.0
        self._need_sync = need_sync

    @property
    def tokens(self) -> float:
        """Retries this worker could still spend now (its pool and the bucket it last saw)."""
        return self.pool + self.bucket if self.fleet else self.local.tokens

    @property
    def wants_tokens(self) -> bool:
        """The pool is low and the bucket had tokens: worth a sync of its own."""
        return self.fleet and self.pool < self.target / 2 and self.bucket >= 1

    def first_attempt(self) -> None:
        """Every request earns a small share of a retry (in both books: see the class)."""
        self.local.first_attempt()
        if self.fleet:
            self._credit(self.earn_per_request)

    def try_spend(self) -> bool:
        """Take one retry from the pool (or, while Redis is away, from ``local``)."""
        if not self.fleet:
            return self.local.try_spend()
        if self.pool < 1:
            if self.bucket >= 1:
                self._need_sync(0.0)
            return False
        self.pool -= 1
        if self.pool < self.target / 2 and self.bucket >= 1:
            self._need_sync(0.0)
        return True

    def paid_off(self) -> None:
        """The retry brought a quote: its token comes back."""
        if self.fleet:
            self._credit(1.0)
        else:
            self.local.paid_off()

    def _credit(self, amount: float) -> None:
        self.pool += amount
        if self.pool > self.target:
            self._surplus += self.pool - self.target
            self.pool = self.target

    def report(self, leaving: bool) -> tuple[float, int, float]:
        """For the next sync: tokens to deposit (handed over now), to withdraw, and the pool."""
        deposit, self._surplus = self._surplus, 0.0
        if leaving:
            deposit, self.pool = deposit + self.pool, 0.0
            return deposit, 0, 0.0
        withdraw = math.ceil(self.target - self.pool) if self.pool < self.target / 2 else 0
        return deposit, withdraw, self.pool

    def apply(self, taken: int, level: float) -> None:
        """A sync's answer: the tokens withdrawn, and the bucket's level."""
        self.fleet = True
        self.pool += taken
        self.bucket = level

    def go_local(self) -> None:
        """Redis is out of reach: ``local`` decides until it is back."""
        self.fleet = False


class Coordinator:
    """One worker's link to the fleet: the Redis client, the script, heartbeat and listener.

    Built with no I/O; ``start`` opens nothing that can block (the first sync
    runs in the background), ``close`` says goodbye and closes every task and
    connection. ``slots`` and ``budgets`` are what the supplier client uses.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        suppliers: Iterable[str],
        share: int | None = None,
        retry_budget_capacity: float | None = None,
        worker_id: str | None = None,
    ) -> None:
        """``suppliers``: the catalogue's names; ``share`` and ``retry_budget_capacity``, one
        for them all (fleet mode keeps a single value of each), default to the settings'."""
        if settings.redis_url is None:
            raise ValueError("fleet mode needs a redis_url")
        self.worker_id = worker_id or uuid.uuid4().hex
        self._id_bytes = self.worker_id.encode()
        self.settings = settings
        prefix = settings.redis_prefix
        self._keys = [f"{prefix}:workers", f"{prefix}:state", f"{prefix}:tokens", f"{prefix}:epoch"]
        self.channel = f"{prefix}:freed"
        self._suppliers = tuple(suppliers)
        if share is None:
            share = settings.supplier_share or max(
                1, settings.outbound_limit - (len(self._suppliers) - 1)
            )
        self.share = share
        self.retry_budget_capacity = (
            settings.retry_budget_capacity
            if retry_budget_capacity is None
            else retry_budget_capacity
        )
        self.slots = FleetSlots(
            settings.outbound_limit,
            share,
            self._suppliers,
            need_sync=self.request_sync,
            lapsed=self._lapsed,
        )
        self.budgets = {
            supplier: FleetRetryBudget(
                self.retry_budget_capacity,
                settings.retry_budget_earn,
                burst=settings.inbound_limit,
                need_sync=self.request_sync,
            )
            for supplier in self._suppliers
        }
        self.up = False
        """The last sync succeeded: leases are in force."""
        self.joined = False
        """A sync ever succeeded: a Redis without our epoch has been emptied since."""
        self.syncs = {"ok": 0, "failed": 0}
        self.workers = 0
        """Live workers the last sync saw, this one included."""
        self._down_since: float | None = None
        self._closing = False
        self._redis: Redis | None = None
        self._script: AsyncScript | None = None
        self._errors: tuple[type[BaseException], ...] = (OSError, TimeoutError)
        self._tasks: set[asyncio.Task[None]] = set()
        self._listener: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._due = math.inf
        self._timer: asyncio.TimerHandle | None = None
        self._announced_at = -math.inf
        self._synced_at = -math.inf
        self._forced = False
        self._generation = 0

    async def start(self) -> None:
        """Create the client and the background tasks; Redis need not answer yet."""
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import RedisError

        assert self.settings.redis_url is not None
        timeout = self.settings.redis_timeout
        self._errors = (RedisError, OSError, TimeoutError)
        self._redis = Redis.from_url(
            self.settings.redis_url,
            socket_timeout=timeout,
            socket_connect_timeout=timeout,
            # A failed call is not retried by the client: the next sync is the retry.
            retry=Retry(NoBackoff(), 0),
        )
        self._script = self._redis.register_script(SCRIPT)
        self._loop = asyncio.get_running_loop()
        self._spawn(self._run(), "quoteflow-fleet-sync")
        self._listener = self._spawn(self._listen(self._generation), "quoteflow-fleet-listener")
        self._set_due(self._loop.time())

    async def close(self) -> None:
        """Say goodbye (slots and tokens back at once, best effort), then close everything."""
        self._closing = True
        self._wake.set()
        # On Python 3.11 a cancellation that meets redis-py inside its connect
        # (asyncio.wait_for) can be lost: both loops also stop on _closing,
        # within one LISTEN_WAKE or one Redis call, so they are cancelled and
        # waited for until they have ended.
        while self._tasks:
            for task in self._tasks:
                task.cancel()
            await asyncio.wait(set(self._tasks), timeout=2 * LISTEN_WAKE)
        if self._timer is not None:
            self._timer.cancel()
        if self._redis is None:
            return
        if self.joined:
            await self._sync(leaving=True)
        await self._redis.aclose()

    def request_sync(self, delay: float, *, force: bool = False) -> None:
        """Have the state checked within ``delay`` s, and a sync run if it is worth one.

        ``force``: sync whatever the state looks like (a slot was freed
        elsewhere, Redis was emptied, a give-back). Requests fold into one
        already due sooner.
        """
        if self._closing or self.slots.mode == LOCAL:
            return  # while Redis is away only the reconnect timer tries it
        self._forced = self._forced or force
        at = self._loop.time() + delay
        if at < self._due:
            self._set_due(at)

    # -- background -------------------------------------------------------------------

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _set_due(self, at: float) -> None:
        self._due = at
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if at <= self._loop.time():
            self._wake.set()
        else:
            self._timer = self._loop.call_at(at, self._wake.set)

    async def _run(self) -> None:
        """One sync at a time; whatever was asked for meanwhile goes in the next one."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            if self._closing:
                return
            now = self._loop.time()
            since = now - self._synced_at
            if self.up and not self._forced and since < HEARTBEAT and not self._worth(since):
                heartbeat = self._synced_at + HEARTBEAT
                poll = self._synced_at + POLL if self.slots.waiting else math.inf
                # A slot idle for less than LINGER was not worth a sync yet;
                # the check for it must not wait for the heartbeat.
                idle = now + self.slots.linger_left()
                self._set_due(min(heartbeat, poll, idle))
                continue
            self._forced = False
            self._synced_at = now
            self._set_due(now + (HEARTBEAT if self.up else RECONNECT))
            await self._sync()

    def _worth(self, since: float) -> bool:
        return self.slots.worth_syncing(since) or any(
            budget.wants_tokens for budget in self.budgets.values()
        )

    async def _sync(self, *, leaving: bool = False) -> None:
        """One EVALSHA: this worker's whole state in, grants, allowance and tokens out.

        ARGV: worker id, ttl ms, limit, share, want-fresh ms, quiet ms, joined
        (0/1), leaving (0/1), bucket capacity, channel, n suppliers, may
        announce ``wanted`` (0/1), then per supplier: name, held, want, tokens
        deposited, whole tokens to withdraw, tokens in the pool.
        Reply: quiet (0/1), others waiting (0/1), allowed total, live workers,
        announced ``wanted`` (0/1), then per supplier: granted, allowed, free,
        grantable (free but for the whole limit), tokens withdrawn, bucket level.
        """
        assert self._script is not None
        n = len(self._suppliers)
        if leaving:
            held, want = [0] * n, [0] * n
        else:
            held, want = self.slots.report()
        tokens = [self.budgets[supplier].report(leaving) for supplier in self._suppliers]
        args: list[str | int] = [
            self.worker_id,
            round(TTL * 1000),
            self.settings.outbound_limit,
            self.share,
            round(WANT_FRESH * 1000),
            round(QUIET * 1000),
            int(self.joined),
            int(leaving),
            f"{self.retry_budget_capacity:.6f}",
            self.channel,
            n,
            # At most one "wanted" per poll: starved workers must not wake
            # each other in a loop.
            int(self._loop.time() >= self._announced_at + POLL),
        ]
        for index, supplier in enumerate(self._suppliers):
            deposit, withdraw, pool = tokens[index]
            args += [supplier, held[index], want[index], f"{deposit:.6f}", withdraw, f"{pool:.6f}"]
        sent_at = time.monotonic()
        try:
            async with asyncio.timeout(self.settings.redis_timeout):
                reply = await self._script(keys=self._keys, args=args)
        except self._errors as exc:
            self.syncs["failed"] += 1
            self._lost(f"{type(exc).__name__}: {exc}".strip())
            return
        self.syncs["ok"] += 1
        self.joined = True
        if leaving or self._closing:
            return
        self.workers = int(reply[3])
        if reply[4]:
            self._announced_at = self._loop.time()
        per = [reply[5 + 6 * index : 11 + 6 * index] for index in range(n)]
        soon = self.slots.apply(
            granted=[int(p[0]) for p in per],
            allowed=[int(p[1]) for p in per],
            allowed_total=int(reply[2]),
            free=[int(p[2]) for p in per],
            grantable=[int(p[3]) for p in per],
            others_waiting=bool(reply[1]),
            sent_at=sent_at,
        )
        for index, supplier in enumerate(self._suppliers):
            self.budgets[supplier].apply(int(per[index][4]), float(per[index][5]))
        if not self.up:
            self._found()
        if soon is not None:
            self.request_sync(soon)

    def _lost(self, reason: str) -> None:
        """A sync failed: own limits at once, one warning, and a retry every ``RECONNECT``."""
        if self._closing:
            return
        if self.slots.mode != LOCAL:
            self.up = False
            self._down_since = self._loop.time()
            self.slots.go_local()
            for budget in self.budgets.values():
                budget.go_local()
            log_event(
                log,
                logging.WARNING,
                "coordination_down",
                {
                    "worker": self.worker_id,
                    "reason": reason,
                    "fallback": "local limits",
                    "outbound_limit": self.settings.outbound_limit,
                },
            )
        self._set_due(self._loop.time() + RECONNECT)

    def _lapsed(self) -> None:
        self._lost("lease not renewed in time")

    def _found(self) -> None:
        """A sync succeeded after none had, or after a failure: leases are back."""
        self.up = True
        fields: dict[str, object] = {"worker": self.worker_id, "workers": self.workers}
        if self._down_since is not None:
            fields["down_s"] = round(self._loop.time() - self._down_since, 3)
            self._down_since = None
            # The listener may sit on a connection that died without a word.
            if self._listener is not None:
                self._listener.cancel()
            self._generation += 1
            self._listener = self._spawn(self._listen(self._generation), "quoteflow-fleet-listener")
        log_event(log, logging.INFO, "coordination_up", fields)

    async def _listen(self, generation: int) -> None:
        """Sync at once when a slot is freed while we wait, or when Redis was emptied."""
        assert self._redis is not None

        def listening() -> bool:
            return not self._closing and generation == self._generation

        while listening():
            pubsub = self._redis.pubsub()
            try:
                async with asyncio.timeout(RECONNECT):
                    await pubsub.subscribe(self.channel)
                while listening():
                    # A read with a time limit, not a blocking one: see close().
                    message = await pubsub.get_message(
                        ignore_subscribe_messages=True, timeout=LISTEN_WAKE
                    )
                    if message is None:
                        continue
                    kind, _, sender = bytes(message["data"]).partition(b" ")
                    if sender != self._id_bytes and self.slots.heard(kind):
                        self.request_sync(0.0, force=True)
            except self._errors:
                pass
            finally:
                await pubsub.aclose()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
            if listening():
                await asyncio.sleep(RECONNECT)


async def fleet_holdings(client: Redis, prefix: str) -> dict[str, dict[str, int]]:
    """Slots each live worker holds per supplier, as Redis has them (for tests and operators)."""
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
        holdings[name] = {fields[i]: int(fields[i + 1]) for i in range(0, len(fields) - 1, 4)}
    return holdings
