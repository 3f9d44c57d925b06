"""Host-wide metrics under gunicorn: ``/metrics`` from any worker gives the whole host's totals.

This uses prometheus-client's multiprocess mode, the library's documented way
to run under gunicorn. With ``PROMETHEUS_MULTIPROC_DIR`` set before
prometheus-client is first imported, every metric value a process writes goes
to a memory-mapped file of its own in that directory (``counter_<pid>.db``,
``gauge_livesum_<pid>.db``, ...), and a ``MultiProcessCollector`` adds up
every file at scrape time. gunicorn's ``child_exit`` hook removes the gauge
files of a worker that died (``gunicorn_conf.py``); its counter and histogram
files stay, so host totals never go backwards when a worker is replaced.

QuoteFlow's own counters and histograms stay plain numbers updated with no
lock (``observe.py``): a prometheus-client metric in multiprocess mode takes a
lock and writes to its file on every update, which is exactly the per-request
cost ``observe.py`` removed. Instead each worker copies what changed since the
last copy into its files:

- at most every ``FLUSH_INTERVAL`` (a task on the worker's event loop),
- just before it answers a scrape (so its own numbers are exact),
- at shutdown, after the last in-flight request has finished.

So a scrape shows the answering worker's numbers as of now and every other
worker's as of at most ``FLUSH_INTERVAL`` ago; a worker killed with SIGKILL
takes at most its last ``FLUSH_INTERVAL`` of counts with it. Gauges (in
flight now, retry tokens) are read from the worker's objects at each copy and
written with their ``host_mode`` (``livesum``: the host's in-flight total).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.multiprocess import MultiProcessCollector

from quoteflow.logs import log_event
from quoteflow.observe import (
    PlainCounter,
    PlainGauge,
    PlainHistogram,
    PlainMetric,
    ReadCounter,
    Telemetry,
)

log = logging.getLogger("quoteflow")

FLUSH_INTERVAL = 0.1
"""Seconds between two copies of a worker's numbers into its metrics files."""


class HostTelemetry(Telemetry):
    """``Telemetry`` whose ``/metrics`` reports every worker of the host.

    The request path is ``Telemetry``'s own, unchanged; only scrapes and the
    periodic ``flush`` differ. Needs ``PROMETHEUS_MULTIPROC_DIR`` to have been
    set when prometheus-client was imported (``gunicorn_conf`` sees to it).
    """

    def register(self) -> None:
        """Scrapes read every worker's files, not this worker's numbers."""
        MultiProcessCollector(self.registry)  # type: ignore[no-untyped-call]  # untyped upstream
        self._copies = [_copier(metric) for metric in self.metrics]

    def add(self, *metrics: PlainMetric) -> None:
        """More metrics, copied into the files like the others."""
        super().add(*metrics)
        self._copies += [_copier(metric) for metric in metrics]

    def flush(self) -> None:
        """Copy into this worker's files whatever changed since the last copy."""
        for copy in self._copies:
            copy()

    def exposition(self) -> bytes:
        """The host's metrics, this worker's own numbers exact as of now."""
        self.flush()
        return super().exposition()

    async def flushing(self, _app: object) -> AsyncIterator[None]:
        """A ``cleanup_ctx``: flush every ``FLUSH_INTERVAL`` while serving, and once at the end."""
        task = asyncio.create_task(self._flush_every(FLUSH_INTERVAL))
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            self.flush()

    async def _flush_every(self, interval: float) -> None:
        warned = False
        while True:
            await asyncio.sleep(interval)
            try:
                self.flush()
            except OSError as exc:  # the directory is gone or the disk is full
                if not warned:
                    warned = True
                    log_event(log, logging.WARNING, "metrics_flush_failed", {"error": str(exc)})


def _copier(metric: PlainMetric) -> Callable[[], None]:
    """A function that copies ``metric``'s changes into a prometheus-client metric's file."""
    if isinstance(metric, PlainCounter | ReadCounter):
        return _counter_copier(metric)
    if isinstance(metric, PlainHistogram):
        return _histogram_copier(metric)
    return _gauge_copier(metric)


def _counter_copier(plain: PlainCounter | ReadCounter) -> Callable[[], None]:
    # registry=None: the files are what a scrape reads, through MultiProcessCollector.
    mirror = Counter(plain.name, plain.documentation, plain.labels, registry=None)
    copied: dict[tuple[str, ...], float] = {}

    def copy() -> None:
        for labels, value in plain.values.items():
            delta = value - copied.get(labels, 0.0)
            if delta:
                (mirror.labels(*labels) if labels else mirror).inc(delta)
                copied[labels] = value

    return copy


def _histogram_copier(plain: PlainHistogram) -> Callable[[], None]:
    mirror = Histogram(plain.name, plain.documentation, buckets=plain.bounds, registry=None)
    # prometheus-client has no public call that adds n observations to one
    # bucket; its histogram keeps one value per bucket (``_buckets``, not
    # cumulative, the +Inf bucket last, as ours) and ``_sum``. Pinned by
    # tests/fleet: the host's histogram counts must equal the requests served.
    buckets, total = mirror._buckets, mirror._sum
    copied = [0] * len(plain.counts)
    copied_total = [0.0]

    def copy() -> None:
        for index, count in enumerate(plain.counts):
            delta = count - copied[index]
            if delta:
                buckets[index].inc(delta)
                copied[index] = count
        delta_total = plain.total - copied_total[0]
        if delta_total:
            total.inc(delta_total)
            copied_total[0] = plain.total

    return copy


def _gauge_copier(plain: PlainGauge) -> Callable[[], None]:
    mirror = Gauge(
        plain.name,
        plain.documentation,
        plain.labels,
        registry=None,
        multiprocess_mode=plain.host_mode,
    )
    written: dict[tuple[str, ...], float] = {}

    def copy() -> None:
        for labels, read in plain.readers.items():
            value = read()
            if written.get(labels) != value:
                (mirror.labels(*labels) if labels else mirror).set(value)
                written[labels] = value

    return copy
