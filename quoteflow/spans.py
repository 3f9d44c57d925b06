r"""OpenTelemetry spans of a request, its supplier calls and their attempts.

Imported only when tracing is on (``tracing.py`` decides, ``app.py`` wires
this in): with tracing off nothing here is loaded, and no request pays for it.

One trace per inbound request, continuing the caller's when it sends a
W3C ``traceparent``::

    POST /api/quotes        server    http.*, quoteflow.request_id, quoteflow.caller
    ├── supplier atlas      internal  quoteflow.supplier, .outcome, .stopped, .attempts
    │   └── GET             client    url.full, http.response.status_code,
    │                                 quoteflow.attempt, .outcome, .slot_wait_ms
    ├── supplier boreal               events: backoff, no_retry
    │   ├── GET             (attempt 1: http_503)
    │   └── GET             (attempt 2: ok)
    └── supplier cedar ...            (the server span gets a circuit_open event
                                       for a supplier that was not asked)

Each attempt sends ``traceparent`` naming its own span, so a supplier's
trace hangs under the very attempt that reached it.

Three seams see a request, each wired at start-up: ``middleware``
(outermost, so it sees every answer, refusals included), ``gateway`` (wraps
the supplier client, as ``service.SupplierGateway``) and ``sending``
(``supplier.AttemptListener``: called as an attempt's headers are made).

**The sampling decision comes first, and costs a request the sampler drops
almost nothing.** Its trace id (and, for a root, the sampler's rule for a
root, which reads the trace id alone) is settled as the request arrives,
before the SDK is asked for anything; a dropped request only passes its
trace on (``traceparent`` with the sampled flag off, a fresh span id per
attempt) and makes no span at all.

**A sampled request's spans are made in one go, from the bill, as it ends.**
While it runs, a sampled request only notes what the bill does not hold:
when each supplier call began and ended, and the span id each attempt sent
in its ``traceparent``. Its ``AttemptRecord``\ s already hold the slot wait,
the status, the outcome and when each attempt ended, so the trace and
``?explain=1`` always tell the same story. All its spans are then started
and ended with those times, one after the other, through the SDK's own
tracer (its sampler, span limits and batch processor): the SDK's span code
runs in one burst instead of scattered over the request.

**And several sampled requests' spans are made together.** An ended
request's spans wait for ``RECORD_BATCH`` requests' worth, or for the
config's ``record_delay`` (half the batch processor's export delay, at most
a second), whichever comes first; shutdown makes what is left. Made one
request at a time, each burst found the SDK's code and data gone cold from
the caches (at 1 % sampling about a hundred requests pass between two):
docs/benchmark.md, Tracing, has what each step saved.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, Final

import attrs
from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDictProxy
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.propagators.textmap import Getter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    TraceIdRatioBased,
)
from opentelemetry.semconv.attributes.error_attributes import ERROR_TYPE
from opentelemetry.semconv.attributes.http_attributes import (
    HTTP_REQUEST_METHOD,
    HTTP_REQUEST_RESEND_COUNT,
    HTTP_RESPONSE_STATUS_CODE,
    HTTP_ROUTE,
)
from opentelemetry.semconv.attributes.server_attributes import SERVER_ADDRESS, SERVER_PORT
from opentelemetry.semconv.attributes.url_attributes import URL_FULL, URL_PATH, URL_SCHEME
from opentelemetry.trace import SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from yarl import URL

from quoteflow.handlers import CALLER, REQUEST_ID
from quoteflow.logs import log_event
from quoteflow.models import (
    OK,
    STOPPED_DEADLINE,
    STOPPED_NO_TIME,
    STOPPED_NOT_RETRYABLE,
    STOPPED_RETRY_AFTER,
    STOPPED_RETRY_BUDGET,
    TIMEOUT,
    AttemptRecord,
    CartLine,
    Failure,
    QuoteRequest,
    SupplierQuote,
    SupplierTrace,
)
from quoteflow.service import BatchGateway, SupplierGateway
from quoteflow.tracing import DEFAULT_SERVICE_NAME, TracingConfig

log = logging.getLogger("quoteflow")

# QuoteFlow's own attributes; the rest are OpenTelemetry's HTTP semantic conventions.
REQUEST_ID_ATTRIBUTE: Final = "quoteflow.request_id"
CALLER_ATTRIBUTE: Final = "quoteflow.caller"
SUPPLIER: Final = "quoteflow.supplier"
HEDGE: Final = "quoteflow.hedge"
"""On an attempt's span: it was a hedge, sent while the first attempt was still out."""
WON: Final = "quoteflow.won"
"""On a hedged supplier call's span: the attempt whose quote came first."""
LINES: Final = "quoteflow.lines"
"""On a cart's supplier call: how many of its lines the call asked for."""
OUTCOME: Final = "quoteflow.outcome"
"""``ok`` or the failure code (``http_503``, ``timeout``, ...): an attempt's, or the call's."""
STOPPED: Final = "quoteflow.stopped"
ATTEMPT: Final = "quoteflow.attempt"
ATTEMPTS: Final = "quoteflow.attempts"
SLOT_WAIT_MS: Final = "quoteflow.slot_wait_ms"
BACKOFF_MS: Final = "quoteflow.backoff_ms"
CALLER_LEFT: Final = "quoteflow.caller_left"
JOINED: Final = "quoteflow.joined"
"""The request id of the shared call this one joined (``--coalesce``): its attempts are its."""
HANDED_OVER: Final = "quoteflow.handed_over"
"""The request this one handed its shared call to when it left (``--coalesce``)."""
STALE_IF_ERROR: Final = "quoteflow.stale_if_error"
"""The failure a stale quote from the cache stood in for (``--cache-size``)."""
ERROR: Final = "error"
"""``quoteflow.outcome`` of a call that raised: a bug of ours (the answer is a 500)."""

