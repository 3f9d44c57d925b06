"""What an operator sees: one log event per supplier attempt and per request, and metrics.

Everything is read off a finished ``QuoteReport`` (the budget bill), so the
retry loop itself stays free of bookkeeping, and the log, the metrics and
``?explain=1`` always tell the same story.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from quoteflow.breaker import State
from quoteflow.callers import QUOTA_EXCEEDED, SEATS_EXCEEDED
from quoteflow.logs import log_event
from quoteflow.models import (
    CANCELLED,
    STOPPED_CACHED,
    STOPPED_CIRCUIT_OPEN,
    STOPPED_DEADLINE,
    STOPPED_NO_SLOT_IN_TIME,
    STOPPED_NO_TIME,
    STOPPED_RETRY_AFTER,
    STOPPED_RETRY_BUDGET,
    STOPPED_SUCCESS,
    AttemptRecord,
    CartReport,
    QuoteReport,
    SupplierTrace,
)

log = logging.getLogger("quoteflow")

DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.2,
    0.3,
    0.4,
    0.5,
    0.6,
    0.7,
    0.75,
    0.8,
    0.85,
    0.9,
    1.0,
    2.0,
)
"""Fine around the 0.8 s budget, so "answered at the deadline" is its own bucket."""

CART_SIZE_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)
SLOT_WAIT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.8)

RETRY_REFUSALS = (STOPPED_NO_TIME, STOPPED_RETRY_AFTER, STOPPED_RETRY_BUDGET)

_CIRCUIT_LABELS = {State.CLOSED: "closed", State.HALF_OPEN: "half_open", State.OPEN: "open"}
"""The ``to`` label of each state in ``quoteflow_circuit_transitions_total``."""
_CIRCUIT_EVENTS = {
    State.CLOSED: "circuit_closed",
    State.HALF_OPEN: "circuit_half_open",
    State.OPEN: "circuit_opened",
}

# Results of an inbound request, as counted in quoteflow_requests_total (and, with
# callers, in quoteflow_caller_requests_total with the two refusals of callers.gate).
OK, BUSY, INVALID, ERROR = "ok", "busy", "invalid", "error"
CALLER_REFUSALS = (QUOTA_EXCEEDED, SEATS_EXCEEDED)


class PlainCounter:
    """A Prometheus counter family updated with no lock.

    prometheus_client's own metrics take a lock on every update, and its
    histogram walks the buckets in Python: on the request path that was a
    visible part of QuoteFlow's CPU per request. Every update here comes from
    the event loop's thread and every read (a scrape) runs on it too, so
    plain numbers are enough, turned into metric families at scrape time.
    """

    def __init__(self, name: str, documentation: str, labels: tuple[str, ...] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = labels
        self.values: dict[tuple[str, ...], float] = {} if labels else {(): 0.0}

    def inc(self, *labels: str) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + 1.0

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for labels, value in self.values.items():
            family.add_metric(labels, value)
        return family


class PlainHistogram:
    """A Prometheus histogram updated with no lock (see ``PlainCounter``)."""

    def __init__(self, name: str, documentation: str, buckets: tuple[float, ...]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: the first bound >= value, as Prometheus' "le" means.
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def family(self) -> Metric:
        cumulative = list(itertools.accumulate(self.counts))
        # str(0.005) == "0.005", str(1.0) == "1.0": the labels prometheus_client writes.
        buckets = [(str(b), float(c)) for b, c in zip(self.bounds, cumulative[:-1], strict=True)]
        buckets.append(("+Inf", float(cumulative[-1])))
        return HistogramMetricFamily(
            self.name, self.documentation, buckets=buckets, sum_value=self.total
        )


HostMode = Literal["livesum", "livemax", "livemin", "liveall", "livemostrecent"]
"""How host-wide metrics combine one gauge's value across live workers."""


