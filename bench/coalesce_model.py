"""``python -m bench.coalesce_model``: the hot workload against an idealised coalescer, offline.

Where does in-flight coalescing land, in supplier requests per answer, in the
``hot`` section's workload (``bench/hot.py``)? This is a discrete-event
simulation of exactly that workload with a coalescer that costs nothing:

- 64 closed-loop callers (wrk's connections): each asks again the instant its
  answer comes, for ``HOT-k`` with probability ∝ 1/k over 50 SKUs;
- each request asks 3 suppliers at once under one deadline 0.8 s after it
  came (a part still missing then is ``timeout``: that request is no answer);
- every supplier answers 50 ms after a call is sent, never fails;
- 6 outbound slots, each supplier at most its share of 4 (the catalogue's
  default), handed out first come, first served as in ``quoteflow/slots.py``;
- a supplier call for a (supplier, SKU) already in flight — waiting for a
  slot or sent — is joined, not made again, as long as the call's starter's
  deadline has not passed (``quoteflow/coalesce.py``'s rule); a call that
  nobody waits for any more is cancelled (a sent one still counts as sent);
- no CPU time anywhere: no event loop, no network, no breaker.

Why the figure is bounded. With every slot busy the suppliers are sent
6 slots ÷ 50 ms = 120 calls a second, C = 40 per supplier.
By Little's law the 64 callers give G = 64 ÷ R answers a second when a
request takes R seconds (and none times out), so one supplier's requests per
answer are C ÷ G = C·R ÷ 64. A request takes at least the 50 ms of its own
call and, while the slots are the bottleneck, as long as its calls queue:
with D distinct SKUs waiting per supplier, about D ÷ C. Coalescing can lower
the figure only by making the queue shorter, and the queue is as long as the
number of distinct SKUs the 64 callers wait for at once — which the Zipf
tail keeps at about 24 of the 50 (``queued`` ÷ 3). Summed over the three suppliers the
figure is three times as large: a summed 0.3 would need 10 answers per call
to every supplier.

Printed per policy (median over seeds, each ``--seconds`` of simulated time
after a warm-up): answers a second, supplier requests per answer per
supplier and summed, the share of requests that timed out, the mean time of
an answer and the mean number of calls waiting for a slot. ``fifo`` is the
real hand-out order; ``no-coalesce`` checks the model against *neither*;
``largest-first`` hands a free slot to the waiting call with the most
waiters (not built: it starves cold SKUs, see its timeout share and
``cold timeouts``, the share of requests for the 30 least popular SKUs that
time out). ``largest-unless-urgent`` is largest-first, except that a call
whose first waiter has less than ``URGENT_S`` left goes first (earliest
deadline first among those): what a starvation-free batching order gains.

Measured (30 s × 5 seeds): ``fifo`` 149 answers/s, 0.269 supplier requests
per answer per supplier (0.806 summed), 1 % timeouts; with a slot held
55 ms 0.275, 60 ms 0.288 (9 % timeouts). ``largest-first`` 0.226, but 58 %
of the cold SKUs' requests time out; ``largest-unless-urgent`` 0.275 (with
the urgency at 0.1–0.6 s: 0.269–0.296, and the fewer cold timeouts, the
closer to ``fifo``): no order that starves nobody does better than the
first come, first served one. ``no-coalesce`` collapses as *neither*
does in the bench (1–4 answers/s, almost every request a timeout): 64
callers × 3 calls queue for 120 calls a second, 1.6 s of queue for a 0.8 s
budget.
"""

from __future__ import annotations

import argparse
import collections
import heapq
import itertools
import random
import statistics
from collections.abc import Callable, Sequence

import attrs

CALLERS = 64
SKUS = 50
SUPPLIERS = ("atlas", "boreal", "cedar")
LATENCY_S = 0.050
BUDGET_S = 0.8
OUTBOUND = 6
SHARE = 4
URGENT_S = 0.3
"""``largest-unless-urgent``: a call whose first waiter has less than this left goes first."""
COLD_FROM = 21
"""``HOT-21`` … ``HOT-50``: the 30 least popular SKUs (together about a fifth of requests)."""


@attrs.define(eq=False)
class _Request:
    sku: int
    started: float
    deadline: float
    calls: dict[str, _Call] = attrs.Factory(dict)
    missing: set[str] = attrs.Factory(lambda: set(SUPPLIERS))
    done: bool = False


