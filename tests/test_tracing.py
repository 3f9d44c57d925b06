"""OpenTelemetry traces, as a collector receives them: QuoteFlow → a real OTLP/HTTP receiver.

QuoteFlow is built by its own factory, configured by the SDK's ``OTEL_*``
variables (``tracing_from_environ``), in front of the real provider lab; its
spans go over HTTP to ``tests.otlp.Receiver``, which decodes them with
``opentelemetry-proto``. The batch processor flushes every 50 ms here.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import random
import signal
import time
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

import aiohttp
import attrs
import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, Decision, TraceIdRatioBased
from opentelemetry.trace import SpanKind
from pytest_aiohttp import AiohttpClient, AiohttpServer

from provider_lab.app import create_app as create_lab
from provider_lab.state import LabConfig
from quoteflow import spans
from quoteflow.app import GatewayFactory, create_app
from quoteflow.auth import ApiKeys
from quoteflow.callers import load_callers
from quoteflow.catalogue import Catalogue
from quoteflow.config import Settings
from quoteflow.models import Failure, QuoteRequest, SupplierQuote, SupplierTrace
from quoteflow.options import load_catalogue
from quoteflow.service import SupplierGateway
from quoteflow.spans import _sampling
from quoteflow.tracing import SAMPLERS, tracing_from_environ
from tests.callers_files import bearer, write_callers
from tests.conftest import TEST_BUDGET, TEST_CONNECT_TIMEOUT
from tests.fakes import FakeSuppliers
from tests.otlp import CLIENT, ERROR, INTERNAL, SERVER, Receiver
from tests.process import free_port, quoteflow_process

StartTraced = Callable[..., Awaitable[TestClient[Any, Any]]]

FLUSHED_QUICKLY = {"OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1"}
INBOUND = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
INBOUND_TRACE, INBOUND_SPAN = "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"


@pytest.fixture
async def receiver(aiohttp_server: AiohttpServer) -> Receiver:
    """A real OTLP/HTTP receiver on a free port."""
    found = Receiver()
    server = await aiohttp_server(found.app)
    found.url = str(server.make_url("/v1/traces"))
    return found


@pytest.fixture
async def lab(aiohttp_server: AiohttpServer) -> TestServer:
    """The real provider lab, whose ``/stats`` records the headers of every request."""
    return await aiohttp_server(create_lab(LabConfig(seed=1)))


@pytest.fixture
def start_traced(
    aiohttp_client: AiohttpClient,
    monkeypatch: pytest.MonkeyPatch,
    lab: TestServer,
    receiver: Receiver,
) -> StartTraced:
    """Start QuoteFlow exporting to ``receiver``; ``env`` adds ``OTEL_*`` variables."""

    async def start(
        env: dict[str, str] | None = None,
        record_delay: float | None = None,
        gateway: GatewayFactory | None = None,
        catalogue: Catalogue | None = None,
        **overrides: Any,
    ) -> TestClient[Any, Any]:
        for name in list(os.environ):
            if name.startswith("OTEL_"):
                monkeypatch.delenv(name)
        variables = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url, **FLUSHED_QUICKLY}
        for name, value in {**variables, **(env or {})}.items():
            monkeypatch.setenv(name, value)
        config = tracing_from_environ(os.environ)
        assert config is not None
        if record_delay is not None:
            config = attrs.evolve(config, record_delay=record_delay)
        values: dict[str, Any] = {
            "budget": TEST_BUDGET,
            "connect_timeout": TEST_CONNECT_TIMEOUT,
            "provider_url": str(lab.make_url("")).rstrip("/"),
        }
        values.update(overrides)
        app = create_app(Settings(**values), tracing=config, gateway=gateway, catalogue=catalogue)
        return await aiohttp_client(app)

    return start


async def quote(
    client: TestClient[Any, Any], scenario: str = "normal", **headers: str
) -> dict[str, Any]:
    """One quote request with its bill; the answer must be a 200."""
    response = await client.post(
        "/api/quotes?explain=1", json={"scenario": scenario}, headers=headers
    )
    assert response.status == 200, await response.text()
    body: dict[str, Any] = await response.json()
    return body


async def lab_headers(lab: TestServer, request_id: str, supplier: str) -> list[dict[str, Any]]:
    """The headers of each request the lab received for ``request_id`` from ``supplier``'s calls."""
    async with aiohttp.ClientSession() as session, session.get(lab.make_url("/stats")) as answer:
        stats = await answer.json()
    return [h for h in stats["headers"][request_id] if h["supplier"] == supplier]


def span_id_of(traceparent: str) -> tuple[str, str, bool]:
    """A ``traceparent``'s trace id, parent (span) id and sampled flag."""
    version, trace_id, span_id, flags = traceparent.split("-")
    assert version == "00"
    return trace_id, span_id, bool(int(flags, 16) & 1)


# -- structure -----------------------------------------------------------------------


