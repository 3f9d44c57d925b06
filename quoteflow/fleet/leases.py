"""The leased slots: ``FleetSlots``, a worker's part of the fleet's outbound limit and shares."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Iterable, Mapping

from quoteflow.fleet.idle import IdleClock
from quoteflow.fleet.safe import capped_wants, safe_share, trimmed_leases
from quoteflow.fleet.timing import LEASE_TRUST, LINGER, POLL
from quoteflow.fleet.trade import lopsided
from quoteflow.fleet.waiters import LocalWaiters
from quoteflow.slots import CartPart, Patience

JOINING, FLEET, LOCAL = "joining", "fleet", "local"
"""Modes of ``FleetSlots``: before the first sync, leases in force, on its own (safe share)."""


class FleetSlots:
    """Outbound slots leased from the fleet's Redis; this worker's safe share while it is away.

    Satisfies ``slots.OutboundLimiter``. Every call comes from the event
    loop's thread and nothing between checking and taking a slot awaits, as in
    ``OutboundSlots``; the ``Coordinator`` moves leases in and out between
    requests (``report`` before a sync, ``apply`` after it). Who waits, and
    whose turn a slot is, is ``waiters.LocalWaiters``'.
    """

    def __init__(
        self,
        limit: int,
        shares: Mapping[str, int],
        suppliers: Iterable[str],
        *,
        need_sync: Callable[[float], None],
        lapsed: Callable[[], None],
        rejoin: float,
        narrow: float,
        cart_slots: int = 0,
    ) -> None:
        self.limit = limit
        self.carts = CartPart(cart_slots)
        """This worker's carts' part of its slots, as ``OutboundSlots``' (``--cart-slots``)."""
        self.shares = dict(shares)
        """Each supplier's share of the fleet's slots, as this worker's catalogue states it."""
        self.mode = JOINING
        self.workers = 0
        """Live workers the last sync saw (0: none yet): the safe share divides by it."""
        self.rank: int | None = None
        """This worker's place among them, by id (``safe.safe_share`` for a small share)."""
        self.local_limit = 1
        self.local_share = dict.fromkeys(suppliers, 1)
        """What this worker may use on its own (``LOCAL``): in all, and per supplier."""
        self._rejoin = rejoin
        self._narrow = narrow
        """Seconds after going local before the whole safe share (``go_local``)."""
        self._capped_until = -math.inf
        """Until then (monotonic) leases are asked for only up to the safe share."""
        self._widen: asyncio.TimerHandle | None = None
        self.in_use = 0
        """Slots this process's attempts hold now."""
        self._held = dict.fromkeys(suppliers, 0)
        self.leased = dict.fromkeys(self._held, 0)
        """Slots Redis granted this worker, per supplier; at least ``held`` in fleet mode."""
        self.leased_total = 0
        self.allowed = {supplier: self.shares[supplier] for supplier in self._held}
        self.allowed_total = limit
        self.free, self.grantable = dict.fromkeys(self._held, 0), dict.fromkeys(self._held, 0)
        """Slots the last sync could still have granted us, per supplier; and but for the limit."""
        self.others_waiting = False
        self.unmet = dict.fromkeys(self._held, 0)
        """Waiters Redis knows of (reported, not granted), per supplier."""
        self._idle = IdleClock(self._held)
        self._reported, self._recorded = dict.fromkeys(self._held, 0), dict.fromkeys(self._held, 0)
        """What Redis counts as ours after the last sync, per supplier."""
        self.valid_until = -math.inf
        self._waiters = LocalWaiters(self._held, self.carts, self._linger_over)
        self._need_sync = need_sync
        self._lapsed = lapsed

    def held(self, supplier: str) -> int:
        """Slots ``supplier``'s attempts hold now, in this process."""
        return self._held[supplier]

    @property
    def waiting(self) -> int:
        """Attempts of this process waiting for a slot."""
        return self._waiters.total

    async def acquire(
        self, supplier: str, patience: Patience | None = None, *, later: bool = False
    ) -> bool:
        """Take a slot for ``supplier``: an idle leased one at once, else wait in turn.

        With ``patience``, the wait ends False — holding nothing, out of this
        worker's queue — once the attempt could no longer finish in time.
        ``later`` (a cart's call) waits as ``slots.CartPart`` says, in this worker.
        """
        if (
            self.mode == FLEET
            and self._held[supplier] < self.leased[supplier]
            and self._waiters.may_take(supplier, later, self.in_use)
        ):
            if time.monotonic() < self.valid_until:
                self._take(supplier, later)
                return True
            self._lapsed()  # no renewal in time: Redis may have given these away
        if (
            self.mode == LOCAL
            and self.in_use < self.local_limit
            and self._held[supplier] < self.local_share[supplier]
            and self._waiters.may_take(supplier, later, self.in_use)
        ):
            self._take(supplier, later)
            return True
        granted: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        if patience is not None and not self._waiters.watch(patience, granted):
            return False  # too late already: never queued, never announced
        waiter = self._waiters.join(supplier, granted, later=later, in_use=self.in_use)
        if self.mode != LOCAL:
            # At once if the last sync saw a slot we could get, or Redis does
            # not know yet that we wait (then nobody would tell us of a freed
            # slot). Otherwise a slot must be freed first, and its holder's
            # sync announces it.
            soon = self.mode == JOINING or self.free[supplier] > 0 or self._unannounced(supplier)
            self._need_sync(0.0 if soon else POLL)
        try:
            if await granted:
                return True
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled() and granted.result():
                self.release(supplier, later=later)  # handed a slot, then cancelled before using it
            else:
                self._waiters.leave(supplier, waiter)  # unless a hand-out passed over it
                self._waiters.forget(granted)
                self._check_want(supplier)
            raise
        # Gave up: its place goes to a waiter that can still use a slot, and
        # Redis soon stops counting the want.
        self._waiters.leave(supplier, waiter)
        self._check_want(supplier)
        return False

    def reconsider(self) -> None:
        """A supplier's learned time grew: every waiter's patience is read again now."""
        self._waiters.reconsider()

    def try_acquire(self, supplier: str, *, later: bool = False) -> bool:
        """A slot now (a hedge): an idle leased one, or room on its own share; never waits."""
        if not self._waiters.may_take(supplier, later, self.in_use):
            return False
        if self.mode == FLEET and self._held[supplier] < self.leased[supplier]:
            if time.monotonic() < self.valid_until:
                self._take(supplier, later)
                return True
            return False
        if (
            self.mode == LOCAL
            and self.in_use < self.local_limit
            and self._held[supplier] < self.local_share[supplier]
        ):
            self._take(supplier, later)
            return True
        return False

    def release(self, supplier: str, *, later: bool = False) -> None:
        """Give back ``supplier``'s slot: to Redis if we hold too many, else to a local waiter."""
        self._held[supplier] -= 1
        self.in_use -= 1
        if later:
            self.carts.held -= 1
        elif self.in_use == self.carts.held:
            self.carts.singles_gone()  # this worker's last single quote's slot
        if self.mode == FLEET and time.monotonic() >= self.valid_until:
            self._lapsed()  # handing the slot on would use a lease Redis may have given away
        if self.mode == FLEET:
            if (
                self.leased[supplier] > self.allowed[supplier]
                or self.leased_total > self.allowed_total
                or lopsided(
                    supplier,
                    self.leased,
                    self.leased_total,
                    self.allowed_total,
                    self.free,
                    self.grantable,
                    self._waiters.live,
                )
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
            self._idle.update(supplier, self._held[supplier], self.leased[supplier])
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

        On its own it claims its local share, so the sync that brings it back
        frees nothing it may still take meanwhile; idle claims go back as
        idle slots do. On its own, and for a while after the leases came back
        into force, what is asked for stops at the safe share (``capped_wants``).
        """
        held, want = [], []
        now = time.monotonic()
        claim = self._held
        if self.mode == LOCAL:
            claim = trimmed_leases(claim, self.local_share, self.local_limit, self.local_share)
        # Only leases still in force, and only within our whole fair part: a
        # worker above it gives every idle slot back.
        may_keep = (
            self.mode == FLEET
            and now < self.valid_until
            and self.leased_total <= self.allowed_total
        )
        for supplier in self._held:
            keep = claim[supplier]
            if may_keep and not self._idle.idle_long(supplier, now):
                keep = max(keep, min(self.leased[supplier], self.allowed[supplier]))
            self.leased[supplier] = self._recorded[supplier] = keep
            self._idle.update(supplier, self._held[supplier], self.leased[supplier])
            self._reported[supplier] = self._waiters.wanted(supplier, self.in_use)
            held.append(keep)
            want.append(self._reported[supplier])
        self.leased_total = sum(self.leased.values())
        if self.mode == LOCAL or now < self._capped_until:
            # For ``rejoin`` seconds after a sync put the leases in force, other
            # workers may still be on their own (``safe.capped_wants``).
            total, per = self.safe_limits()
            want = capped_wants(held, want, total, [per[supplier] for supplier in self._held])
            self._reported = dict(zip(self._held, want, strict=True))
        return held, want

    def retarget(self, shares: Mapping[str, int]) -> None:
        """A reload's shares from now on; a supplier new to this worker starts with nothing.

        A lowered share is reached as leases lapse and attempts end, never by
        cutting one in flight (Doorman's rule): the next syncs grant against
        the new share, and what is held above it goes back when released.
        A supplier the reload removed keeps its entry until ``forget``.
        """
        for supplier, share in shares.items():
            self.shares[supplier] = share
            if supplier not in self._held:
                self._held[supplier] = self.leased[supplier] = 0
                self.allowed[supplier] = share
                self.free[supplier] = self.grantable[supplier] = self.unmet[supplier] = 0
                self._idle.add_supplier(supplier)
                self._reported[supplier] = self._recorded[supplier] = 0
                self._waiters.add_supplier(supplier)
                self.local_share[supplier] = 1 if self.mode == JOINING else 0
                if self.mode == LOCAL:
                    self.local_share[supplier] = self.safe_limits()[1][supplier]
            else:
                self.allowed[supplier] = min(self.allowed[supplier], share)
        self._need_sync(0.0)

    def forget(self, suppliers: Iterable[str]) -> None:
        """Drop suppliers a reload removed, once no request can still ask them."""
        for supplier in suppliers:
            if supplier in self._held and not self._held[supplier]:
                for table in (
                    self._held,
                    self.leased,
                    self.allowed,
                    self.free,
                    self.grantable,
                    self.unmet,
                    self._reported,
                    self._recorded,
                    self.local_share,
                    self.shares,
                ):
                    table.pop(supplier, None)
                self._waiters.drop_supplier(supplier)
                self._idle.drop_supplier(supplier)
        self.leased_total = sum(self.leased.values())
        self._need_sync(0.0)

    @property
    def suppliers(self) -> tuple[str, ...]:
        """The suppliers this worker holds slots for, in the order ``report`` gives them."""
        return tuple(self._held)

    def safe_limits(self) -> tuple[int, dict[str, int]]:
        """This worker's safe share: of the limit, and of each supplier's share (``safe``)."""
        return safe_share(self.limit, self.workers), {
            supplier: safe_share(self.shares[supplier], self.workers, self.rank)
            for supplier in self._held
        }

    def apply(
        self,
        granted: list[int],
        allowed: list[int],
        allowed_total: int,
        free: list[int],
        grantable: list[int],
        others_waiting: bool,
        sent_at: float,
        workers: int,
        rank: int | None = None,
    ) -> float | None:
        """Take a sync's answer: leases in force, grants handed to waiters.

        Returns how soon the next sync should come, or None for the heartbeat.
        """
        if self.mode == LOCAL:
            # Leases back in force: asked for only up to the safe share for a
            # while (see _capped_wants), and the count of workers kept from
            # before, since Redis may not have heard from the others yet.
            self._capped_until = time.monotonic() + self._rejoin
            if self._widen is not None:
                self._widen.cancel()
                self._widen = None
        capped = time.monotonic() < self._capped_until
        if capped:
            workers = max(workers, self.workers)
        self.workers = workers
        self.rank = rank
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
        if capped:
            # Slots taken on our own limits while this sync was on its way come
            # on top of grants asked for within the safe share: the rest go back.
            total, per = self.safe_limits()
            kept = trimmed_leases(self._held, self.leased, total, per)
            undercounted |= any(kept[s] < self.leased[s] for s in kept)
            self.leased.update(kept)
        for supplier in self._held:
            while self._held[supplier] < self.leased[supplier] and self._hand_over(supplier):
                pass
            self._idle.update(supplier, self._held[supplier], self.leased[supplier])
        self.leased_total = sum(self.leased.values())
        if undercounted:
            return 0.0
        if self._waiters.any_live():
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
        for supplier in self._held:
            if self.leased[supplier] != self._recorded[supplier]:
                return True  # given back, or taken on local limits: Redis counts wrong
            if self._idle.idle_long(supplier, now):
                return True  # no taker of our own came within LINGER: back to the fleet
            if self._waiters.live(supplier):
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
        """Redis is out of reach: the safe share, for every waiter at once; narrower at first.

        Other workers may go on starting attempts on leases granted before
        Redis went away for up to ``LEASE_TRUST`` (they trust a lease that
        long), and such an attempt runs for up to a budget. For ``narrow``
        seconds (the two together) this worker keeps within its own leases
        too — which Redis counted against theirs — as well as within its safe
        share; then it widens to the safe share. Alone at the last sync, or
        never joined (no fleet it knows of: one attempt at a time), it has
        nobody's leases to wait for: the safe share at once.
        """
        was = self.mode
        self.mode = LOCAL
        total, per = self.safe_limits()
        if was == JOINING or self.workers <= 1:
            self.local_limit, self.local_share = total, per
        else:
            self.local_limit = min(total, self.leased_total)
            self.local_share = {s: min(per[s], self.leased[s]) for s in per}
            loop = asyncio.get_running_loop()
            self._widen = loop.call_later(self._narrow, self._widen_to_safe_share)
        self._hand_out_local()

    def _widen_to_safe_share(self) -> None:
        """Attempts on leases granted before Redis went away are over: the whole safe share."""
        self._widen = None
        if self.mode == LOCAL:
            self.local_limit, self.local_share = self.safe_limits()
            self._hand_out_local()

    # -- helpers ----------------------------------------------------------------------

    def _check_want(self, supplier: str) -> None:
        """The last waiter for ``supplier`` is gone: soon, Redis should stop counting it."""
        if self.unmet[supplier] and not self._waiters.live(supplier):
            self._need_sync(LINGER)  # worth_syncing finds unmet without waiters

    def _take(self, supplier: str, later: bool) -> None:
        self._held[supplier] += 1
        self.in_use += 1
        if later:
            self.carts.held += 1
        self._idle.taken(supplier, self._held[supplier], self.leased[supplier])

    def linger_left(self) -> float:
        """Seconds until the oldest idle slot has been idle for ``LINGER`` (inf: none is)."""
        return self._idle.linger_left()

    def _linger_over(self) -> None:
        """Carts may take more now: idle slots to them; a sync tells Redis they want more."""
        if self.mode == LOCAL:
            self._hand_out_local()
        else:
            self._need_sync(0.0)

    def _hand_over(self, supplier: str) -> bool:
        """The slot just freed (or granted) goes to ``supplier``'s first waiter that can use it."""
        found = self._waiters.next_ready(supplier, self.in_use)
        if found is None:
            return False
        granted, later = found
        self._take(supplier, later)
        granted.set_result(True)
        return True

    def _hand_out_local(self) -> None:
        """On its own: the oldest waiter whose supplier is within its safe share, while room is."""
        while self.in_use < self.local_limit:
            turn = self._waiters.next_in_turn(
                lambda supplier: self._held[supplier] < self.local_share[supplier], self.in_use
            )
            if turn is None:
                return
            supplier, granted, later = turn
            if self._waiters.ready(granted):  # else too late to use it: answered False
                self._take(supplier, later)
                granted.set_result(True)