@attrs.define(eq=False)
class _Call:
    supplier: str
    sku: int
    starter_deadline: float
    waiters: set[_Request] = attrs.Factory(set)
    sent: bool = False
    over: bool = False


@attrs.frozen
class Figures:
    """What one simulated run measured after its warm-up."""

    goodput: float
    per_supplier: float
    summed: float
    timeouts: float
    cold_timeouts: float
    answer_s: float
    queued: float


class Model:
    """One simulated run of the workload under one hand-out policy."""

    def __init__(
        self, policy: str, seed: int, *, coalesce: bool = True, slot_s: float = LATENCY_S
    ) -> None:
        self.policy = policy
        self.slot_s = slot_s
        """How long a sent call holds its slot: the supplier's 50 ms, plus any overhead."""
        self.coalesce = coalesce
        self.rng = random.Random(seed)
        weights = [1 / k for k in range(1, SKUS + 1)]
        total = sum(weights)
        self.cumulative = list(itertools.accumulate(w / total for w in weights))
        self.now = 0.0
        self.events: list[tuple[float, int, Callable[[], None]]] = []
        self.seq = itertools.count()
        self.calls: dict[tuple[str, int], _Call] = {}
        self.free = OUTBOUND
        self.held = dict.fromkeys(SUPPLIERS, 0)
        self.waiting: collections.deque[_Call] = collections.deque()
        self.counting = False
        self.answers = self.timeouts = self.cold = self.cold_timeouts = 0
        self.sent = 0
        self.answer_time = 0.0
        self.queue_area = 0.0
        self.last_change = 0.0

    # -- the clock -------------------------------------------------------------

    def at(self, when: float, action: Callable[[], None]) -> None:
        heapq.heappush(self.events, (when, next(self.seq), action))

    def run(self, warmup_s: float, seconds: float) -> Figures:
        """Simulate ``warmup_s`` + ``seconds``; figures over the last ``seconds``."""
        for _ in range(CALLERS):
            self.at(0.0, self.ask)
        self.at(warmup_s, self.start_counting)
        end = warmup_s + seconds
        while self.events and self.events[0][0] <= end:
            self.now, _, action = heapq.heappop(self.events)
            action()
        self.note_queue()
        answered = self.answers
        finished = answered + self.timeouts
        per_supplier = self.sent / len(SUPPLIERS) / answered if answered else float("inf")
        return Figures(
            goodput=answered / seconds,
            per_supplier=per_supplier,
            summed=per_supplier * len(SUPPLIERS),
            timeouts=self.timeouts / finished if finished else 0.0,
            cold_timeouts=self.cold_timeouts / self.cold if self.cold else 0.0,
            answer_s=self.answer_time / answered if answered else float("nan"),
            queued=self.queue_area / seconds,
        )

    def start_counting(self) -> None:
        self.note_queue()
        self.counting = True
        self.queue_area = 0.0

    def note_queue(self) -> None:
        """Integrate the number of calls waiting for a slot over time."""
        if self.counting:
            self.queue_area += len(self.waiting) * (self.now - self.last_change)
        self.last_change = self.now

    # -- callers ---------------------------------------------------------------

    def ask(self) -> None:
        """One caller's next request: join or start a call at every supplier."""
        sku = self._draw()
        request = _Request(sku, self.now, self.now + BUDGET_S)
        for supplier in SUPPLIERS:
            key = (supplier, sku)
            call = self.calls.get(key) if self.coalesce else None
            if call is None or self.now >= call.starter_deadline:
                call = _Call(supplier, sku, request.deadline)
                self.calls[key] = call
                call.waiters.add(request)
                self.acquire(call)
            else:
                call.waiters.add(request)
            request.calls[supplier] = call
        self.at(request.deadline, lambda: self.expire(request))

    def _draw(self) -> int:
        u = self.rng.random()
        for k, c in enumerate(self.cumulative, start=1):
            if u <= c:
                return k
        return SKUS

    def finish(self, request: _Request, answered: bool) -> None:
        request.done = True
        if self.counting:
            cold = request.sku >= COLD_FROM
            self.cold += cold
            if answered:
                self.answers += 1
                self.answer_time += self.now - request.started
            else:
                self.timeouts += 1
                self.cold_timeouts += cold
        self.ask()  # closed loop: the caller asks again at once

    def expire(self, request: _Request) -> None:
        """The request's deadline: its missing parts are ``timeout``; calls nobody needs stop."""
        if request.done:
            return
        for call in request.calls.values():
            call.waiters.discard(request)
            if not call.waiters and not call.over:
                self.cancel(call)
        self.finish(request, answered=False)

    # -- calls and slots ---------------------------------------------------------

    def acquire(self, call: _Call) -> None:
        if self.free and self.held[call.supplier] < SHARE:
            self.send(call)
        else:
            self.note_queue()
            self.waiting.append(call)

    def send(self, call: _Call) -> None:
        self.free -= 1
        self.held[call.supplier] += 1
        call.sent = True
        if self.counting:
            self.sent += 1
        self.at(self.now + self.slot_s, lambda: self.complete(call))

    def release(self, call: _Call) -> None:
        self.free += 1
        self.held[call.supplier] -= 1
        self.hand_out()

    def hand_out(self) -> None:
        self.note_queue()
        while self.free:
            eligible = [c for c in self.waiting if self.held[c.supplier] < SHARE]
            if not eligible:
                return
            urgent = [c for c in eligible if self.left(c) < URGENT_S]
            if self.policy == "largest-first":
                chosen = max(eligible, key=lambda c: len(c.waiters))
            elif self.policy == "largest-unless-urgent":
                # The most waiters first, but a call whose first waiter is near
                # its deadline goes before: largest-first without the starving.
                if urgent:
                    chosen = min(urgent, key=self.left)
                else:
                    chosen = max(eligible, key=lambda c: len(c.waiters))
            else:
                chosen = eligible[0]
            self.waiting.remove(chosen)
            self.send(chosen)

    def left(self, call: _Call) -> float:
        """Seconds until the deadline of ``call``'s most hurried waiter."""
        return min(request.deadline for request in call.waiters) - self.now

    def forget(self, call: _Call) -> None:
        call.over = True
        if self.calls.get((call.supplier, call.sku)) is call:
            del self.calls[(call.supplier, call.sku)]

    def cancel(self, call: _Call) -> None:
        self.forget(call)
        if call.sent:
            self.release(call)
        else:
            self.note_queue()
            self.waiting.remove(call)

    def complete(self, call: _Call) -> None:
        """The supplier answered: every waiter has this part."""
        if call.over:
            return  # cancelled while sent: its slot was given back then
        self.forget(call)
        for request in list(call.waiters):
            request.missing.discard(call.supplier)
            if not request.missing and not request.done:
                self.finish(request, answered=True)
        self.release(call)