NO_RETRY_REASONS: Final = frozenset(
    {STOPPED_NOT_RETRYABLE, STOPPED_NO_TIME, STOPPED_RETRY_AFTER, STOPPED_RETRY_BUDGET}
)
"""Why a call that failed stopped before its last allowed attempt: a ``no_retry`` event."""

CANCELLED: Final = "cancelled"
"""``quoteflow.stopped`` of a call cut short before its deadline: the caller left."""

DEADLINE_SLACK: Final = 0.005
"""Seconds by which a cancellation may precede the deadline and still be the deadline's.

The deadline's timer is the event loop's, whose clock (uvloop's) moves in
millisecond steps; a call cancelled well before it was cancelled by the caller
leaving."""

RECORD_BATCH: Final = 8
"""Ended sampled requests whose spans are made in one go, as soon as there are this many.

The loop's next turn makes them, with any others that ended before it.
Enough that all but the first find the SDK's code warm; few enough that the
burst (about 0.2 ms a request) holds the event loop no longer than a slow
answer would."""

_NO_PARENT: Final = otel_context.Context()
_PROPAGATOR: Final = TraceContextTextMapPropagator()
"""W3C Trace Context only, whatever ``OTEL_PROPAGATORS`` says: it is what suppliers read."""


class _EveryValue(Getter[CIMultiDictProxy[str]]):
    """Every value of a header: W3C Trace Context joins several ``tracestate`` headers into one."""

    def get(self, carrier: CIMultiDictProxy[str], key: str) -> list[str] | None:
        return carrier.getall(key, None)

    def keys(self, carrier: CIMultiDictProxy[str]) -> list[str]:
        return list(carrier.keys())


_EVERY_VALUE: Final = _EveryValue()
_SAMPLED: Final = int(TraceFlags.SAMPLED)
_RANDOM: Final = int(TraceFlags.RANDOM_TRACE_ID)
"""The flag the SDK sets for its random trace ids (W3C level 2); our roots' ids are as random."""
_SAMPLED_ROOT: Final = f"-{_SAMPLED | _RANDOM:02x}"
_DROPPED_ROOT: Final = f"-{_RANDOM:02x}"


@attrs.define
class _Attempt:
    """An attempt of a sampled request, as it was sent: its span is made once it is billed."""

    attempt: int
    span_id: int
    url: URL
    """As it may be shown: each secret of the catalogue's in it is ``***`` (``templates.py``)."""
    method: str


