"""The catalogue the app serves now, wired into the parts that know its suppliers.

At start-up the app builds the supplier client, the slots, the service and the
metrics from one ``Catalogue``; ``SupplierRoster`` keeps them in step from
then on. On ``SIGHUP`` (``reload.py``) it re-reads the file with the same
checks as at start-up and, if it passes, moves every part to the new
catalogue in one go, with no ``await`` in between:

    client    a new entry per supplier (URL, headers, timeouts, adapter); a
              supplier that stays keeps its retry budget and attempt times
    slots     the new shares; a supplier that stays keeps the slots it holds
              (fleet mode: the coordinator sends the new shares and retry
              buckets with its next sync; Redis keeps no limit of its own)
    service   a new ``Lineup``: the names in order, and the breakers (one that
              stays with the same threshold keeps its breaker, state and all)
    metrics   the per-supplier gauges follow the new names

A request reads the lineup once when it starts and keeps it, so requests in
flight finish on the catalogue they started with. A removed supplier stays
reachable for them until every budget that began before the reload is over;
then its entries, slots and metric series are dropped (``_forget``).

A file that fails a check changes nothing: ``reload`` raises ``ConfigError``
before touching any part, and the old catalogue keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

import attrs

from quoteflow.breaker import Breakers
from quoteflow.catalogue import Catalogue
from quoteflow.config import Settings
from quoteflow.fleet import Coordinator
from quoteflow.logs import log_event
from quoteflow.observe import Telemetry
from quoteflow.options import ConfigError, load_catalogue
from quoteflow.service import Lineup, QuoteService
from quoteflow.slots import OutboundSlots
from quoteflow.supplier import SupplierClient

log = logging.getLogger("quoteflow")


@attrs.frozen
class _Parts:
    """The app's parts that know the catalogue's suppliers."""

    client: SupplierClient
    service: QuoteService
    telemetry: Telemetry
    slots: OutboundSlots | None
    """This process's slots; ``None`` in fleet mode (Redis holds them)."""
    coordinator: Coordinator | None = None
    """Fleet mode's link to Redis: the shares and retry buckets it sends with every sync."""


class SupplierRoster:
    """The live catalogue: a ``reload.Reloadable`` for the supplier catalogue file."""

    name = "suppliers"

    def __init__(
        self, settings: Settings, catalogue: Catalogue, environ: Mapping[str, str]
    ) -> None:
        self.settings = settings
        self.catalogue = catalogue
        self._environ = environ
        self._parts: _Parts | None = None
        """What ``wire`` was given; ``None`` until the app has started."""
        self._timers: set[asyncio.TimerHandle] = set()

    def lineup(self, telemetry: Telemetry, previous: Lineup | None = None) -> Lineup:
        """The service's lineup for the catalogue; ``previous``'s breakers carried over."""
        settings = self.settings
        breakers = Breakers(
            {supplier.name: supplier.breaker_failures for supplier in self.catalogue.suppliers},
            open_time=settings.breaker_open,
            open_max=settings.breaker_open_max,
            listener=telemetry.circuit_moved,
            previous=None if previous is None else previous.breakers,
        )
        # No supplier with a breaker: nothing to ask per request.
        currencies = {supplier.name: supplier.currency for supplier in self.catalogue.suppliers}
        return Lineup(self.catalogue.names, breakers if breakers else None, currencies)

    def wire(
        self,
        client: SupplierClient,
        service: QuoteService,
        telemetry: Telemetry,
        *,
        slots: OutboundSlots | None,
        coordinator: Coordinator | None = None,
    ) -> None:
        """Keep these parts in step with the catalogue; ``slots`` is None in fleet mode."""
        self._parts = _Parts(client, service, telemetry, slots, coordinator)
        self._watch(self._parts)

    def stop(self) -> None:
        """At shutdown: no timer of a past reload outlives the app."""
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()

    def reload(self) -> None:
        """Re-read the file and serve it; ``ConfigError`` (nothing changed) if it fails a check."""
        self.use(load_catalogue(self.settings, self._environ))

    def use(self, catalogue: Catalogue) -> None:
        """Serve ``catalogue`` from the next request on."""
        parts = self._parts
        if parts is None:
            raise ConfigError("the app has not started: nothing to reload yet")
        old, self.catalogue = self.catalogue, catalogue
        removed = tuple(name for name in old.names if name not in catalogue.names)
        if parts.coordinator is not None:
            parts.coordinator.retarget(
                catalogue.shares(),
                {s.name: s.retry_budget_capacity for s in catalogue.suppliers},
                catalogue.hedges(),
            )
            coordinator = parts.coordinator
            parts.client.use(catalogue, coordinator.budgets, coordinator.hedge_budgets)
        else:
            parts.client.use(catalogue)
        if parts.slots is not None:
            parts.slots.retarget(catalogue.shares())
        parts.service.use(self.lineup(parts.telemetry, previous=parts.service.lineup))
        self._watch(parts)
        log_event(
            log,
            logging.INFO,
            "suppliers_changed",
            {
                "suppliers": list(catalogue.names),
                "added": [name for name in catalogue.names if name not in old.names],
                "removed": list(removed),
            },
        )
        if removed:
            # Every request that could still ask a removed supplier began
            # before now, so it is over within one budget (and its answer sent).
            grace = self.settings.budget + 1.0
            loop = asyncio.get_running_loop()
            now = loop.time()
            self._timers = {timer for timer in self._timers if timer.when() > now}
            self._timers.add(loop.call_later(grace, self._forget, removed))

    def _forget(self, removed: tuple[str, ...]) -> None:
        gone = tuple(name for name in removed if name not in self.catalogue.names)
        parts = self._parts
        if not gone or parts is None:
            return  # named again by a later reload
        parts.client.forget(gone)
        if parts.slots is not None:
            parts.slots.forget(gone)
        if parts.coordinator is not None:
            parts.coordinator.forget(gone)
        parts.telemetry.forget_suppliers(gone)

    def _watch(self, parts: _Parts) -> None:
        breakers = parts.service.lineup.breakers
        parts.telemetry.watch_suppliers(
            self.catalogue.names,
            parts.client.retry_tokens,
            circuit_state=None if breakers is None else breakers.state,
            with_circuit=() if breakers is None else breakers.suppliers,
            hedge_tokens=parts.client.hedge_tokens,
        )