async def test_flaky_gives_two_attempt_spans_under_boreals(
    start_traced: StartTraced, receiver: Receiver, lab: TestServer
) -> None:
    """flaky: boreal's span holds two client spans (503, then ok); each named in its traceparent."""
    client = await start_traced()
    body = await quote(client, "flaky")
    assert body["best"]["supplier"] == "boreal"
    request_id = body["request_id"]
    trace = await receiver.trace_of(request_id, spans=1 + 3 + 4)

    server = trace.server
    assert server.name == "POST /api/quotes"
    assert server.parent_id == ""
    assert server.service == "quoteflow"
    assert server.attributes == {
        "http.request.method": "POST",
        "url.path": "/api/quotes",
        "url.scheme": "http",
        "http.route": "/api/quotes",
        "http.response.status_code": 200,
        "quoteflow.request_id": request_id,
    }
    assert body["explain"]["trace_id"] == server.trace_id
    suppliers = trace.children(server)
    assert sorted(s.attributes["quoteflow.supplier"] for s in suppliers) == [
        "atlas",
        "boreal",
        "cedar",
    ]
    assert all(s.kind == INTERNAL for s in suppliers)

    boreal = trace.supplier("boreal")
    assert boreal.name == "supplier boreal"
    assert boreal.attributes == {
        "quoteflow.supplier": "boreal",
        "quoteflow.outcome": "ok",
        "quoteflow.stopped": "success",
        "quoteflow.attempts": 2,
    }
    first, second = trace.children(boreal)
    assert [first.kind, second.kind] == [CLIENT, CLIENT]
    assert first.attributes["quoteflow.attempt"] == 1
    assert first.attributes["quoteflow.outcome"] == "http_503"
    assert first.attributes["http.response.status_code"] == 503
    assert first.attributes["error.type"] == "503"
    assert first.status == ERROR
    assert first.attributes["url.full"].startswith(str(lab.make_url("/quotes/boreal")))
    assert "http.request.resend_count" not in first.attributes
    assert second.attributes["quoteflow.attempt"] == 2
    assert second.attributes["http.request.resend_count"] == 1
    assert second.attributes["quoteflow.outcome"] == "ok"
    assert second.attributes["http.response.status_code"] == 200
    assert second.status != ERROR
    for attempt in (first, second):
        assert attempt.attributes["quoteflow.slot_wait_ms"] >= 0
        assert boreal.start_ns <= attempt.start_ns <= attempt.end_ns <= boreal.end_ns
    backoff = boreal.event("backoff")
    assert backoff.attributes["quoteflow.attempt"] == 1
    assert 20 <= backoff.attributes["quoteflow.backoff_ms"] <= 30  # the default jitter
    assert first.end_ns <= backoff.time_ns <= second.start_ns

    # The lab saw each attempt's own span id, beside the same X-Request-ID.
    seen = await lab_headers(lab, request_id, "boreal")
    assert [h["x_attempt"] for h in seen] == ["1", "2"]
    assert [span_id_of(h["traceparent"]) for h in seen] == [
        (server.trace_id, first.span_id, True),
        (server.trace_id, second.span_id, True),
    ]
    (atlas_attempt,) = trace.children(trace.supplier("atlas"))
    (atlas_seen,) = await lab_headers(lab, request_id, "atlas")
    assert span_id_of(atlas_seen["traceparent"])[1] == atlas_attempt.span_id


async def test_slow_supplier_span_ends_at_the_deadline(
    start_traced: StartTraced, receiver: Receiver
) -> None:
    """slow: boreal's call is stopped by the deadline; its one attempt's outcome is timeout."""
    client = await start_traced()
    body = await quote(client, "slow")
    assert {"supplier": "boreal", "code": "timeout"} in body["failures"]
    trace = await receiver.trace_of(body["request_id"], spans=1 + 3 + 3)
    boreal = trace.supplier("boreal")
    assert boreal.attributes["quoteflow.outcome"] == "timeout"
    assert boreal.attributes["quoteflow.stopped"] == "deadline"
    assert boreal.status == ERROR
    (attempt,) = trace.children(boreal)
    assert attempt.attributes["quoteflow.outcome"] == "timeout"
    assert "http.response.status_code" not in attempt.attributes
    assert attempt.attributes["error.type"] == "timeout"
    assert trace.server.attributes["http.response.status_code"] == 200
    assert trace.server.status != ERROR  # the answer is a 200, with a failure in it
    # Ended where the bill says, within the budget of the request's start.
    assert attempt.end_ns - trace.server.start_ns <= (TEST_BUDGET + 0.1) * 1e9