@attrs.define
class _Call:
    """One supplier call of a sampled request: what the bill does not hold."""

    trace: SupplierTrace
    """The call's bill: its attempts, and why it stopped."""
    deadline: float
    started: float
    """``time.monotonic()`` values, as the bill's."""
    ended: float | None = None
    outcome: SupplierQuote | Failure | None = None
    """None: cancelled (the deadline, or the caller leaving), or a bug of ours."""
    error: Exception | None = None
    """A bug of ours, which propagates (500): on the span too."""
    sent: list[_Attempt] = attrs.Factory(list)


@attrs.define
class _Sampled:
    """What a sampled request's spans are made of when it ends."""

    parent: otel_context.Context
    """The caller's span, or an empty context for a root."""
    root_trace_id: int | None
    """A root's trace id, drawn before its span was; None when the caller's trace continues."""
    started: float
    calls: list[_Call] = attrs.Factory(list)
    circuit_open: list[tuple[str, float]] = attrs.Factory(list)
    """Suppliers not asked, their circuit being open, and when."""


@attrs.frozen
class _Ended:
    """A sampled request that has been answered, waiting for its spans to be made."""

    sampled: _Sampled
    trace_id: str
    name: str
    """The server span's name and attributes, read from the request as it ended."""
    attributes: dict[str, Any]
    failed: bool
    """A 5xx: the server span's status is an error."""
    ended: float
    """``time.monotonic()`` when it was answered."""


@attrs.define
class _Request:
    """The trace of one inbound request, as the seams below need it."""

    trace_id: str
    """32 hex digits: for the bill and the log lines."""
    traceparent: str
    """``00-<trace id>-``: each attempt adds its span id, then ``flags``."""
    flags: str
    """``-01`` sampled, ``-00`` not, the random flag (``02``) added as the SDK would."""
    tracestate: str | None
    sampled: _Sampled | None
    """None: the sampler dropped it, or it has been answered; nothing (more) is recorded."""


# The request's trace lives in context variables of ours, not in OpenTelemetry's
# current context: nothing else in QuoteFlow reads that one, and reading ours is
# a single lookup where the API's takes several calls.
_REQUEST: contextvars.ContextVar[_Request] = contextvars.ContextVar("quoteflow_request_trace")
"""The request being served (supplier calls run in tasks that inherit it)."""
_CALL: contextvars.ContextVar[list[_Call]] = contextvars.ContextVar("quoteflow_supplier_call")
"""The sampled supplier call of this task (each supplier call runs in a task of its own).

Held in a list that is emptied when the call ends: a supplier connection
opened during the call runs its callbacks in a copy of this context for as
long as it is kept alive, and must not keep the call's bill with it."""


def _exporter(name: str) -> SpanExporter:
    if name == "console":
        return ConsoleSpanExporter()
    # Imported here: the console exporter alone does not need the OTLP package.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()  # endpoint, headers, timeout, compression: OTEL_EXPORTER_OTLP_*


def _resource() -> Resource:
    """The SDK's resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``), named ``quoteflow``
    unless those name it."""
    resource = Resource.create({})
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: DEFAULT_SERVICE_NAME}))
    return resource


class _Ids(RandomIdGenerator):
    """The SDK's random ids, except those drawn before their span was made.

    A root request's trace id is drawn as it arrives (its sampling is decided
    by it), and an attempt's span id as the attempt is sent (it is in the
    ``traceparent``). When the request's spans are made, each such id is
    handed over here just before the SDK's ``start_span`` that asks for it
    (nothing can run in between), and that span gets that very id.
    """

    def __init__(self) -> None:
        self._trace_id: int | None = None
        self._span_id: int | None = None

    def hand_over(self, *, trace_id: int | None = None, span_id: int | None = None) -> None:
        """The next trace id and span id the SDK asks for."""
        self._trace_id, self._span_id = trace_id, span_id

    def generate_trace_id(self) -> int:
        drawn, self._trace_id = self._trace_id, None
        return super().generate_trace_id() if drawn is None else drawn

    def generate_span_id(self) -> int:
        drawn, self._span_id = self._span_id, None
        return super().generate_span_id() if drawn is None else drawn