def simulate(
    policy: str, seeds: Sequence[int], seconds: float, slot_s: float = LATENCY_S
) -> list[Figures]:
    """One run per seed."""
    coalesce = policy != "no-coalesce"
    return [
        Model(policy, seed, coalesce=coalesce, slot_s=slot_s).run(2.0, seconds) for seed in seeds
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Print each policy's medians."""
    parser = argparse.ArgumentParser(prog="python -m bench.coalesce_model", description=__doc__)
    parser.add_argument("--seconds", type=float, default=30.0, help="simulated seconds per run")
    parser.add_argument("--seeds", type=int, default=5, help="runs per policy")
    parser.add_argument(
        "--slot-ms",
        type=float,
        default=LATENCY_S * 1000,
        help="how long a sent call holds its slot (default 50: the supplier's latency, "
        "no overhead); e.g. 55 or 60 to see what QuoteFlow's own time per attempt costs",
    )
    args = parser.parse_args(argv)
    seeds = range(1, args.seeds + 1)
    print(
        f"{'policy':<22}{'answers/s':>10}{'per supplier':>14}{'summed':>8}"
        f"{'timeouts':>10}{'cold timeouts':>15}{'answer s':>10}{'queued':>8}"
    )
    for policy in ("fifo", "largest-first", "largest-unless-urgent", "no-coalesce"):
        runs = simulate(policy, seeds, args.seconds, args.slot_ms / 1000)

        def med(field: str, runs: list[Figures] = runs) -> float:
            return float(statistics.median(getattr(run, field) for run in runs))

        spread = [run.per_supplier for run in runs]
        print(
            f"{policy:<22}{med('goodput'):10.1f}{med('per_supplier'):14.3f}{med('summed'):8.3f}"
            f"{med('timeouts'):10.1%}{med('cold_timeouts'):15.1%}{med('answer_s'):10.3f}"
            f"{med('queued'):8.1f}   per supplier {min(spread):.3f}–{max(spread):.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