async def test_broken_supplier_spends_both_attempts(
    start_traced: StartTraced, receiver: Receiver
) -> None:
    """broken: two 503 attempts under boreal's span, which ends http_503, attempts exhausted."""
    client = await start_traced()
    body = await quote(client, "broken")
    trace = await receiver.trace_of(body["request_id"], spans=1 + 3 + 4)
    boreal = trace.supplier("boreal")
    assert boreal.attributes["quoteflow.outcome"] == "http_503"
    assert boreal.attributes["quoteflow.stopped"] == "attempts_exhausted"
    assert [a.attributes["quoteflow.outcome"] for a in trace.children(boreal)] == [
        "http_503",
        "http_503",
    ]
    assert [e.name for e in boreal.events] == ["backoff"]


async def test_a_password_in_the_supplier_url_never_reaches_a_span(
    start_traced: StartTraced, receiver: Receiver, lab: TestServer
) -> None:
    """``url.full`` of an attempt masks the password of the configured supplier URL."""
    url = lab.make_url("").with_user("quoteflow").with_password("s3cret")
    client = await start_traced(provider_url=str(url).rstrip("/"))
    body = await quote(client)
    trace = await receiver.trace_of(body["request_id"], spans=1 + 3 + 3)
    attempts = [span for span in trace.spans if span.kind == CLIENT]
    assert len(attempts) == 3
    for attempt in attempts:
        assert attempt.attributes["url.full"].startswith(f"http://quoteflow:***@{url.host}:")
        assert "s3cret" not in str(attempt.attributes)


async def test_secrets_and_tokens_of_templated_suppliers_never_reach_a_span(
    aiohttp_client: AiohttpClient,
    monkeypatch: pytest.MonkeyPatch,
    receiver: Receiver,
    lab: TestServer,
    tmp_path: Path,
) -> None:
    """A ``${VAR}`` key in the query is ``***`` in ``url.full``; the bearer token is nowhere."""
    base = str(lab.make_url("")).rstrip("/")
    path = tmp_path / "suppliers.toml"
    path.write_text(
        f"""[[supplier]]
name = "boreal"
method = "POST"
url = "{base}/json/boreal/quote"
adapter = "provider_lab.adapters:json_dialect"
body = {{ items = [ {{ partNumber = "{{sku}}", quantity = "{{quantity}}" }} ] }}
oauth2 = {{ token_url = "{base}/oauth2/token", client_id = "quoteflow", client_secret = "${{S}}" }}

[[supplier]]
name = "cedar"
url = "{base}/path/cedar/parts/{{sku}}/price"
query = {{ qty = "{{quantity}}", key = "${{K}}" }}
adapter = "provider_lab.adapters:path_dialect"
"""
    )
    environ = {"S": "lab-secret", "K": "lab-key"}
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    variables = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.url, **FLUSHED_QUICKLY}
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    config = tracing_from_environ(os.environ)
    settings = Settings(
        budget=TEST_BUDGET,
        connect_timeout=TEST_CONNECT_TIMEOUT,
        suppliers_file=str(path),
        fx_rates=f"{base}/fx/eurofxref-daily.xml",  # boreal quotes in euros
    )
    catalogue = load_catalogue(settings, environ)
    client = await aiohttp_client(
        create_app(settings, catalogue=catalogue, environ=environ, tracing=config)
    )
    body = await quote(client)
    assert body["failures"] == []
    trace = await receiver.trace_of(body["request_id"], spans=1 + 2 + 2)
    sent = [span for span in trace.spans if span.kind == CLIENT]
    assert sorted(span.name for span in sent) == ["GET", "POST"]
    cedar = next(span for span in sent if span.name == "GET")
    assert cedar.attributes["url.full"].endswith("/path/cedar/parts/KB-001/price?qty=2&key=***")
    everything = str([(span.name, span.attributes, span.events) for span in trace.spans])
    for secret in ("lab-secret", "lab-key", "Bearer"):
        assert secret not in everything


async def test_a_supplier_not_retried_gets_a_no_retry_event(
    start_traced: StartTraced, receiver: Receiver
) -> None:
    """malformed: invalid data is not retried, and boreal's span says so in a no_retry event."""
    client = await start_traced()
    body = await quote(client, "malformed")
    trace = await receiver.trace_of(body["request_id"], spans=1 + 3 + 3)
    boreal = trace.supplier("boreal")
    assert boreal.attributes["quoteflow.outcome"] == "invalid_data"
    event = boreal.event("no_retry")
    assert event.attributes == {"quoteflow.attempt": 1, "quoteflow.stopped": "not_retryable"}
    (attempt,) = trace.children(boreal)
    assert attempt.attributes["error.type"] == "invalid_data"
    assert attempt.attributes["http.response.status_code"] == 200


async def test_an_open_circuit_is_an_event_on_the_request_span(
    start_traced: StartTraced, receiver: Receiver
) -> None:
    """A supplier not asked (its circuit open) is a circuit_open event, and has no span."""
    client = await start_traced(breaker_failures=1, breaker_open=5.0)
    await quote(client, "broken")  # boreal's circuit opens
    body = await quote(client)
    assert {"supplier": "boreal", "code": "circuit_open"} in body["failures"]
    trace = await receiver.trace_of(body["request_id"], spans=1 + 2 + 2)
    assert trace.server.event("circuit_open").attributes == {"quoteflow.supplier": "boreal"}
    assert sorted(s.attributes["quoteflow.supplier"] for s in trace.children(trace.server)) == [
        "atlas",
        "cedar",
    ]


