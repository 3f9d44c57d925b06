"""Host-wide metrics: plain numbers copied into prometheus-client's multiprocess files.

In-process, with prometheus-client switched to multiprocess mode the way its
own tests do it (a ``MultiProcessValue`` with a fixed process id); the
gunicorn tests in ``tests/fleet`` check the same across real workers.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, values

from quoteflow.hostmetrics import HostTelemetry
from quoteflow.observe import BUSY, PlainGauge, PlainHistogram, ReadCounter, Telemetry
from tests.test_observability import metric


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[HostTelemetry]:
    """A ``HostTelemetry`` writing to files in a fresh directory, as worker 4242."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    one_worker = values.MultiProcessValue(lambda: 4242)  # type: ignore[no-untyped-call]
    monkeypatch.setattr(values, "ValueClass", one_worker)
    telemetry = HostTelemetry(CollectorRegistry())
    telemetry.watch(inbound=lambda: 3, outbound=lambda: 5)
    telemetry.watch_suppliers(("atlas", "boreal", "cedar"), retry_tokens=lambda s: 20.0)
    yield telemetry
    values.close_all_multiprocess_files()  # type: ignore[no-untyped-call]  # untyped upstream


def _scrape(telemetry: HostTelemetry) -> str:
    return telemetry.exposition().decode()


def _duration(telemetry: HostTelemetry) -> PlainHistogram:
    found = [m for m in telemetry.metrics if m.name == "quoteflow_request_duration_seconds"]
    assert isinstance(found[0], PlainHistogram)
    return found[0]


def test_counts_reach_the_files_on_flush_and_only_once(host: HostTelemetry) -> None:
    """Counts are copied as deltas: flushing twice never counts a request twice."""
    for _ in range(3):
        host.refused(BUSY, "id", 503)
    assert metric(_scrape(host), "quoteflow_requests_total", result="busy") == 3
    host.flush()
    host.refused(BUSY, "id", 503)
    host.flush()
    host.flush()
    assert metric(_scrape(host), "quoteflow_requests_total", result="busy") == 4


def test_a_scrape_flushes_the_answering_workers_numbers(host: HostTelemetry) -> None:
    """The worker that answers /metrics is exact as of now, with no periodic flush needed."""
    host.refused(BUSY, "id", 503)
    assert metric(_scrape(host), "quoteflow_requests_total", result="busy") == 1


def test_histograms_keep_buckets_and_sum(host: HostTelemetry) -> None:
    """The host's histogram has the worker's buckets, count and sum."""
    duration = _duration(host)
    for seconds in (0.003, 0.3, 0.3, 5.0):
        duration.observe(seconds)
    text = _scrape(host)
    assert metric(text, "quoteflow_request_duration_seconds_bucket", le="0.005") == 1
    assert metric(text, "quoteflow_request_duration_seconds_bucket", le="0.3") == 3
    assert metric(text, "quoteflow_request_duration_seconds_bucket", le="+Inf") == 4
    assert metric(text, "quoteflow_request_duration_seconds_count") == 4
    assert metric(text, "quoteflow_request_duration_seconds_sum") == pytest.approx(5.603)


def test_gauges_are_read_at_flush_and_summed_over_live_workers(host: HostTelemetry) -> None:
    """In-flight gauges are written from their readers (livesum: the host's total)."""
    text = _scrape(host)
    assert metric(text, "quoteflow_inbound_in_flight") == 3
    assert metric(text, "quoteflow_outbound_in_flight") == 5
    assert metric(text, "quoteflow_retry_budget_tokens", supplier="cedar") == 20


def test_metrics_added_at_start_up_are_exported_in_both_modes(host: HostTelemetry) -> None:
    """``Telemetry.add``: a counter read from elsewhere and a gauge, one process or host-wide."""
    totals: dict[tuple[str, ...], float] = {("ok",): 2.0}
    up = PlainGauge("quoteflow_test_up", "Test gauge.", host_mode="livemin")
    up.readers[()] = lambda: 1.0
    single = Telemetry(CollectorRegistry())
    for telemetry in (single, host):
        telemetry.add(ReadCounter("quoteflow_test_syncs", "Test.", ("result",), lambda: totals), up)
    for text in (single.exposition().decode(), _scrape(host)):
        assert metric(text, "quoteflow_test_syncs_total", result="ok") == 2
        assert metric(text, "quoteflow_test_up") == 1
    totals[("ok",)] = 5.0
    assert metric(_scrape(host), "quoteflow_test_syncs_total", result="ok") == 5