def _sampling(config: TracingConfig) -> tuple[Sampler, int | None]:
    """The SDK's sampler that ``config`` names, and its rule for a root span.

    A root is sampled when its trace id's low 64 bits are below the bound
    returned — ``TraceIdRatioBased``'s own rule, which ``always_off`` (bound
    0) also follows; None when every root is sampled. The sampler is built
    here from the checked settings, not left to the SDK to read again, so
    the rule and the sampler cannot disagree.
    """
    name = config.sampler
    root: Sampler
    bound: int | None
    if name.endswith("always_on"):
        root, bound = ALWAYS_ON, None
    elif name.endswith("always_off"):
        root, bound = ALWAYS_OFF, 0
    else:
        assert config.ratio is not None, "a ratio sampler's ratio is checked at start-up"
        ratio = TraceIdRatioBased(config.ratio)
        root, bound = ratio, ratio.bound
    return (ParentBased(root) if name.startswith("parentbased_") else root), bound


class _Clock:
    """``time.monotonic()`` values of the bill as epoch nanoseconds, from one reading of both."""

    def __init__(self) -> None:
        self.now_ns, self.now = time.time_ns(), time.monotonic()

    def __call__(self, then: float) -> int:
        return self.now_ns - int((self.now - then) * 1e9)


class Tracing:
    """The tracer of one app: its provider, batch processors and the three seams.

    Its own ``TracerProvider``, never the global one: two apps in one process
    (tests) each export to their own endpoint, and nothing else in the
    process is traced behind QuoteFlow's back.
    """

    def __init__(self, config: TracingConfig) -> None:
        self.config = config
        self.provider: TracerProvider | None = None
        """Made at start-up (``running``): its batch processors start threads."""
        self._tracer: otel_trace.Tracer = otel_trace.NoOpTracer()
        self._ids = _Ids()
        self._sampler, self._root_bound = _sampling(config)
        self._log_filter = _TraceIdInLogs()
        self._ended: list[_Ended] = []
        self._recording: asyncio.Handle | None = None
        """When the waiting requests' spans will be made: the delay's timer, or the next turn."""
        self._quiet = contextvars.Context()
        """Where the spans are made: outside every request (log lines carry no request's trace)."""
        self._closed = False
        """The app's cleanup has begun: a request ending now has its spans made at once."""

    # -- the app's lifetime ----------------------------------------------------

    async def running(self, app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx``: spans from start-up on, the last ones flushed at shutdown.

        Log lines written while a request is served carry its trace id.
        """
        # OTEL_BSP_* and OTEL_EXPORTER_OTLP_*: the SDK reads its own variables.
        provider = TracerProvider(
            sampler=self._sampler,
            resource=_resource(),
            id_generator=self._ids,
            shutdown_on_exit=False,
        )
        for name in self.config.exporters:
            # Spans leave in batches from the processor's thread; its queue is
            # bounded (OTEL_BSP_MAX_QUEUE_SIZE): a collector that is down or
            # slow costs dropped spans, never memory or a request's time.
            provider.add_span_processor(BatchSpanProcessor(_exporter(name)))
        self.provider = provider
        self._tracer = provider.get_tracer("quoteflow")
        log_event(log, logging.INFO, "tracing_on", self.config.loggable())
        log.addFilter(self._log_filter)
        try:
            yield
        finally:
            log.removeFilter(self._log_filter)
            self._closed = True
            try:
                self._record_ended()  # every request has ended: the last ones' spans
            finally:
                await self._flush(provider)

    async def _flush(self, provider: TracerProvider) -> None:
        """Export what is queued, waiting at most ``flush_timeout`` for a collector that hangs."""
        # The SDK's shutdown can wait for a hung collector far longer than we
        # want to, and cannot be interrupted: run it on a daemon thread, which
        # cannot hold the process's exit, and stop waiting for it in time.
        flushing = threading.Thread(
            target=provider.shutdown, name="quoteflow-trace-flush", daemon=True
        )
        flushing.start()
        await asyncio.to_thread(flushing.join, self.config.flush_timeout)
        if flushing.is_alive():
            log_event(
                log,
                logging.WARNING,
                "traces_not_flushed",
                {"waited_s": self.config.flush_timeout},
            )

    # -- the request -------------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request's trace: decided as it arrives; a sampled one's spans follow its end."""
        headers = request.headers
        served = self._continued(headers) if "traceparent" in headers else self._root()
        token = _REQUEST.set(served)
        status: int | None = None
        try:
            response = await handler(request)
            status = response.status
            return response
        except web.HTTPException as exc:  # the few that error_middleware lets through
            status = exc.status
            raise
        finally:
            _REQUEST.reset(token)
            if served.sampled is not None:
                self._end(served, request, status)

    def _root(self) -> _Request:
        """The trace of a request that brings none: sampled by its trace id's rule, no SDK call."""
        trace_id = random.getrandbits(128)
        while not trace_id:  # all zeros is no trace id (as the SDK's generator draws)
            trace_id = random.getrandbits(128)
        hexed = trace_id.to_bytes(16, "big").hex()
        bound = self._root_bound
        if bound is not None and trace_id & TraceIdRatioBased.TRACE_ID_LIMIT >= bound:
            return _Request(hexed, f"00-{hexed}-", _DROPPED_ROOT, None, None)
        sampled = _Sampled(_NO_PARENT, trace_id, time.monotonic())
        return _Request(hexed, f"00-{hexed}-", _SAMPLED_ROOT, None, sampled)

    def _continued(self, headers: CIMultiDictProxy[str]) -> _Request:
        """The trace of a request that continues its caller's: the SDK's sampler decides."""
        parent = _PROPAGATOR.extract(headers, getter=_EVERY_VALUE)
        caller = otel_trace.get_current_span(parent).get_span_context()
        if not caller.is_valid:  # a malformed traceparent is no trace: start one
            return self._root()
        # Exactly what the SDK's start_span will ask its sampler once the
        # request ends; the built-in samplers answer it the same both times.
        decision = self._sampler.should_sample(parent, caller.trace_id, "HTTP", SpanKind.SERVER)
        trace_id = f"{caller.trace_id:032x}"
        state = decision.trace_state
        tracestate = state.to_header() if state else None
        # The caller's trace id is random or not; our spans' flags say as it does.
        random_id = caller.trace_flags & _RANDOM
        if decision.decision is not Decision.RECORD_AND_SAMPLE:
            return _Request(trace_id, f"00-{trace_id}-", f"-{random_id:02x}", tracestate, None)
        sampled = _Sampled(parent, None, time.monotonic())
        flags = f"-{_SAMPLED | random_id:02x}"
        return _Request(trace_id, f"00-{trace_id}-", flags, tracestate, sampled)

    def trace_id(self) -> str | None:
        """The trace id of the request being served (``handlers.CurrentTrace``)."""
        served = _REQUEST.get(None)
        return None if served is None else served.trace_id

    def circuit_open(self, supplier: str) -> None:
        """``supplier`` was not asked, its circuit being open: an event on the request's span."""
        served = _REQUEST.get(None)
        if served is not None and served.sampled is not None:
            served.sampled.circuit_open.append((supplier, time.monotonic()))

    # -- supplier calls and their attempts ---------------------------------------

    def gateway(self, inner: SupplierGateway) -> SupplierGateway:
        """``inner``, noting when each supplier call of a sampled request begins and ends."""
        assert self.provider is not None, "wrap the gateway after tracing's cleanup_ctx began"
        return _RecordingGateway(inner)

    def batches(self, inner: BatchGateway) -> BatchGateway:
        """``inner``, noting when each batch call of a sampled cart begins and ends."""
        return _RecordingBatches(inner)

    def sending(self, attempt: int, url: URL, headers: dict[str, str], method: str) -> None:
        """An attempt is about to go out: name its own span in ``traceparent``."""
        served = _REQUEST.get(None)
        if served is None:
            return
        # As the SDK's generator draws span ids: random, never all zeros; and
        # to_bytes().hex(), a fifth of what an f-string's format spec costs.
        span_id = random.getrandbits(64) or 1
        # Dropped, the trace goes on with the sampled flag off, and the id
        # reaches no recorder: a supplier's own trace still follows our decision.
        headers["traceparent"] = (
            served.traceparent + span_id.to_bytes(8, "big").hex() + served.flags
        )
        if served.sampled is not None:
            call = _CALL.get(None)
            if call:
                call[0].sent.append(_Attempt(attempt, span_id, url, method))
        if served.tracestate is not None:
            headers["tracestate"] = served.tracestate

    # -- a sampled request's spans, from its bill ----------------------------------

    def _end(self, served: _Request, request: web.Request, status: int | None) -> None:
        """A sampled request was answered: its spans wait to be made with others'.

        Whatever goes wrong here is logged and goes no further: the answer
        is the caller's, not the trace's.
        """
        sampled = served.sampled
        assert sampled is not None
        # A supplier connection opened while it ran keeps a copy of its context
        # (``served`` with it) while it is kept alive: not its bills as well.
        served.sampled = None
        try:
            name, attributes = _server_span(request, status)
            failed = status is not None and status >= 500
            ended = _Ended(sampled, served.trace_id, name, attributes, failed, time.monotonic())
        except Exception as exc:
            log_event(
                log, logging.ERROR, "trace_failed", {"trace_id": served.trace_id}, exc_info=exc
            )
            return
        if self._closed:  # past the cleanup's last making: now or never
            self._recorded(ended)
            return
        self._ended.append(ended)
        loop = asyncio.get_running_loop()
        if len(self._ended) == RECORD_BATCH:
            if self._recording is not None:
                self._recording.cancel()
            # The loop's next turn, once this answer has been written: making
            # the spans is not the caller's time.
            self._recording = loop.call_soon(self._record_ended, context=self._quiet)
        elif self._recording is None:
            self._recording = loop.call_later(
                self.config.record_delay, self._record_ended, context=self._quiet
            )

    def _record_ended(self) -> None:
        """Make the spans of every request waiting for them."""
        if self._recording is not None:
            self._recording.cancel()  # the delay's timer, when the batch filled up first
            self._recording = None
        ended, self._ended = self._ended, []
        for request in ended:
            self._recorded(request)

    def _recorded(self, ended: _Ended) -> None:
        """``_record``, whose failure (a bug of ours or the SDK's) is logged and goes no further."""
        try:
            self._record(ended)
        except Exception as exc:
            log_event(
                log, logging.ERROR, "trace_failed", {"trace_id": ended.trace_id}, exc_info=exc
            )
        finally:
            self._ids.hand_over()  # an id handed over and not taken goes to no other span

    def _record(self, ended: _Ended) -> None:
        """Make and end every span of a request that has ended."""
        clock = _Clock()
        tracer = self._tracer
        sampled = ended.sampled
        if sampled.root_trace_id is not None:
            self._ids.hand_over(trace_id=sampled.root_trace_id)
        server = tracer.start_span(
            ended.name,
            context=sampled.parent,
            attributes=ended.attributes,
            kind=SpanKind.SERVER,
            start_time=clock(sampled.started),
        )
        if ended.failed:
            # HTTP semantic conventions: only a 5xx is a server span's error.
            server.set_status(Status(StatusCode.ERROR))
        for supplier, when in sampled.circuit_open:
            server.add_event("circuit_open", {SUPPLIER: supplier}, timestamp=clock(when))
        context = otel_trace.set_span_in_context(server, sampled.parent)
        for call in sampled.calls:
            self._record_call(call, context, clock, ended.ended)
        server.end(end_time=clock(ended.ended))

    def _record_call(
        self, call: _Call, parent: otel_context.Context, clock: _Clock, answered: float
    ) -> None:
        """The span of one supplier call, and those of its attempts, from its bill.

        ``answered``: when the request was; a call with no end noted ends there.
        """
        trace = call.trace
        ended = answered if call.ended is None else call.ended
        code, stopped = _call_outcome(call, ended)
        attributes: dict[str, Any] = {
            SUPPLIER: trace.supplier,
            OUTCOME: code,
            ATTEMPTS: len(trace.attempts),
        }
        if trace.lines:
            attributes[LINES] = len(trace.lines)  # a cart's call
        if trace.won is not None:
            attributes[WON] = trace.won  # a hedged call: whose quote came first
        if stopped is not None:
            attributes[STOPPED] = stopped
        for name, value in ((JOINED, trace.joined), (HANDED_OVER, trace.handed_over)):
            if value is not None:
                attributes[name] = value
        if trace.stale_if_error is not None:
            attributes[STALE_IF_ERROR] = trace.stale_if_error
        span = self._tracer.start_span(
            f"supplier {trace.supplier}",
            context=parent,
            attributes=attributes,
            start_time=clock(call.started),
        )
        if call.error is not None:
            span.record_exception(call.error)
        if code != OK:
            span.set_status(Status(StatusCode.ERROR))
        records = {record.attempt: record for record in trace.attempts}
        context = otel_trace.set_span_in_context(span, parent)
        for sent in call.sent:
            record = records.get(sent.attempt)
            if record is None and trace.handed_over is not None:
                # Sent by the shared call this request handed over: billed to
                # the request that took it, once it ends — not known here.
                continue
            self._ids.hand_over(span_id=sent.span_id)
            self._record_attempt(sent, record, context, clock, ended)
            if record is not None and record.backoff is not None:
                span.add_event(
                    "backoff",
                    {ATTEMPT: record.attempt, BACKOFF_MS: round(record.backoff * 1000, 3)},
                    timestamp=clock(record.ended),
                )
        if stopped in NO_RETRY_REASONS and trace.attempts:
            last = trace.attempts[-1]
            span.add_event(
                "no_retry",
                {ATTEMPT: last.attempt, STOPPED: stopped},
                timestamp=clock(last.ended),
            )
        span.end(end_time=clock(ended))

    def _record_attempt(
        self,
        sent: _Attempt,
        record: AttemptRecord | None,
        parent: otel_context.Context,
        clock: _Clock,
        call_ended: float,
    ) -> None:
        url = sent.url
        attributes: dict[str, Any] = {
            HTTP_REQUEST_METHOD: sent.method,
            # A password in the supplier's URL never leaves in a span.
            URL_FULL: str(url) if url.password is None else str(url.with_password("***")),
            SERVER_ADDRESS: url.host or "",
            ATTEMPT: sent.attempt,
        }
        if url.port is not None:
            attributes[SERVER_PORT] = url.port
        if sent.attempt > 1:
            attributes[HTTP_REQUEST_RESEND_COUNT] = sent.attempt - 1
        if record is None:  # sent but not billed: only a bug of ours leaves this
            at = clock(call_ended)  # when is unknown; within the call's span
            span = self._tracer.start_span(
                sent.method,
                context=parent,
                kind=SpanKind.CLIENT,
                attributes=attributes,
                start_time=at,
            )
            span.end(end_time=at)
            return
        attributes[OUTCOME] = record.outcome
        attributes[SLOT_WAIT_MS] = round(record.slot_wait * 1000, 3)
        if record.hedge:
            attributes[HEDGE] = True  # sent while the first was still out
        if record.status is not None:
            attributes[HTTP_RESPONSE_STATUS_CODE] = record.status
        # A hedged call's loser, cancelled because the other won, is no failure
        # (``models.CANCELLED``: the same word as a call the caller left).
        failed = record.outcome not in (OK, CANCELLED)
        if failed:
            # A refusal's status, else our code for what went wrong (invalid_data, ...).
            refused = record.status is not None and record.status != 200
            attributes[ERROR_TYPE] = str(record.status) if refused else record.outcome
        span = self._tracer.start_span(
            sent.method,
            context=parent,
            kind=SpanKind.CLIENT,
            attributes=attributes,
            start_time=clock(record.started + record.slot_wait),
        )
        if failed:
            span.set_status(Status(StatusCode.ERROR))
        span.end(end_time=clock(record.ended))


def _server_span(request: web.Request, status: int | None) -> tuple[str, dict[str, Any]]:
    """The server span's name and attributes (OpenTelemetry's HTTP semantic conventions)."""
    resource = request.match_info.route.resource
    route = resource.canonical if resource is not None else None
    attributes: dict[str, Any] = {
        HTTP_REQUEST_METHOD: request.method,
        URL_PATH: request.path,
        URL_SCHEME: request.scheme,
    }
    if route is not None:
        attributes[HTTP_ROUTE] = route
    request_id = request.get(REQUEST_ID)
    if request_id is not None:
        attributes[REQUEST_ID_ATTRIBUTE] = request_id
    caller = request.get(CALLER)
    if caller is not None:
        attributes[CALLER_ATTRIBUTE] = caller.name
    if status is None:
        attributes[CALLER_LEFT] = True  # cancelled: no answer was sent
    else:
        attributes[HTTP_RESPONSE_STATUS_CODE] = status
        if status >= 500:
            attributes[ERROR_TYPE] = str(status)
    return (f"{request.method} {route}" if route else request.method), attributes


def _call_outcome(call: _Call, ended: float) -> tuple[str, str | None]:
    """A supplier call's outcome code, and why it stopped."""
    stopped = call.trace.stopped
    if call.error is not None:
        return ERROR, stopped
    if call.outcome is None:
        # Cancelled (the deadline, or the caller leaving), or a bug: the
        # service writes the deadline on the bill only after this call is gone.
        past_deadline = ended >= call.deadline - DEADLINE_SLACK
        return (
            TIMEOUT if past_deadline else CANCELLED,
            stopped or (STOPPED_DEADLINE if past_deadline else CANCELLED),
        )
    return (OK if isinstance(call.outcome, SupplierQuote) else call.outcome.code), stopped


class _RecordingGateway:
    """A ``SupplierGateway`` that notes, for a sampled request, when each call begins and ends.

    A coalesced or cached answer (the share feature) is marked too: that
    wrapper sits inside this one and writes on the ``SupplierTrace`` what it
    did (``stopped``: ``joined``, ``cached``...), which becomes the span's.
    """

    def __init__(self, inner: SupplierGateway) -> None:
        self._inner = inner

    def quote(
        self,
        trace: SupplierTrace,
        request: QuoteRequest,
        request_id: str,
        deadline: float,
    ) -> Coroutine[Any, Any, SupplierQuote | Failure]:
        """The wrapped call; for a sampled request, with its times noted around it."""
        served = _REQUEST.get(None)
        if served is None or served.sampled is None:
            # Not sampled: the inner call itself, without a coroutine around it
            # that every one of its awaits would pass through.
            return self._inner.quote(trace, request, request_id, deadline)
        call = _Call(trace, deadline, time.monotonic())
        served.sampled.calls.append(call)
        return self._noted(call, request, request_id)

    async def _noted(
        self, call: _Call, request: QuoteRequest, request_id: str
    ) -> SupplierQuote | Failure:
        # This coroutine is the supplier call's task: the variable is that task's alone.
        current = [call]
        token = _CALL.set(current)
        try:
            call.outcome = await self._inner.quote(call.trace, request, request_id, call.deadline)
            return call.outcome
        except Exception as exc:  # a bug of ours: it propagates (500), and is on the span
            call.error = exc
            raise
        finally:
            call.ended = time.monotonic()
            current.clear()
            _CALL.reset(token)


class _RecordingBatches:
    """A ``BatchGateway`` that notes, for a sampled cart, when each batch call begins and ends.

    The call's span is a supplier call's, its outcome the call's: ``ok`` when
    any line got a quote, else the first line's code.
    """

    def __init__(self, inner: BatchGateway) -> None:
        self._inner = inner

    def chunks(self, supplier: str, lines: tuple[CartLine, ...]) -> list[tuple[CartLine, ...]]:
        return self._inner.chunks(supplier, lines)

    async def batch(
        self,
        trace: SupplierTrace,
        lines: tuple[CartLine, ...],
        scenario: str,
        request_id: str,
        deadline: float,
    ) -> dict[str, SupplierQuote | Failure]:
        served = _REQUEST.get(None)
        if served is None or served.sampled is None:
            return await self._inner.batch(trace, lines, scenario, request_id, deadline)
        call = _Call(trace, deadline, time.monotonic())
        served.sampled.calls.append(call)
        current = [call]
        token = _CALL.set(current)
        try:
            answered = await self._inner.batch(trace, lines, scenario, request_id, deadline)
            quoted = (o for o in answered.values() if isinstance(o, SupplierQuote))
            call.outcome = next(quoted, None) or answered[lines[0].sku]
            return answered
        except Exception as exc:  # a bug of ours: it propagates (500), and is on the span
            call.error = exc
            raise
        finally:
            call.ended = time.monotonic()
            current.clear()
            _CALL.reset(token)


class _TraceIdInLogs(logging.Filter):
    """Every event logged while a request's span is current carries its ``trace_id``."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = getattr(record, "fields", None)
        if fields is not None:
            served = _REQUEST.get(None)
            if served is not None:
                record.fields = {**fields, "trace_id": served.trace_id}
        return True