async def test_refused_requests_get_their_server_span(
    start_traced: StartTraced, receiver: Receiver, tmp_path: Any
) -> None:
    """400, 401, 404, 413, 422 and 503: each answer is a server span with its status."""
    keys = tmp_path / "keys"
    keys.write_text("secret-key-1\n")
    client = await start_traced(
        inbound_limit=1, api_keys=ApiKeys.from_file(str(keys)), max_request_bytes=1024
    )
    auth = {"Authorization": "Bearer secret-key-1"}
    statuses: dict[str, int] = {}

    async def post(**kwargs: Any) -> None:
        response = await client.post("/api/quotes", **kwargs)
        statuses[response.headers["X-Request-ID"]] = response.status

    await post(json={})  # no key: 401
    await post(data=b"{", headers=auth)  # 400
    await post(json={"quantity": 0}, headers=auth)  # 422
    await post(data=b"x" * 4096, headers=auth)  # 413
    slow = asyncio.create_task(client.post("/api/quotes", json={"scenario": "slow"}, headers=auth))
    await asyncio.sleep(0.1)  # the one inbound slot is taken
    await post(json={}, headers=auth)  # 503
    (await slow).release()
    response = await client.get("/no/such/path")
    statuses[response.headers["X-Request-ID"]] = response.status
    assert sorted(statuses.values()) == [400, 401, 404, 413, 422, 503]

    spans = await receiver.wait_for(lambda found: len([s for s in found if s.kind == SERVER]) >= 7)
    answered = {
        s.attributes["quoteflow.request_id"]: s.attributes["http.response.status_code"]
        for s in spans
        if s.kind == SERVER and s.attributes["quoteflow.request_id"] in statuses
    }
    assert answered == statuses
    unknown = next(s for s in spans if s.attributes.get("url.path") == "/no/such/path")
    assert unknown.name == "GET"
    assert "http.route" not in unknown.attributes
    # As the HTTP conventions have it, only the 5xx (our 503) is the server's error.
    errors = {
        s.attributes["http.response.status_code"]: s.attributes.get("error.type")
        for s in spans
        if s.kind == SERVER and s.status == ERROR
    }
    assert errors == {503: "503"}


async def test_a_named_callers_requests_carry_its_name_refused_or_not(
    start_traced: StartTraced, receiver: Receiver, tmp_path: Path
) -> None:
    """A callers file: the server span names the caller, on its 200 and on its 429 alike."""
    callers = load_callers(
        str(write_callers(tmp_path / "callers.toml", {"name": "acme", "rate": "1/60s"})), {}
    )
    client = await start_traced(callers=callers)
    served = await client.post("/api/quotes", json={}, headers=bearer("acme"))
    refused = await client.post("/api/quotes", json={}, headers=bearer("acme"))
    assert (served.status, refused.status) == (200, 429)
    ids = {served.headers["X-Request-ID"]: 200, refused.headers["X-Request-ID"]: 429}
    spans = await receiver.wait_for(lambda found: len([s for s in found if s.kind == SERVER]) >= 2)
    named = {
        s.attributes["quoteflow.request_id"]: (
            s.attributes["http.response.status_code"],
            s.attributes.get("quoteflow.caller"),
        )
        for s in spans
        if s.kind == SERVER
    }
    assert named == {request_id: (status, "acme") for request_id, status in ids.items()}