class PlainGauge:
    """A gauge whose values are read at scrape time from functions (``Telemetry.watch``).

    ``host_mode`` is how host-wide metrics combine the workers' values
    (prometheus-client's ``multiprocess_mode``; ``live*`` drops a worker's value
    when it exits): in-flight counts add up across workers.
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: tuple[str, ...] = (),
        host_mode: HostMode = "livesum",
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = labels
        self.host_mode: HostMode = host_mode
        self.readers: dict[tuple[str, ...], Callable[[], float]] = {}

    def family(self) -> Metric:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labels)
        for labels, read in self.readers.items():
            family.add_metric(labels, read())
        return family


class ReadCounter:
    """A counter family whose values are someone else's running totals, read at scrape time."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labels: tuple[str, ...],
        read: Callable[[], Mapping[tuple[str, ...], float]],
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labels = labels
        self.read = read

    @property
    def values(self) -> Mapping[tuple[str, ...], float]:
        """The totals now, by label values (as ``PlainCounter.values``)."""
        return self.read()

    def family(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for labels, value in self.values.items():
            family.add_metric(labels, value)
        return family


PlainMetric = PlainCounter | ReadCounter | PlainHistogram | PlainGauge


class _LoopMetrics(Collector):
    """The metrics of one app, read by the registry at scrape time."""

    def __init__(self, telemetry: Telemetry) -> None:
        self.telemetry = telemetry

    def collect(self) -> Iterable[Metric]:
        return [metric.family() for metric in self.telemetry.metrics]


class Telemetry:
    """The metrics of one app (its own registry) and the events that go with them."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._busy_unreported = 0
        self._busy_reported_at = -math.inf
        self._limited_unreported: dict[tuple[str, str], int] = {}
        self._limited_reported_at = -math.inf
        self._requests = PlainCounter(
            "quoteflow_requests", "Inbound quote requests by result.", ("result",)
        )
        self._duration = PlainHistogram(
            "quoteflow_request_duration_seconds",
            "Time from admission to the answer of served quote requests.",
            DURATION_BUCKETS,
        )
        self._slot_wait = PlainHistogram(
            "quoteflow_outbound_slot_wait_seconds",
            "Time a supplier attempt waited for an outbound slot (given up or not).",
            SLOT_WAIT_BUCKETS,
        )
        self._attempts = PlainCounter(
            "quoteflow_supplier_attempts",
            "Supplier HTTP attempts by supplier, attempt number and outcome.",
            ("supplier", "attempt", "outcome"),
        )
        self._retries = PlainCounter(
            "quoteflow_retries",
            "Second attempts, by supplier and the first attempt's failure.",
            ("supplier", "reason"),
        )
        self._refusals = PlainCounter(
            "quoteflow_retries_refused",
            "Second attempts not sent, by supplier and reason.",
            ("supplier", "reason"),
        )
        self._disconnects = PlainCounter(
            "quoteflow_caller_disconnects",
            "Requests whose caller went away before the answer; their fan-out was cancelled.",
        )
        self._timeouts = PlainCounter(
            "quoteflow_deadline_timeouts",
            "Suppliers still working when the request's deadline came.",
            ("supplier",),
        )
        self._gave_up = PlainCounter(
            "quoteflow_slot_give_ups",
            "Supplier calls answered at once: no outbound slot came while they could finish.",
            ("supplier",),
        )
        self._circuit_open = PlainCounter(
            "quoteflow_circuit_open_answers",
            "Supplier calls not made because the supplier's circuit was open.",
            ("supplier",),
        )
        self._circuit_moves = PlainCounter(
            "quoteflow_circuit_transitions",
            "Circuit breaker transitions, by supplier and the state moved to.",
            ("supplier", "to"),
        )
        # Gauges are read from the service and the client at scrape time (``watch``).
        self._inbound = PlainGauge(
            "quoteflow_inbound_in_flight", "Quote requests being served now."
        )
        self._outbound = PlainGauge(
            "quoteflow_outbound_in_flight", "Supplier attempts holding an outbound slot now."
        )
        self._retry_tokens = PlainGauge(
            "quoteflow_retry_budget_tokens",
            "Retries each supplier may still spend now.",
            ("supplier",),
            host_mode="livesum",  # each worker's own bucket: the host may spend their sum
        )
        self._hedge_tokens = PlainGauge(
            "quoteflow_hedge_tokens",
            "Hedges each hedged supplier may still send now (its hedge bucket).",
            ("supplier",),
            host_mode="livesum",  # each worker's own pool: the host may spend their sum
        )
        self._circuit_state = PlainGauge(
            "quoteflow_circuit_state",
            "Each supplier's circuit: 0 closed, 1 half-open, 2 open (absent: breaker off).",
            ("supplier",),
            host_mode="livemax",  # each worker has its own breaker: the host shows the worst
        )
        self._carts = PlainCounter("quoteflow_carts", "Carts answered with a result.")
        self._cart_lines = PlainHistogram(
            "quoteflow_cart_lines", "Lines of each cart answered.", CART_SIZE_BUCKETS
        )
        self._cart_calls = PlainHistogram(
            "quoteflow_cart_calls", "Supplier calls each cart made.", CART_SIZE_BUCKETS
        )
        self._batch_sizes = PlainHistogram(
            "quoteflow_batch_call_lines",
            "Lines asked by each call of a cart to a batch supplier.",
            CART_SIZE_BUCKETS,
        )
        self._hedges = PlainCounter(
            "quoteflow_hedges",
            "Hedged second attempts by supplier: sent, won (its quote came first), and "
            "attempts cancelled because the other won.",
            ("supplier", "event"),
        )
        self._hedges_refused = PlainCounter(
            "quoteflow_hedges_refused",
            "Hedges the delay asked for that did not go, by supplier and why: no_token, "
            "no_slot, no_turn, no_time.",
            ("supplier", "reason"),
        )
        self._sharing = False
        """Coalescing or the quote cache is on: the request event says what each shared."""
        self.metrics: tuple[PlainMetric, ...] = (
            self._hedges,
            self._hedges_refused,
            self._hedge_tokens,
            self._carts,
            self._cart_lines,
            self._cart_calls,
            self._batch_sizes,
            self._requests,
            self._duration,
            self._slot_wait,
            self._attempts,
            self._retries,
            self._refusals,
            self._disconnects,
            self._timeouts,
            self._gave_up,
            self._circuit_open,
            self._circuit_moves,
            self._inbound,
            self._outbound,
            self._retry_tokens,
            self._circuit_state,
        )
        """Every metric of the app, in exposition order."""
        self.register()

    def register(self) -> None:
        """Make ``registry`` read this app's metrics at scrape time."""
        self.registry.register(_LoopMetrics(self))

    def sharing(self, *metrics: PlainMetric) -> None:
        """Coalescing or the quote cache is on: their ``metrics``, and a field in the log.

        Each ``quote_request`` event then carries ``shared``: for every
        supplier whose outcome a shared call or the cache gave, how.
        """
        self._sharing = True
        self.add(*metrics)

    def add(self, *metrics: PlainMetric) -> None:
        """More metrics, e.g. of a part wired at start-up; exported like the others.

        Metrics go through here, never straight into ``registry``: under
        gunicorn the registry reads every worker's files (``hostmetrics``),
        and only what ``metrics`` holds is copied into them.
        """
        self.metrics = (*self.metrics, *metrics)

    def exposition(self) -> bytes:
        """The Prometheus text exposition of ``registry`` (what ``/metrics`` answers)."""
        return generate_latest(self.registry)

    def watch(
        self,
        inbound: Callable[[], float],
        outbound: Callable[[], float],
    ) -> None:
        """Read the in-flight gauges from the service and the client at scrape time."""
        self._inbound.readers[()] = inbound
        self._outbound.readers[()] = outbound

    def watch_suppliers(
        self,
        suppliers: Iterable[str],
        retry_tokens: Callable[[str], float],
        circuit_state: Callable[[str], float] | None = None,
        with_circuit: Iterable[str] = (),
        hedge_tokens: Callable[[str], float | None] | None = None,
    ) -> None:
        """Read each supplier's gauges at scrape time: the catalogue's, replacing any before.

        ``with_circuit``: the suppliers that have a breaker, read by ``circuit_state``;
        ``hedge_tokens``: each hedged supplier's hedge bucket (None: not hedged).
        """
        self._retry_tokens.readers = {
            (supplier,): functools.partial(retry_tokens, supplier) for supplier in suppliers
        }
        self._hedge_tokens.readers = (
            {}
            if hedge_tokens is None
            else {
                (supplier,): functools.partial(_or_zero, hedge_tokens, supplier)
                for supplier in suppliers
                if hedge_tokens(supplier) is not None
            }
        )
        self._circuit_state.readers = (
            {}
            if circuit_state is None
            else {
                (supplier,): functools.partial(circuit_state, supplier) for supplier in with_circuit
            }
        )

    def forget_suppliers(self, suppliers: Iterable[str]) -> None:
        """A reload dropped ``suppliers``: their series leave every per-supplier metric."""
        gone = set(suppliers)
        for metric in self.metrics:
            if isinstance(metric, PlainCounter) and metric.labels[:1] == ("supplier",):
                metric.values = {
                    labels: value
                    for labels, value in metric.values.items()
                    if labels[0] not in gone
                }

    def watch_callers(self) -> None:
        """Callers are configured: count every quote request's answer by caller and result."""
        self._caller_requests = PlainCounter(
            "quoteflow_caller_requests",
            "Quote requests by caller (its name in the callers file; - for an unnamed key) and "
            "result: ok, busy, invalid, error, or refused: quota_exceeded, seats_exceeded.",
            ("caller", "result"),
        )
        self.add(self._caller_requests)

    def watch_caller_quota(self, calls: Callable[[], Mapping[str, float]]) -> None:
        """Fleet mode with callers: the Redis round trips of callers' rates, by result."""
        self.add(
            ReadCounter(
                "quoteflow_caller_quota_calls",
                "Round trips to Redis for callers' fleet-wide rates, by result (ok, failed).",
                ("result",),
                lambda: {(result,): count for result, count in calls().items()},
            )
        )

    def caller_answered(self, caller: str, result: str) -> None:
        """A quote request of ``caller`` was answered with ``result`` (after ``watch_callers``)."""
        self._caller_requests.inc(caller, result)

    def circuit_moved(self, supplier: str, state: State, fields: Mapping[str, object]) -> None:
        """A supplier's circuit changed state: one event and one count per transition."""
        self._circuit_moves.inc(supplier, _CIRCUIT_LABELS[state])
        # Opening is the one an operator must see: a supplier is out.
        level = logging.WARNING if state is State.OPEN else logging.INFO
        log_event(log, level, _CIRCUIT_EVENTS[state], {"supplier": supplier, **fields})

    def watch_coordination(
        self,
        up: Callable[[], float],
        leased: Callable[[], float],
        workers: Callable[[], float],
        syncs: Callable[[], Mapping[str, float]],
        events: Callable[[], Mapping[str, float]] = dict,
        host: str = "",
        differ: Callable[[], float] = float,
    ) -> None:
        """Fleet mode only (absent in one process): this worker's link to Redis, at scrape time.

        Host-wide (under gunicorn) the link is up only if every live worker's
        is, the leases add up, and the worker count is the largest seen.
        ``events``: ``switched`` and ``past_grace`` counts; ``host``: this host's
        name (one info gauge, never a label on every series); ``differ``: 1
        while another host of the fleet states other settings (``fleet.hosts``).
        """
        info = PlainGauge(
            "quoteflow_host_info",
            "1, labelled with this host's name: the host of the fleet these metrics are of.",
            ("host",),
            host_mode="livemax",
        )
        info.readers[(host,)] = lambda: 1.0
        self.add(
            info,
            ReadCounter(
                "quoteflow_coordination_switched",
                "Times the fleet was found on another Redis server (a failover): a reset.",
                (),
                lambda: {(): events().get("switched", 0.0)},
            ),
            ReadCounter(
                "quoteflow_coordination_past_grace",
                "Outages a worker spent on its own past --redis-outage-grace.",
                (),
                lambda: {(): events().get("past_grace", 0.0)},
            ),
        )

        def gauge(
            name: str, documentation: str, read: Callable[[], float], mode: HostMode
        ) -> PlainGauge:
            found = PlainGauge(name, documentation, host_mode=mode)
            found.readers[()] = read
            return found

        gauges = (
            gauge(
                "quoteflow_coordination_up",
                "1 while Redis answers, 0 on the safe share (on its own).",
                up,
                "livemin",
            ),
            gauge(
                "quoteflow_outbound_leased",
                "Outbound slots leased from the fleet now.",
                leased,
                "livesum",
            ),
            gauge(
                "quoteflow_coordination_workers",
                "Live workers the last sync saw.",
                workers,
                "livemax",
            ),
            gauge(
                "quoteflow_fleet_settings_differ",
                "1 while another host on the fleet's Redis states another limit, share or prefix.",
                differ,
                "livemax",
            ),
        )
        self.add(
            *gauges,
            ReadCounter(
                "quoteflow_coordination_syncs",
                "Syncs with Redis by result.",
                ("result",),
                lambda: {(result,): count for result, count in syncs().items()},
            ),
        )

    def watch_connections(
        self,
        open_now: Callable[[], float],
        closed: Callable[[], Mapping[str, int]],
        pauses: Callable[[], float],
    ) -> None:
        """The inbound connections (``connections.py``), read at scrape time."""
        gauge = PlainGauge(
            "quoteflow_connections_open", "Inbound connections open now.", host_mode="livesum"
        )
        gauge.readers[()] = open_now
        self.add(
            gauge,
            ReadCounter(
                "quoteflow_connections_closed",
                "Inbound connections QuoteFlow closed: to make room at the cap, or a slow head.",
                ("reason",),
                lambda: {(reason,): float(count) for reason, count in closed().items()},
            ),
            ReadCounter(
                "quoteflow_accept_pauses",
                "Times accepting stopped because every connection had a request in progress.",
                (),
                lambda: {(): pauses()},
            ),
        )

    def watch_rates(
        self,
        *,
        published: Callable[[], float],
        fresh: Callable[[], float],
        failures: Callable[[], Mapping[str, int]],
    ) -> None:
        """The exchange rates (``fx.py``), read at scrape time."""
        when = PlainGauge(
            "quoteflow_fx_rates_published_seconds",
            "Publication time (Unix seconds) of the rates table in use; 0: none yet.",
            host_mode="livemin",
        )
        when.readers[()] = published
        usable = PlainGauge(
            "quoteflow_fx_rates_fresh",
            "1 while the rates table is younger than --fx-max-age, else 0 (quotes are no_rate).",
            host_mode="livemin",
        )
        usable.readers[()] = fresh
        self.add(
            when,
            usable,
            ReadCounter(
                "quoteflow_fx_refresh_failures",
                "Fetches of the --fx-rates URL that failed (the last good table was kept).",
                ("reason",),
                lambda: {(reason,): float(count) for reason, count in failures().items()},
            ),
        )

    def served(self, report: QuoteReport) -> None:
        """A request was answered with a result: count it and log its bill.

        A supplier that answered its first attempt with a quote is routine:
        its attempt event is logged at debug level, and the request event's
        ``outcomes`` still names it. Every attempt of a supplier that failed,
        retried or was stopped is logged at info. At the default level that
        is one line per healthy request instead of four — logging was most
        of QuoteFlow's own CPU cost per request (see docs/benchmark.md).
        """
        result = report.result
        deadline = report.deadline
        for trace in report.traces:
            routine = trace.stopped == STOPPED_SUCCESS and len(trace.attempts) == 1
            level = logging.DEBUG if routine else logging.INFO
            last = len(trace.attempts)
            for record in trace.attempts:
                self._attempts.inc(trace.supplier, str(record.attempt), record.outcome)
                self._slot_wait.observe(record.slot_wait)
                if record.backoff is not None:
                    self._retries.inc(trace.supplier, record.outcome)
                if log.isEnabledFor(level):
                    log_event(
                        log,
                        level,
                        "supplier_attempt",
                        _attempt_fields(result.request_id, trace, record, deadline, last),
                    )
            self._hedged(trace)
            if trace.stopped == STOPPED_DEADLINE:
                self._timeouts.inc(trace.supplier)
            elif trace.stopped == STOPPED_CIRCUIT_OPEN:
                self._circuit_open.inc(trace.supplier)
            elif trace.stopped == STOPPED_NO_SLOT_IN_TIME:
                self._gave_up.inc(trace.supplier)
                if trace.gave_up_after is not None:  # a wait too, if one that sent nothing
                    self._slot_wait.observe(trace.gave_up_after)
            elif trace.stopped in RETRY_REFUSALS:
                self._refusals.inc(trace.supplier, trace.stopped)
        self._requests.inc(OK)
        self._duration.observe(result.elapsed_ms / 1000)
        if log.isEnabledFor(logging.INFO):
            fields = {
                "request_id": result.request_id,
                "status": 200,
                "result": OK,
                "elapsed_ms": round(result.elapsed_ms, 3),
                "quotes": len(result.quotes),
                "best": result.best.supplier if result.best else None,
                "failures": {failure.supplier: failure.code for failure in result.failures},
                "outcomes": {
                    trace.supplier: [record.outcome for record in trace.attempts]
                    for trace in report.traces
                },
            }
            if report.caller is not None:
                fields["caller"] = report.caller
            if self._sharing:
                fields["shared"] = _shared(report.traces)
            gave_up = [t.supplier for t in report.traces if t.stopped == STOPPED_NO_SLOT_IN_TIME]
            if gave_up:
                fields["gave_up"] = gave_up  # no slot in time: no attempt line says so
            log_event(log, logging.INFO, "quote_request", fields)

    def _hedged(self, trace: SupplierTrace) -> None:
        """A call's hedged race, if it had one: sent, won, cancelled, or why none went."""
        if trace.hedged:
            for record in trace.attempts:
                if record.hedge:
                    self._hedges.inc(trace.supplier, "sent")
                if record.outcome == CANCELLED:
                    self._hedges.inc(trace.supplier, "cancelled")
            if trace.won == 2:
                self._hedges.inc(trace.supplier, "won")
        elif trace.hedge_refused is not None:
            self._hedges_refused.inc(trace.supplier, trace.hedge_refused)

    def cart_served(self, report: CartReport) -> None:
        """A cart was answered: count its lines and calls, log one event for it.

        Its attempts count in the same per-supplier metrics as a single
        quote's; the event says per supplier how many calls ended how.
        """
        result = report.result
        calls: dict[str, dict[str, int]] = {}
        for trace in report.traces:
            for record in trace.attempts:
                self._attempts.inc(trace.supplier, str(record.attempt), record.outcome)
                self._slot_wait.observe(record.slot_wait)
            self._hedged(trace)
            if len(trace.lines) > 1:  # a batch call (one of a single line is not told apart)
                self._batch_sizes.observe(len(trace.lines))
            stopped = calls.setdefault(trace.supplier, {})
            key = trace.stopped or "none"
            stopped[key] = stopped.get(key, 0) + 1
        self._carts.inc()
        self._cart_lines.observe(len(result.lines))
        self._cart_calls.observe(len(report.traces))
        if log.isEnabledFor(logging.INFO):
            basket = result.basket
            fields: dict[str, object] = {
                "request_id": result.request_id,
                "status": 200,
                "result": OK,
                "elapsed_ms": round(result.elapsed_ms, 3),
                "lines": len(result.lines),
                "calls": calls,
                "complete": basket.complete,
                "unquoted": len(basket.unquoted),
                "total_cents": basket.total_cents,
                "optimal": basket.optimal,
                "solve_ms": round(report.solve_ms, 3),
            }
            if report.caller is not None:
                fields["caller"] = report.caller
            log_event(log, logging.INFO, "cart_request", fields)

    def caller_left(self, request_id: str) -> None:
        """The caller hung up; its fan-out was cancelled and its slots are back."""
        self._disconnects.inc()
        log_event(log, logging.INFO, "caller_disconnected", {"request_id": request_id})

    def refused(
        self,
        result: str,
        request_id: str,
        status: int,
        exc: BaseException | None = None,
        **fields: object,
    ) -> None:
        """A request was answered without a result: busy, invalid, or our bug (``exc``).

        Busy refusals come by the thousand under overload: each is a debug
        event, and at most once a second an info ``capacity_exhausted`` event
        says how many there were since the last one.
        """
        self._requests.inc(result)
        if result == BUSY:
            level = logging.DEBUG
            self._busy_unreported += 1
            now = time.monotonic()
            if now - self._busy_reported_at >= 1.0:
                count, self._busy_unreported, self._busy_reported_at = self._busy_unreported, 0, now
                log_event(log, logging.INFO, "capacity_exhausted", {"refused": count})
        elif result in CALLER_REFUSALS:
            # A caller in a retry loop must not flood the log either: one debug
            # event each, and at most once a second an info event of the counts.
            level = logging.DEBUG
            key = (str(fields.get("caller")), result)
            self._limited_unreported[key] = self._limited_unreported.get(key, 0) + 1
            now = time.monotonic()
            if now - self._limited_reported_at >= 1.0:
                counts, self._limited_unreported = self._limited_unreported, {}
                self._limited_reported_at = now
                refused = [{"caller": c, "reason": r, "refused": n} for (c, r), n in counts.items()]
                log_event(log, logging.INFO, "callers_refused", {"refused": refused})
        else:
            level = logging.ERROR if result == ERROR else logging.INFO
        if log.isEnabledFor(level):
            event = {"request_id": request_id, "status": status, "result": result, **fields}
            log_event(log, level, "quote_request", event, exc_info=exc)


def _or_zero(read: Callable[[str], float | None], supplier: str) -> float:
    return read(supplier) or 0.0


def _shared(traces: Iterable[SupplierTrace]) -> dict[str, str]:
    """How coalescing or the cache gave each supplier's outcome, for those it did."""
    found: dict[str, str] = {}
    for trace in traces:
        if trace.stale_if_error is not None:
            found[trace.supplier] = f"stale_if_error:{trace.stale_if_error}"
        elif trace.stopped == STOPPED_CACHED:
            found[trace.supplier] = STOPPED_CACHED
        elif trace.joined is not None:
            found[trace.supplier] = f"joined:{trace.joined}"
        elif trace.handed_over is not None:
            found[trace.supplier] = f"handed_over:{trace.handed_over}"
    return found


def _attempt_fields(
    request_id: str, trace: SupplierTrace, record: AttemptRecord, deadline: float, last: int
) -> dict[str, object]:
    fields: dict[str, object] = {
        "request_id": request_id,
        "supplier": trace.supplier,
        "attempt": record.attempt,
        "outcome": record.outcome,
        "status": record.status,
        "slot_wait_ms": round(record.slot_wait * 1000, 3),
        "duration_ms": round(record.duration * 1000, 3),
        "remaining_ms": round((deadline - record.ended) * 1000, 3),
    }
    if record.backoff is not None:
        fields["backoff_ms"] = round(record.backoff * 1000, 3)
    if record.cut_short:
        fields["cut_short"] = True
    if record.problem is not None:
        fields["problem"] = record.problem
    if record.attempt == last:
        fields["stopped"] = trace.stopped
    return fields
