"""The coordinator: one worker's link to Redis — the sync script, heartbeat, listener, fallback."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from quoteflow.catalogue import default_share as default_share_of
from quoteflow.config import Settings
from quoteflow.fleet import timing
from quoteflow.fleet.budget import FleetHedgeBudget, FleetRetryBudget, rehedge
from quoteflow.fleet.client import discovery_limit, redis_client
from quoteflow.fleet.deadline import LoopFairTimeout
from quoteflow.fleet.hosts import HostCheck, worker_identity
from quoteflow.fleet.leases import LOCAL, FleetSlots
from quoteflow.fleet.listener import listen, pause_of
from quoteflow.fleet.script import (
    HEAD,
    HEDGE_ENTRY,
    PER,
    SCRIPT,
    SERVER_CHECK,
    entry,
    keys,
    text,
)
from quoteflow.logs import log_event
from quoteflow.pauses import Pauses

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.asyncio.sentinel import Sentinel
    from redis.commands.core import AsyncScript

log = logging.getLogger("quoteflow")


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
        shares: Mapping[str, int] | None = None,
        capacities: Mapping[str, float] | None = None,
        hedges: Mapping[str, tuple[int, float]] | None = None,
        worker_id: str | None = None,
        pauses: Pauses | None = None,
    ) -> None:
        """``suppliers``: the catalogue's names; ``shares`` and ``capacities`` (retry bucket
        sizes), each supplier's own, default to the settings' for every supplier;
        ``hedges``: each hedged supplier's hedge bucket (``burst``, ``earn``)."""
        if not settings.fleet:
            raise ValueError("fleet mode needs a redis_url or sentinels")
        self.worker_id = worker_id or worker_identity()
        self._id_bytes = self.worker_id.encode()
        self.settings = settings
        prefix = settings.redis_prefix
        self._keys = keys(prefix)
        self.hosts = HostCheck(self.worker_id, prefix)
        """This worker's statement of the fleet's settings, and the hosts that differ."""
        self.channel = f"{prefix}:freed"
        self._suppliers = tuple(suppliers)
        default_share = default_share_of(settings, len(self._suppliers))
        self.shares = {
            supplier: default_share if shares is None else shares[supplier]
            for supplier in self._suppliers
        }
        self.capacities = {
            supplier: settings.retry_budget_capacity if capacities is None else capacities[supplier]
            for supplier in self._suppliers
        }
        trips = timing.FIRST_SYNC_TRIPS * settings.redis_timeout
        self._first_limit = trips + discovery_limit(settings)
        """The time limit of a sync while not up (joining, coming back: the sentinels asked too)."""
        self._call_most = self._first_limit + timing.LATE_LOOP_MOST
        """The longest one sync may take: its time limit, and what a busy loop may add."""
        self.slots = FleetSlots(
            settings.outbound_limit,
            self.shares,
            self._suppliers,
            need_sync=self.request_sync,
            lapsed=self._lapsed,
            # Another worker's last failed try may have just begun: it ends
            # within _call_most, tries again RECONNECT later and reports
            # within _call_most more. Until then it may be on its own.
            rejoin=timing.RECONNECT + 2 * self._call_most,
            narrow=timing.narrow(settings.budget),
            cart_slots=settings.carts_part,
        )
        self.budgets = {s: self._retry_budget(self.capacities[s]) for s in self._suppliers}
        self.hedge_budgets: dict[str, FleetHedgeBudget] = {}
        """Each hedged supplier's hedge bucket, lent to this worker in a pool as retries are."""
        rehedge(self.hedge_budgets, hedges or {}, settings.inbound_limit, self.request_sync)
        self.pauses = pauses
        """Suppliers paused after a 429: a pause one worker learns, it tells every other."""
        if pauses is not None:
            pauses.announce = self.announce_pause
        self.up = False
        """The last sync succeeded: leases are in force."""
        self.joined = False
        """A sync ever succeeded: a Redis without our epoch has been emptied since."""
        self.syncs = {"ok": 0, "late_loop": 0, "failed": 0}
        """Syncs by result; ``late_loop``: answered, read past the time limit by a busy loop."""
        self.switches, self.past_grace = 0, 0
        """Times the fleet moved to another server; outages this worker spent alone past grace."""
        self.on_switch: list[Callable[[], None]] = []
        """Called when the fleet moved to another server: what was leased from the old is void."""
        # When it last looked at the server, which it saw, and the last switch counted.
        self._checked_at, self._server_id, self._switched_to = -math.inf, "", ""
        self.workers = 0
        """Live workers the last sync saw, this one included."""
        self._down_since: float | None = None
        self._closing = self._forced = False
        self._redis: Redis | None = None
        self._sentinels: Sentinel | None = None
        self._script: AsyncScript | None = None
        self._errors: tuple[type[BaseException], ...] = (OSError, TimeoutError)
        self._slow: tuple[type[BaseException], ...] = self._errors
        self._tasks: set[asyncio.Task[None]] = set()
        self._listener: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._due = self._past_grace_at = math.inf
        self._timer: asyncio.TimerHandle | None = None
        self._announced_at = self._synced_at = -math.inf
        self._generation = 0

    async def start(self) -> None:
        """Create the client and the background tasks; Redis need not answer yet."""
        from redis.exceptions import RedisError
        from redis.exceptions import TimeoutError as RedisTimeout

        self._errors, self._slow = (RedisError, OSError, TimeoutError), (RedisTimeout, TimeoutError)
        # The client's time limit is only a backstop: each sync's own deadline
        # (LoopFairTimeout) is the time limit. redis-py's would fire when our
        # busy loop reads a reply late, and count it as Redis being slow.
        self._redis, self._sentinels = redis_client(self.settings, timeout=self._call_most)
        self._script = self._redis.register_script(SCRIPT)
        self._loop = asyncio.get_running_loop()
        self._started_at = self._loop.time()
        self._spawn(self._run(), "quoteflow-fleet-sync")
        self._relisten()
        self._set_due(self._loop.time())
        stating = self.hosts.keep_checking(
            self._redis,
            limit=self.settings.outbound_limit,
            shares=self.shares,
            up=lambda: self.up,
            running=lambda: not self._closing,
            errors=self._errors,
            call_limit=self._call_most,
        )
        self._spawn(stating, "quoteflow-fleet-hosts")

    @property
    def redis(self) -> Redis:
        """The Redis client, once started: other fleet-wide state (callers' rates) shares it."""
        assert self._redis is not None, "start() first"
        return self._redis

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
            await asyncio.wait(set(self._tasks), timeout=2 * timing.LISTEN_WAKE)
        if self._timer is not None:
            self._timer.cancel()
        if self._redis is None:
            return
        if self.joined:
            await self._sync(leaving=True)
        await self._redis.aclose()
        if self._sentinels is not None:
            await self._sentinels.aclose()

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
            if self.up and not self._forced and since < timing.HEARTBEAT and not self._worth(since):
                heartbeat = self._synced_at + timing.HEARTBEAT
                poll = self._synced_at + timing.POLL if self.slots.waiting else math.inf
                # A slot idle for less than LINGER was not worth a sync yet;
                # the check for it must not wait for the heartbeat.
                idle = now + self.slots.linger_left()
                self._set_due(min(heartbeat, poll, idle))
                continue
            self._forced = False
            self._synced_at = now
            self._set_due(now + (timing.HEARTBEAT if self.up else timing.RECONNECT))
            await self._sync()

    def retarget(
        self,
        shares: Mapping[str, int],
        capacities: Mapping[str, float],
        hedges: Mapping[str, tuple[int, float]] | None = None,
    ) -> None:
        """A reload's suppliers, shares, retry and hedge buckets, sent with the next sync.

        Redis keeps no limit of its own: what each worker sends is what holds,
        so while workers of two catalogues overlap a supplier's share holds at
        the larger of the two, and the outbound limit always.
        """
        self.slots.retarget(shares)
        for supplier, capacity in capacities.items():
            self.shares[supplier] = shares[supplier]
            self.capacities[supplier] = capacity
            budget = self.budgets.get(supplier)
            if budget is None:
                self.budgets[supplier] = self._retry_budget(capacity)
            elif budget.capacity != capacity:
                budget.resize(capacity)
        rehedge(self.hedge_budgets, hedges or {}, self.settings.inbound_limit, self.request_sync)
        self._suppliers = self.slots.suppliers

    def _retry_budget(self, capacity: float) -> FleetRetryBudget:
        earn, burst = self.settings.retry_budget_earn, self.settings.inbound_limit
        return FleetRetryBudget(capacity, earn, burst=burst, need_sync=self.request_sync)

    def forget(self, suppliers: Iterable[str]) -> None:
        """Drop suppliers a reload removed, once no request can still ask them."""
        gone = tuple(suppliers)
        self.slots.forget(gone)
        self._suppliers = self.slots.suppliers
        for supplier in gone:
            if supplier not in self._suppliers:
                self.budgets.pop(supplier, None)
                self.hedge_budgets.pop(supplier, None)
                self.shares.pop(supplier, None)
                self.capacities.pop(supplier, None)

    def announce_pause(self, supplier: str, seconds: float) -> None:
        """Tell every worker that ``supplier`` asked (429 ``Retry-After``) to wait ``seconds``."""
        if self._redis is None or self._closing:
            return  # on its own, the pause is this worker's; the others learn from their 429
        message = f"paused {self.worker_id} {supplier} {round(seconds * 1000)}"
        self._spawn(self._publish(message), "quoteflow-fleet-pause")

    async def _publish(self, message: str) -> None:
        assert self._redis is not None
        try:
            async with asyncio.timeout(self.settings.redis_timeout * 4):
                await self._redis.publish(self.channel, message)
        except self._errors:
            pass  # the others learn from their own next 429

    def _worth(self, since: float) -> bool:
        return self.slots.worth_syncing(since) or any(
            budget.wants_tokens for budget in (*self.budgets.values(), *self.hedge_budgets.values())
        )

    async def _sync(self, *, leaving: bool = False) -> None:
        """One EVALSHA: this worker's whole state in, grants, allowance and tokens out.

        Its arguments and reply: ``script.py``.
        """
        assert self._script is not None
        n = len(self._suppliers)
        if leaving:
            held, want = [0] * n, [0] * n
        else:
            held, want = self.slots.report()
        hedged = [s for s in self._suppliers if s in self.hedge_budgets]
        now = self._loop.time()
        # Which server this runs on is looked at after a failure, and now and then.
        check = not self.up or now >= self._checked_at + SERVER_CHECK
        args: list[str | int] = [
            self.worker_id,
            round(timing.TTL * 1000),
            self.settings.outbound_limit,
            round(timing.WANT_FRESH * 1000),
            round(timing.QUIET * 1000),
            int(self.joined),
            int(leaving),
            self.channel,
            n + len(hedged),
            # At most one "wanted" per poll: starved workers must not wake
            # each other in a loop.
            int(now >= self._announced_at + timing.POLL),
            round(self.settings.redis_outage_grace * 1000),
            int(check and not leaving),
            self._server_id,
        ]
        for index, supplier in enumerate(self._suppliers):
            tokens = self.budgets[supplier].report(leaving)
            share, capacity = self.shares[supplier], self.capacities[supplier]
            args += entry(supplier, held[index], want[index], tokens, share, capacity)
        for supplier in hedged:
            budget = self.hedge_budgets[supplier]
            tokens = budget.report(leaving)
            args += entry(HEDGE_ENTRY.format(supplier), 0, 0, tokens, 0, budget.capacity)
        sent_at = time.monotonic()
        # The time limit is Redis': a reply that came in time but was read
        # late because our loop was busy is not a Redis failure (deadline.py).
        limit = self.settings.redis_timeout if self.up else self._first_limit
        deadline = LoopFairTimeout(limit, longest=self._call_most)
        try:
            async with deadline:
                reply = await self._script(keys=self._keys, args=args)
        except self._errors as exc:
            self.syncs["failed"] += 1
            if self._sentinels is not None:  # ask them again: a refusing primary may be the old
                await self.redis.connection_pool.disconnect(inuse_connections=False)
            self._lost(f"{type(exc).__name__}: {exc}".strip(), slow=isinstance(exc, self._slow))
            return
        self.syncs["late_loop" if deadline.loop_was_late else "ok"] += 1
        self.joined = True
        if check:
            self._checked_at, self._server_id = now, text(reply[7])
        if leaving or self._closing:
            return
        self.workers = int(reply[3])
        if reply[4]:
            self._announced_at = self._loop.time()
        if reply[6]:
            self.switched(self.worker_id, self._server_id)
        per = [reply[HEAD + PER * index : HEAD + PER * (index + 1)] for index in range(n)]
        soon = self.slots.apply(
            granted=[int(p[0]) for p in per],
            allowed=[int(p[1]) for p in per],
            allowed_total=int(reply[2]),
            free=[int(p[2]) for p in per],
            grantable=[int(p[3]) for p in per],
            others_waiting=bool(reply[1]),
            sent_at=sent_at,
            workers=self.workers,
            rank=int(reply[5]),
        )
        for index, supplier in enumerate(self._suppliers):
            self.budgets[supplier].apply(int(per[index][4]), float(per[index][5]))
        for index, supplier in enumerate(hedged, start=n):
            at = HEAD + PER * index
            self.hedge_budgets[supplier].apply(int(reply[at + 4]), float(reply[at + 5]))
        if not self.up:
            if self._down_since is not None and self._redis is not None:
                # Connections that sat idle in the pool through the outage may
                # be dead without a word; the next sync would fail on one.
                await self.redis.connection_pool.disconnect(inuse_connections=False)
            self._found()
        if soon is not None:
            self.request_sync(soon)

    def _lost(self, reason: str, *, slow: bool = False) -> None:
        """A sync failed: the safe share at once, one warning, and a retry every ``RECONNECT``."""
        if self._closing:
            return
        now, retry = self._loop.time(), timing.RECONNECT
        if slow and not self.joined and now < self._started_at + timing.JOIN_PATIENCE:
            self._set_due(now + timing.RETRY_SOON)  # slow to join is not cut off (JOIN_PATIENCE)
            return
        if now >= self._past_grace_at:
            self._still_alone()
        if self.slots.mode != LOCAL:
            # The first retry comes soon: after one slow call, a worker that
            # reports again within TTL keeps its record, and what it uses on
            # its own stays counted in Redis, so nobody is granted it.
            retry = timing.RETRY_SOON
            self.up = False
            self._down_since = self._loop.time()
            self._past_grace_at = self._down_since + self.settings.redis_outage_grace
            self.slots.go_local()
            for budget in (*self.budgets.values(), *self.hedge_budgets.values()):
                budget.go_local(self.slots.workers)
            safe_limit, safe_shares = self.slots.safe_limits()
            fields: dict[str, object] = {"worker": self.worker_id, "reason": reason}
            fields |= {"fallback": "safe share", "workers": self.slots.workers}
            fields |= {"safe_limit": safe_limit, "safe_share": max(safe_shares.values(), default=0)}
            fields["outbound_limit"] = self.settings.outbound_limit
            log_event(log, logging.WARNING, "coordination_down", fields)
        self._set_due(self._loop.time() + retry)

    def _still_alone(self) -> None:
        """Past the grace the others no longer hold back our safe share (the one case where the
        fleet may pass a share, so that it answers with Redis down): said once a minute."""
        assert self._down_since is not None
        if self._past_grace_at == self._down_since + self.settings.redis_outage_grace:
            self.past_grace += 1
        self._past_grace_at = self._loop.time() + timing.PAST_GRACE_EVERY
        fields = {"worker": self.worker_id, "down_s": round(self._loop.time() - self._down_since)}
        fields["grace_s"] = self.settings.redis_outage_grace
        log_event(log, logging.WARNING, "coordination_past_grace", fields)

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
            self._relisten()
        log_event(log, logging.INFO, "coordination_up", fields)

    def switched(self, by: str, server: str) -> None:
        """The fleet is on ``server`` now: the script began the quiet period and told every
        worker; what this worker leased of any rate from the old server is void (``on_switch``)."""
        if server == self._switched_to:
            return  # learnt twice: from another's message and from its own look
        self._switched_to = self._server_id = server
        self.switches += 1
        for void in self.on_switch:
            void()
        fields = {"worker": self.worker_id, "found_by": by, "workers": self.workers}
        log_event(log, logging.WARNING, "coordination_switched", fields)
        if by == self.worker_id:
            self._relisten()  # its subscription may be on the old server, which hears nothing

    def _relisten(self) -> None:
        assert self._redis is not None
        if self._listener is not None:
            self._listener.cancel()
        self._generation += 1
        generation = self._generation
        self._listener = self._spawn(
            listen(
                self._redis,
                self.channel,
                listening=lambda: not self._closing and generation == self._generation,
                heard=self._heard,
                errors=self._errors,
            ),
            "quoteflow-fleet-listener",
        )

    def _heard(self, data: bytes) -> None:
        kind, _, rest = data.partition(b" ")
        sender, _, server = rest.partition(b" ")
        if kind == b"paused":
            pause = pause_of(data, self._id_bytes)
            if pause is not None and self.pauses is not None and pause[0] in self.shares:
                self.pauses.pause(*pause, told_by="fleet")
        elif sender == self._id_bytes:
            return
        elif kind == b"switched":
            self.switched(sender.decode(errors="replace"), server.decode(errors="replace"))
            self.request_sync(0.0, force=True)  # it must learn what we hold
        elif self.slots.heard(kind):
            self.request_sync(0.0, force=True)
