"""The workloads of issue 5, and the QuoteFlow limits they are sized from."""

from __future__ import annotations

import attrs


@attrs.frozen
class Limits:
    """QuoteFlow's limits as the benchmark starts it (the contract's defaults)."""

    budget_s: float = 0.8
    inbound: int = 8
    outbound: int = 6

    @property
    def budget_ms(self) -> float:
        """The budget in milliseconds."""
        return self.budget_s * 1000

    def allowed_goodput(self, latency_ms: float) -> float:
        """Requests per second the limits allow: outbound ÷ (3 attempts × latency)."""
        return self.outbound / (3 * latency_ms / 1000)


@attrs.frozen
class Workload:
    """One row group of the table: how wrk drives both contenders, and the lab's setting."""

    name: str
    what: str
    connections: int
    latency_ms: int
    scenario: str = "normal"
    rounds: int = 1
    """A B B A blocks: each contender runs twice per block."""
    inspect: bool = False
    """Read 200 bodies (boreal quoted/failed, ``elapsed_ms``) in wrk's Lua."""
    min_duration_s: float = 1.0
    """Shortest run that still sees answers (the bare fan-out waits 2 s under ``slow``)."""


def all_workloads(limits: Limits, rounds: int) -> tuple[Workload, ...]:
    """Every workload, in the order they run; ``rounds`` for the two ratio workloads."""
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
            connections=limits.inbound,
            latency_ms=0,
            rounds=rounds,
        ),
        Workload(
            "overload",
            "4 × inbound limit, suppliers 50 ms: 503 share, goodput vs the limits",
            connections=4 * limits.inbound,
            latency_ms=50,
        ),
        Workload(
            "outage",
            "scenario broken: boreal requests per inbound request",
            connections=limits.inbound,
            latency_ms=0,
            scenario="broken",
            inspect=True,
        ),
        Workload(
            "flaky",
            "scenario flaky: share of answers where boreal recovered",
            connections=limits.inbound,
            latency_ms=0,
            scenario="flaky",
            inspect=True,
        ),
        Workload(
            "slow",
            "scenario slow (boreal 2 s): latest answer vs the budget",
            connections=limits.inbound,
            latency_ms=0,
            scenario="slow",
            inspect=True,
            min_duration_s=3.0,
        ),
    )
