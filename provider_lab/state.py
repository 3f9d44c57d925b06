"""The lab's configuration and its mutable state, shared by every handler."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Final

import attrs
from aiohttp import web

from provider_lab.catalogue import SUPPLIERS
from provider_lab.contracts import Contract, ContractTable
from provider_lab.faults import Fault, FaultTable
from provider_lab.fx import FxFault, FxFeed
from provider_lab.stats import RecentIds, Stats
from provider_lab.tokens import TOKEN_LIMIT, TokenKeeper

SCENARIOS: Final = ("normal", "slow", "broken", "malformed", "flaky")
BATCH_MAX_ITEMS: Final = 50
"""The parts a batch-dialect call may carry unless told otherwise (``--batch-max-items``)."""
MAX_BATCH_MAX_ITEMS: Final = 10_000


@attrs.frozen
class LabConfig:
    """Start-up settings: from the CLI, or built directly by tests."""

    suppliers: tuple[str, ...] = SUPPLIERS
    """The suppliers the lab answers for, at ``/quotes/{name}``."""
    scenario_suppliers: tuple[str, ...] | None = None
    """The suppliers the lesson's scenarios act on; ``None``: boreal if the lab serves it
    (as the lesson has it), else every supplier."""
    latency_ms: int = 0
    slow_ms: int = 2000
    faults: Sequence[tuple[str, Fault]] = ()
    seed: int | None = None
    """Fixes the ``blip`` fault's dice and each supplier's ``latency`` draws; ``None``: random."""
    id_limit: int = 10_000
    flaky_id_limit: int = 100_000
    client_id: str = "quoteflow"
    """The one OAuth2 client the token endpoint (``POST /oauth2/token``) knows."""
    client_secret: str = attrs.field(default="lab-secret", repr=False)
    token_ttl: int = 3600
    """``expires_in`` of the tokens issued, in seconds (at least 1)."""
    token_limit: int = TOKEN_LIMIT
    api_key: str | None = attrs.field(default="lab-key", repr=False)
    """The key the ``path`` dialect wants in ``?key=``; ``None``: every key is refused."""
    contracts: Sequence[tuple[str, Contract | None]] = ()
    """Suppliers' contracts at start (a later one for the same supplier replaces it)."""
    batch_max_items: int = BATCH_MAX_ITEMS
    """The most parts one batch-dialect call may ask for (1–10 000); more is a ``413``."""
    fx_rates: Sequence[tuple[str, str]] = ()
    """Rates of the feed (``GET /fx/eurofxref-daily.xml``) changed at start, as
    ``("USD", "0.9000")``."""
    fx_fault: FxFault | None = None
    """The feed's fault at start (``PUT /fx {"fault": ...}`` changes it)."""


class LabState:
    """Everything a running lab remembers; one per application."""

    def __init__(self, config: LabConfig) -> None:
        self.config = config
        self.suppliers = frozenset(config.suppliers)
        self.scenario_suppliers = frozenset(
            config.scenario_suppliers
            or (("boreal",) if "boreal" in config.suppliers else config.suppliers)
        )
        self.latency_ms = config.latency_ms
        self.faults = FaultTable(config.suppliers)
        for supplier, fault in config.faults:
            self.faults.append(supplier, fault)
        self.stats = Stats(config.id_limit, config.suppliers)
        self.flaky_seen = RecentIds(config.flaky_id_limit)
        self.blip_seen = RecentIds(config.flaky_id_limit)
        self.random = random.Random(config.seed)
        self._latency_random: dict[str, random.Random] = {}
        self.cache_control: dict[str, str] = {}
        """The ``Cache-Control`` header each supplier sends on its answers (none if absent)."""
        self.tokens = TokenKeeper(
            config.client_id, config.client_secret, config.token_ttl, config.token_limit
        )
        """The token endpoint's client, issued tokens and counts (the ``json`` dialect's bearer)."""
        self.api_key = config.api_key
        """The ``path`` dialect's API key, changed live by ``PUT /api-key``."""
        self.contracts = ContractTable(config.suppliers)
        """Each supplier's rate and concurrency contract, and its in-flight and refusal counts."""
        for supplier, contract in config.contracts:
            # No rate was in force before: the level starts at 0 whatever the time.
            self.contracts.set(supplier, contract, 0.0)
        self.fx = FxFeed(fault=config.fx_fault)
        """The rates feed: its table, its fault, its fetch counts (:mod:`provider_lab.fx`)."""
        self.fx.change_rates(dict(config.fx_rates))

    def latency_random(self, supplier: str) -> random.Random:
        """``supplier``'s own stream for the ``latency`` fault's lognormal draws.

        With a seed it is seeded from the seed and the supplier's name (hashed with
        SHA-512 by :class:`random.Random`, so the same in every process): a supplier's
        sequence of draws is the same run to run, whatever the other suppliers' traffic.
        Without one, from the system's randomness. ``POST /reset`` does not rewind it.
        """
        stream = self._latency_random.get(supplier)
        if stream is None:
            seed = self.config.seed
            stream = random.Random(None if seed is None else f"latency:{seed}:{supplier}")
            self._latency_random[supplier] = stream
        return stream

    def other_than(self, supplier: str) -> str:
        """Another supplier's name (the next one the lab serves), for a wrong echo."""
        names = self.config.suppliers
        if len(names) == 1:
            return supplier + "-other"
        return names[(names.index(supplier) + 1) % len(names)]

    def reset(self) -> None:
        """Zero the statistics (the token endpoint's, the contracts' and the rates feed's too)
        and forget which request ids were seen. Contracts, and what their rates have used, stay."""
        self.stats.reset()
        self.contracts.zero()
        self.flaky_seen.clear()
        self.blip_seen.clear()
        self.tokens.zero()
        self.fx.zero()


STATE: Final = web.AppKey("provider_lab.state", LabState)