@pytest.mark.parametrize("broken_part", ["_record", "_server_span"])
async def test_a_failure_making_the_spans_never_costs_the_answer(
    broken_part: str,
    start_traced: StartTraced,
    receiver: Receiver,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bug making the spans, in a batch or reading the request as it ends: every answer is
    still the 200, and each bug is logged with its own request's trace id."""

    def broken(*args: object) -> None:
        raise RuntimeError("a bug in making spans")

    if broken_part == "_record":
        monkeypatch.setattr(spans.Tracing, "_record", broken)
    else:
        monkeypatch.setattr(spans, "_server_span", broken)
    client = await start_traced(record_delay=60)  # only a full batch makes spans
    with caplog.at_level(logging.INFO, logger="quoteflow"):
        bodies = [await quote(client) for _ in range(spans.RECORD_BATCH)]  # each checked: 200
        failures: list[logging.LogRecord] = []
        for _ in range(200):  # the batch is made in the loop's next turn
            failures = [r for r in caplog.records if getattr(r, "event", None) == "trace_failed"]
            if len(failures) == spans.RECORD_BATCH:
                break
            await asyncio.sleep(0.01)
    assert all(body["failures"] == [] for body in bodies)
    for failed in failures:
        assert failed.levelno == logging.ERROR
        assert failed.exc_info is not None
        assert "a bug in making spans" in str(failed.exc_info[1])
    assert [failed.fields["trace_id"] for failed in failures] == [  # type: ignore[attr-defined]
        body["explain"]["trace_id"] for body in bodies
    ]
    await asyncio.sleep(0.2)
    assert receiver.spans == []


async def test_sampled_requests_spans_are_made_together_and_the_last_at_shutdown(
    start_traced: StartTraced, receiver: Receiver
) -> None:
    """Spans wait for RECORD_BATCH answered requests (or the delay); shutdown makes the rest."""
    client = await start_traced(record_delay=60)  # only the batch or the shutdown makes them
    first: list[dict[str, Any]] = []
    answered_ns: dict[str, int] = {}  # when each answer had arrived: its server span ended before
    for _ in range(spans.RECORD_BATCH):
        if len(first) == spans.RECORD_BATCH - 1:
            await asyncio.sleep(0.3)  # six export periods
            assert receiver.spans == []
        first.append(await quote(client))
        answered_ns[first[-1]["request_id"]] = time.time_ns()
    found = await receiver.wait_for(lambda found: len(found) >= 7 * spans.RECORD_BATCH)
    servers = {s.attributes["quoteflow.request_id"]: s for s in found if s.kind == SERVER}
    assert set(servers) == {body["request_id"] for body in first}
    for body in first:  # each request's own trace, its spans under its server span
        server = servers[body["request_id"]]
        assert server.trace_id == body["explain"]["trace_id"]
        # Its times are the request's, not when the batch was made (at the eighth answer).
        assert server.end_ns <= answered_ns[body["request_id"]] + 2_000_000
        own = [s for s in found if s.trace_id == server.trace_id]
        assert len(own) == 7
        assert {s.parent_id for s in own if s.kind == INTERNAL} == {server.span_id}
    last = await quote(client)
    await client.close()  # the app's cleanup makes and flushes the last one's spans
    assert last["explain"]["trace_id"] in {s.trace_id for s in receiver.spans}
    assert len(receiver.spans) == 7 * (spans.RECORD_BATCH + 1)


@pytest.mark.parametrize("sharing", [{}, {"coalesce": True}], ids=["direct", "coalesced"])
async def test_a_pooled_supplier_connection_keeps_nothing_of_a_sampled_request(
    start_traced: StartTraced, lab: TestServer, receiver: Receiver, sharing: dict[str, Any]
) -> None:
    """A kept-alive connection runs its callbacks in the context it was opened in.

    That is the context of the sampled request whose supplier call opened
    it (or of the shared call's task, a copy of it), for as long as the
    connection lives: once its spans are made, nothing of that request's
    bills may be held there.
    """
    kept: list[weakref.ref[SupplierTrace]] = []

    class Noting:
        def __init__(self, inner: SupplierGateway) -> None:
            self.inner = inner

        def quote(
            self, trace: SupplierTrace, request: QuoteRequest, request_id: str, deadline: float
        ) -> Coroutine[Any, Any, SupplierQuote | Failure]:
            kept.append(weakref.ref(trace))
            return self.inner.quote(trace, request, request_id, deadline)

    client = await start_traced(record_delay=0.01, gateway=Noting, **sharing)
    await quote(client)
    await receiver.wait_for(lambda found: len(found) >= 7)
    assert lab.runner is not None
    assert lab.runner.server is not None
    assert len(lab.runner.server.connections) == 3  # still open, kept for the next request
    gc.collect()
    assert len(kept) == 3
    assert [ref() for ref in kept] == [None, None, None]


# -- context -------------------------------------------------------------------------


async def test_an_inbound_traceparent_is_continued_to_the_suppliers(
    start_traced: StartTraced,
    receiver: Receiver,
    lab: TestServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The caller's trace id is kept: by the spans, the bill, the log line and every attempt."""
    client = await start_traced()
    with caplog.at_level(logging.INFO, logger="quoteflow"):
        body = await quote(client, "flaky", traceparent=INBOUND, tracestate="vendor=a1")
    trace = await receiver.trace_of(body["request_id"], spans=1 + 3 + 4)
    assert {span.trace_id for span in trace.spans} == {INBOUND_TRACE}
    assert trace.server.parent_id == INBOUND_SPAN
    assert body["explain"]["trace_id"] == INBOUND_TRACE
    (logged,) = [r for r in caplog.records if getattr(r, "event", None) == "quote_request"]
    assert logged.fields["trace_id"] == INBOUND_TRACE  # type: ignore[attr-defined]
    assert logged.fields["request_id"] == body["request_id"]  # type: ignore[attr-defined]
    attempts = {s.span_id for s in trace.spans if s.kind == CLIENT}
    for supplier in ("atlas", "boreal", "cedar"):
        for seen in await lab_headers(lab, body["request_id"], supplier):
            trace_id, span_id, flags = span_id_of(seen["traceparent"])
            assert (trace_id, flags) == (INBOUND_TRACE, True)
            assert span_id in attempts


@pytest.mark.parametrize("flags", ["01", "00"])
async def test_the_callers_tracestate_reaches_every_attempt(
    start_traced: StartTraced, suppliers: FakeSuppliers, flags: str
) -> None:
    """``tracestate`` goes on with the trace to every supplier, sampled or not."""
    client = await start_traced(provider_url=suppliers.url)
    inbound = INBOUND.removesuffix("01") + flags
    body = await quote(client, traceparent=inbound, tracestate="vendor=a1,other=b2")
    assert body["explain"]["trace_id"] == INBOUND_TRACE
    assert len(suppliers.received) == 3
    for received in suppliers.received:
        trace_id, span_id, sampled = span_id_of(received.headers["traceparent"])
        assert (trace_id, sampled) == (INBOUND_TRACE, flags == "01")
        assert span_id != INBOUND_SPAN
        assert received.headers["tracestate"] == "vendor=a1,other=b2"
        assert received.request_id == body["request_id"]


async def test_several_tracestate_headers_reach_the_suppliers_as_one(
    start_traced: StartTraced, suppliers: FakeSuppliers
) -> None:
    """Two ``tracestate`` headers are one list (W3C Trace Context), passed on whole."""
    client = await start_traced(provider_url=suppliers.url)
    headers = [("traceparent", INBOUND), ("tracestate", "vendor=a1"), ("tracestate", "other=b2")]
    response = await client.post("/api/quotes", json={}, headers=headers)
    assert response.status == 200
    assert len(suppliers.received) == 3
    assert {r.headers["tracestate"] for r in suppliers.received} == {"vendor=a1,other=b2"}


async def test_a_request_not_sampled_passes_its_trace_on_and_exports_nothing(
    start_traced: StartTraced, receiver: Receiver, lab: TestServer
) -> None:
    """An unsampled caller's trace: suppliers see it with the flag off, a span id per attempt."""
    client = await start_traced()
    unsampled = INBOUND.removesuffix("01") + "00"
    body = await quote(client, "flaky", traceparent=unsampled)
    assert body["explain"]["trace_id"] == INBOUND_TRACE
    seen = [
        span_id_of(h["traceparent"])
        for supplier in ("atlas", "boreal", "cedar")
        for h in await lab_headers(lab, body["request_id"], supplier)
    ]
    assert len(seen) == 4
    assert {(trace_id, flags) for trace_id, _, flags in seen} == {(INBOUND_TRACE, False)}
    assert len({span_id for _, span_id, _ in seen} | {INBOUND_SPAN}) == 5
    await quote(client)  # a sampled one, flushed after the first
    await receiver.wait_for(lambda found: len(found) >= 7)
    assert INBOUND_TRACE not in {span.trace_id for span in receiver.spans}


async def test_a_root_request_not_sampled_names_a_fresh_span_on_every_attempt(
    start_traced: StartTraced, receiver: Receiver, lab: TestServer
) -> None:
    """No caller's trace, not sampled: a new trace id, a span id per attempt, the flag off."""
    client = await start_traced(
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"}
    )
    body = await quote(client, "flaky")
    trace_id = body["explain"]["trace_id"]
    headers = [
        h
        for supplier in ("atlas", "boreal", "cedar")
        for h in await lab_headers(lab, body["request_id"], supplier)
    ]
    assert len(headers) == 4
    # The flags of the SDK's own dropped root: not sampled, the trace id random (W3C level 2).
    dropped = TracerProvider(sampler=ALWAYS_OFF, shutdown_on_exit=False).get_tracer("t")
    flags = dropped.start_span("HTTP").get_span_context().trace_flags
    assert {h["traceparent"][-3:] for h in headers} == {f"-{flags:02x}"} == {"-02"}
    seen = [span_id_of(h["traceparent"]) for h in headers]
    assert {(trace, sampled) for trace, _, sampled in seen} == {(trace_id, False)}
    assert len({span_id for _, span_id, _ in seen} - {"0" * 16}) == 4
    assert all("tracestate" not in h for h in headers)
    other = await quote(client)
    assert other["explain"]["trace_id"] not in (trace_id, "0" * 32)
    await asyncio.sleep(0.2)  # three flush periods: nothing was queued to leave
    assert receiver.spans == []


async def test_the_sampled_share_of_root_requests_follows_the_trace_id_rule(
    start_traced: StartTraced, receiver: Receiver, suppliers: FakeSuppliers
) -> None:
    """Ratio 0.5: exactly the requests whose trace id is below the bound are traced, and say so."""
    client = await start_traced(
        {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.5"},
        provider_url=suppliers.url,
    )
    bound = TraceIdRatioBased(0.5).bound
    sampled: dict[str, bool] = {}
    for _ in range(40):
        body = await quote(client)
        trace_id = body["explain"]["trace_id"]
        sampled[trace_id] = int(trace_id, 16) & TraceIdRatioBased.TRACE_ID_LIMIT < bound
        attempts = [r for r in suppliers.received if r.request_id == body["request_id"]]
        assert len(attempts) == 3
        for attempt in attempts:
            assert span_id_of(attempt.headers["traceparent"])[::2] == (trace_id, sampled[trace_id])
    assert 0 < sum(sampled.values()) < 40  # both sides: 40 coin flips, 2 in 10^12 to fail
    traced = {trace for trace, is_sampled in sampled.items() if is_sampled}
    await receiver.wait_for(lambda found: {s.trace_id for s in found} >= traced)
    await asyncio.sleep(0.2)  # any straggler of a request not sampled would be in by now
    assert {span.trace_id for span in receiver.spans} == traced
    assert len(receiver.spans) == 7 * len(traced)  # the server, 3 supplier calls, 3 attempts


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_the_rule_applied_before_a_root_span_is_the_sdks_sampler(
    monkeypatch: pytest.MonkeyPatch, sampler: str
) -> None:
    """For every sampler the SDK's variable can name: the sampler the SDK would build, and the
    root rule QuoteFlow applies before making any span decides as that sampler does."""
    env = {"OTEL_TRACES_SAMPLER": sampler, "OTEL_TRACES_SAMPLER_ARG": "0.3"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = tracing_from_environ({"OTEL_TRACES_EXPORTER": "console", **env})
    assert config is not None
    built, bound = _sampling(config)
    from_environ = TracerProvider(shutdown_on_exit=False).sampler
    assert built.get_description() == from_environ.get_description()
    draws = random.Random(22)
    for _ in range(2000):
        trace_id = draws.getrandbits(128) or 1
        decision = built.should_sample(None, trace_id, "HTTP", SpanKind.SERVER).decision
        by_rule = bound is None or trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < bound
        assert (decision is Decision.RECORD_AND_SAMPLE) == by_rule


# -- a collector that is down or hangs ------------------------------------------------------


def _queue_length(client: TestClient[Any, Any]) -> int:
    """Spans waiting in the batch processor's queue (the SDK's own, bounded deque)."""
    middleware = client.app.middlewares[0]
    tracing = middleware.__self__
    (processor,) = tracing.provider._active_span_processor._span_processors
    return len(processor._batch_processor._queue)


@pytest.mark.parametrize("collector", ["down", "hanging"])
async def test_a_collector_down_or_hanging_never_delays_an_answer(
    start_traced: StartTraced, receiver: Receiver, collector: str
) -> None:
    """Answers stay within the budget, the span queue stays at its bound, shutdown is prompt."""
    receiver.hang = True
    endpoint = f"http://127.0.0.1:{free_port()}/v1/traces" if collector == "down" else receiver.url
    client = await start_traced(
        {
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": endpoint,
            "OTEL_BSP_MAX_QUEUE_SIZE": "16",
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "8",
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "0.3",
            "OTEL_BSP_EXPORT_TIMEOUT": "300",
        }
    )
    slowest, longest_queue = 0.0, 0
    for _ in range(15):  # 8 spans each: far more than the queue holds
        began = time.monotonic()
        await quote(client, "flaky")
        slowest = max(slowest, time.monotonic() - began)
        longest_queue = max(longest_queue, _queue_length(client))
    assert slowest < TEST_BUDGET
    assert longest_queue <= 16
    if collector == "hanging":
        assert receiver.exports >= 1  # it was asked, and never answered
        assert longest_queue == 16  # full: the rest were dropped
    began = time.monotonic()
    await client.close()  # the app's cleanup: a last flush that cannot finish
    assert time.monotonic() - began < 3.0


# -- python -m quoteflow, configured by the environment alone ------------------------------


async def test_python_m_quoteflow_is_configured_by_the_sdks_variables(
    monkeypatch: pytest.MonkeyPatch, receiver: Receiver, lab: TestServer
) -> None:
    """The generic endpoint, service name and parent-based sampler, as a real process reads them.

    Ratio 0: a request of its own is not traced, a caller's sampled trace is
    followed; its log line carries the trace id; SIGTERM flushes the last spans.
    """
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)
    base = receiver.url.removesuffix("/v1/traces")
    for name, value in {
        "OTEL_EXPORTER_OTLP_ENDPOINT": base,
        "OTEL_SERVICE_NAME": "quoteflow-test",
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0",
        # A long delay: only the shutdown's flush can have sent the spans.
        "OTEL_BSP_SCHEDULE_DELAY": "60000",
    }.items():
        monkeypatch.setenv(name, value)
    lab_url = str(lab.make_url("")).rstrip("/")
    async with quoteflow_process(lab_url, capture_log=True) as running:
        async with aiohttp.ClientSession() as session:
            for headers in ({}, {"traceparent": INBOUND}):
                async with session.post(
                    running.url + "/api/quotes", json={"scenario": "flaky"}, headers=headers
                ) as answer:
                    assert answer.status == 200
        running.process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(running.process.wait(), 10) == 0
        assert running.process.stderr is not None
        log_lines = (await running.process.stderr.read()).decode().splitlines()
    spans = await receiver.wait_for(lambda found: len(found) >= 8, within_s=2)
    assert len(spans) == 8  # the caller's request only: 1 + 3 + 4
    assert {(span.trace_id, span.service) for span in spans} == {(INBOUND_TRACE, "quoteflow-test")}
    events = [json.loads(line) for line in log_lines if line.startswith("{")]
    requests = [e for e in events if e["event"] == "quote_request"]
    assert len(requests) == 2
    assert requests[1]["trace_id"] == INBOUND_TRACE
    assert requests[0]["trace_id"] not in (INBOUND_TRACE, None)  # not sampled, yet named
    (started,) = [e for e in events if e["event"] == "tracing_on"]
    assert started["endpoint"] == receiver.url
    assert (started["sampler"], started["ratio"]) == ("parentbased_traceidratio", 0.0)


async def test_a_carts_batch_calls_get_a_span_each_with_their_lines(
    start_traced: StartTraced, receiver: Receiver, lab: TestServer, tmp_path: Path
) -> None:
    """A cart of 3 lines to a batch supplier of ``max_items = 2``: two call spans, 2 and 1 lines."""
    lab_url = str(lab.make_url("")).rstrip("/")
    path = tmp_path / "suppliers.toml"
    path.write_text(
        "[[supplier]]\n"
        'name = "atlas"\n'
        'method = "POST"\n'
        f'url = "{lab_url}/batch/atlas/match"\n'
        'adapter = "provider_lab.adapters:batch_dialect"\n'
        'body = { parts = [ { mpn = "{sku}", qty = "{quantity}" } ] }\n'
        'batch = { max_items = 2, items = "parts" }\n'
    )
    settings = Settings(suppliers_file=str(path))
    client = await start_traced(
        catalogue=load_catalogue(settings, {}), suppliers_file=str(path), cart_budget=1.0
    )
    lines = [{"sku": f"HOT-0{n}", "quantity": 1} for n in (1, 2, 3)]
    response = await client.post("/api/carts", json={"lines": lines})
    assert response.status == 200
    request_id = (await response.json())["request_id"]
    trace = await receiver.trace_of(request_id, spans=1 + 2 + 2)
    assert trace.server.name == "POST /api/carts"
    calls = trace.children(trace.server)
    assert sorted(call.attributes["quoteflow.lines"] for call in calls) == [1, 2]
    for call in calls:
        assert call.attributes["quoteflow.outcome"] == "ok"
        (attempt,) = trace.children(call)
        assert attempt.kind == CLIENT
        assert attempt.attributes["url.full"].startswith(f"{lab_url}/batch/atlas/match")


async def test_a_hedged_call_shows_the_hedge_and_a_cancelled_loser_that_is_no_error(
    start_traced: StartTraced, receiver: Receiver, lab: TestServer, tmp_path: Path
) -> None:
    """boreal's first attempt held 1 s by the lab: the hedge wins; the loser's span is no error."""
    lab_url = str(lab.make_url("")).rstrip("/")
    path = tmp_path / "suppliers.toml"
    path.write_text(
        "".join(
            f'[[supplier]]\nname = "{name}"\nurl = "{lab_url}/quotes/{name}"\n{extra}\n'
            for name, extra in (
                ("atlas", ""),
                ("boreal", "hedge = { delay = 0.05 }"),
                ("cedar", ""),
            )
        )
    )
    async with aiohttp.ClientSession() as session:
        fault = {"kind": "latency", "ms": 1000, "count": 1}
        async with session.put(lab.make_url("/faults/boreal"), json=fault) as answer:
            assert answer.status in (200, 201)
    settings = Settings(suppliers_file=str(path))
    client = await start_traced(
        catalogue=load_catalogue(settings, {}), suppliers_file=str(path), budget=1.5
    )
    body = await quote(client)
    assert body["explain"]["suppliers"]["boreal"]["won"] == 2
    trace = await receiver.trace_of(body["request_id"], spans=1 + 3 + 4)
    boreal = trace.supplier("boreal")
    assert boreal.attributes["quoteflow.won"] == 2
    assert boreal.status != ERROR
    by_attempt = {span.attributes["quoteflow.attempt"]: span for span in trace.children(boreal)}
    assert by_attempt[1].attributes["quoteflow.outcome"] == "cancelled"
    assert by_attempt[1].status != ERROR
    assert "quoteflow.hedge" not in by_attempt[1].attributes
    assert by_attempt[2].attributes["quoteflow.hedge"] is True
    assert by_attempt[2].attributes["quoteflow.outcome"] == "ok"
