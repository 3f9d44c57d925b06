"""The workloads of issues 5, 7 and 11, and the QuoteFlow limits they are sized from.

They run in this order, against the same QuoteFlow process throughout: its
per-supplier retry budget (issue 7) and circuit breakers (issue 11) are
process-wide state, so ``flaky`` and ``blips`` run while boreal's bucket is
full, ``outage`` then drains it, and ``comeback`` measures how soon retries pay
again right after. After every workload the bench waits until a normal request
gets all three quotes again, which closes any circuit a workload opened: each
workload starts with every circuit closed.
"""

from __future__ import annotations

from typing import Any

import attrs

QUOTEFLOW, BARE = "quoteflow", "bare"
BOTH = (QUOTEFLOW, BARE)


@attrs.frozen
class Limits:
    """QuoteFlow's limits as the benchmark starts it (the contract's defaults)."""

    budget_s: float = 0.8
    inbound: int = 8
    outbound: int = 6
    breaker_open_max_s: float = 10.0
    """Longest a circuit stays open: how long a probe may have to wait after a workload."""

    @property
    def budget_ms(self) -> float:
        """The budget in milliseconds."""
        return self.budget_s * 1000

    def allowed_goodput(self, latency_ms: float) -> float:
        """Requests per second the limits allow: outbound ÷ (3 attempts × latency)."""
        return self.outbound / (3 * latency_ms / 1000)


@attrs.frozen
class Workload:
    """One row group of the table: how wrk drives the contenders, and the lab's setting."""

    name: str
    what: str
    connections: int
    latency_ms: int
    scenario: str = "normal"
    rounds: int = 1
    """Blocks of ``order``; each block is run ``rounds`` times."""
    interleave: bool = True
    """A B B A blocks (speed figures); otherwise one run each, A B (behaviour checks)."""
    contenders: tuple[str, ...] = BOTH
    inspect: bool = False
    """Read 200 bodies in wrk's Lua: which suppliers quoted or failed, ``elapsed_ms``."""
    timeline: bool = False
    """Count 200s and boreal's quotes per 100 ms of the run."""
    fault: dict[str, Any] | None = attrs.field(default=None, hash=False)
    """A lab fault for boreal for the whole workload (``PUT /faults/boreal``)."""
    min_duration_s: float = 1.0
    """Shortest run that still sees answers (the bare fan-out waits 2 s under ``slow``)."""
    fault_cleared_after_s: float | None = None
    """Clear ``fault`` this long into each run (``comeback`` of issue 11); None: never."""
    sku: str = "KB-001"

    def order(self) -> list[str]:
        """Contenders in the order they run, over every block."""
        if len(self.contenders) == 1:
            return list(self.contenders) * self.rounds
        runs: list[str] = []
        a, b = self.contenders
        for block in range(self.rounds):
            first, second = (a, b) if block % 2 == 0 else (b, a)
            runs += [first, second, second, first] if self.interleave else [first, second]
        return runs


def all_workloads(limits: Limits, rounds: int) -> tuple[Workload, ...]:
    """Every workload, in the order they run; ``rounds`` for the two ratio workloads."""
    full = limits.inbound
    return (
        Workload(
            "light",
            "1 connection, suppliers 20 ms: overhead = latency − 20 ms",
            connections=1,
            latency_ms=20,
            rounds=rounds,
        ),
        Workload(
            "saturate",
            "connections = inbound limit, suppliers 0 ms: throughput, CPU per request",
            connections=full,
            latency_ms=0,
            rounds=rounds,
        ),
        Workload(
            "overload",
            "4 × inbound limit, suppliers 50 ms: 503 share, goodput vs the limits",
            connections=4 * full,
            latency_ms=50,
        ),
        Workload(
            "flaky",
            "scenario flaky (every first attempt 503): share where boreal recovered",
            connections=full,
            latency_ms=0,
            scenario="flaky",
            interleave=False,
            inspect=True,
        ),
        Workload(
            "blips",
            "healthy boreal with 5 % one-off 503s (lab fault blip): share recovered",
            connections=full,
            latency_ms=0,
            interleave=False,
            inspect=True,
            fault={"kind": "blip", "probability": 0.05},
        ),
        Workload(
            "latency300",
            "boreal answers after 300 ms (lab fault latency): slow but healthy, never tripped",
            connections=full,
            latency_ms=0,
            contenders=(QUOTEFLOW,),
            inspect=True,
            fault={"kind": "latency", "ms": 300},
        ),
        Workload(
            "unknown_sku",
            "MS-010, which boreal does not carry (404 every time): never tripped",
            connections=full,
            latency_ms=0,
            contenders=(QUOTEFLOW,),
            inspect=True,
            sku="MS-010",
        ),
        Workload(
            "healthy16",
            "16 connections, every supplier healthy: the baseline of hang",
            connections=2 * full,
            latency_ms=0,
            contenders=(QUOTEFLOW,),
            inspect=True,
        ),
        Workload(
            "hang",
            "16 connections, boreal hangs (lab fault hang): its circuit opens",
            connections=2 * full,
            latency_ms=0,
            contenders=(QUOTEFLOW,),
            inspect=True,
            fault={"kind": "hang"},
        ),
        Workload(
            "hang_cleared",
            "boreal hangs until 1.2 s into the run (circuit opened once): how soon it is back",
            connections=full,
            latency_ms=0,
            contenders=(QUOTEFLOW,),
            inspect=True,
            timeline=True,
            fault={"kind": "hang"},
            fault_cleared_after_s=1.2,
            min_duration_s=4.0,
        ),
        Workload(
            "outage_cleared",
            "boreal 503 until 0.6 s into the run (circuit opened once): how soon it is back",
            connections=full,
            latency_ms=0,
            contenders=(QUOTEFLOW,),
            inspect=True,
            timeline=True,
            fault={"kind": "http_503"},
            fault_cleared_after_s=0.6,
            min_duration_s=4.0,
        ),
        Workload(
            "outage",
            "scenario broken: boreal requests per inbound request (from the lab)",
            connections=full,
            latency_ms=0,
            scenario="broken",
            interleave=False,
            inspect=True,
        ),
        Workload(
            "comeback",
            "flaky right after the outage: how soon retries pay again",
            connections=full,
            latency_ms=0,
            scenario="flaky",
            contenders=(QUOTEFLOW,),
            inspect=True,
            timeline=True,
        ),
        Workload(
            "slow",
            "scenario slow (boreal 2 s), full inbound load: latest answer, healthy quotes",
            connections=full,
            latency_ms=0,
            scenario="slow",
            interleave=False,
            inspect=True,
            min_duration_s=3.0,
        ),
    )
