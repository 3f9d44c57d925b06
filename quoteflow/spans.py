"""OpenTelemetry spans of a request, its supplier calls and their attempts.

Imported only when tracing is on (``tracing.py`` decides, ``app.py`` wires
this in): with tracing off nothing here is loaded, and no request pays for it.

One trace per inbound request, continuing the caller's when it sends a
W3C ``traceparent``::

    POST /api/quotes        server    http.*, quoteflow.request_id
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

The three kinds of span come from three seams, each wired at start-up:
``middleware`` (outermost, so it sees every answer, refusals included),
``gateway`` (wraps the supplier client, as ``service.SupplierGateway``) and
``sending`` (``supplier.AttemptListener``: called as an attempt's headers are
made). An attempt's span starts there, before the request goes out (its id
is in the header), and ends from the budget bill: its ``AttemptRecord``
already holds the slot wait, the status, the outcome and when it ended, so
the trace and ``?explain=1`` always tell the same story.

A request the sampler drops still carries its trace id to the suppliers
(``traceparent`` with the sampled flag off, a fresh span id per attempt),
but makes no span below the server's: sampling 1 % costs about what off does.
Without a caller's trace it makes no span at all: its trace id is drawn
first, and the sampler's rule for a root (which reads the trace id alone) is
applied to it before the SDK is asked for anything.
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
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
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
from opentelemetry.trace import Span, SpanContext, SpanKind, Status, StatusCode, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from yarl import URL

from quoteflow.handlers import REQUEST_ID
from quoteflow.logs import log_event
from quoteflow.models import (
    OK,
    STOPPED_DEADLINE,
    STOPPED_NO_TIME,
    STOPPED_NOT_RETRYABLE,
    STOPPED_RETRY_AFTER,
    STOPPED_RETRY_BUDGET,
    TIMEOUT,
    Failure,
    QuoteRequest,
    SupplierQuote,
    SupplierTrace,
)
from quoteflow.service import SupplierGateway
from quoteflow.tracing import DEFAULT_SERVICE_NAME, TracingConfig

log = logging.getLogger("quoteflow")

# QuoteFlow's own attributes; the rest are OpenTelemetry's HTTP semantic conventions.
REQUEST_ID_ATTRIBUTE: Final = "quoteflow.request_id"
CALLER_ATTRIBUTE: Final = "quoteflow.caller"
SUPPLIER: Final = "quoteflow.supplier"
OUTCOME: Final = "quoteflow.outcome"
"""``ok`` or the failure code (``http_503``, ``timeout``, ...): an attempt's, or the call's."""
STOPPED: Final = "quoteflow.stopped"
ATTEMPT: Final = "quoteflow.attempt"
ATTEMPTS: Final = "quoteflow.attempts"
SLOT_WAIT_MS: Final = "quoteflow.slot_wait_ms"
BACKOFF_MS: Final = "quoteflow.backoff_ms"
CALLER_LEFT: Final = "quoteflow.caller_left"

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

_NO_PARENT: Final = otel_context.Context()
_PROPAGATOR: Final = TraceContextTextMapPropagator()
"""W3C Trace Context only, whatever ``OTEL_PROPAGATORS`` says: it is what suppliers read."""
_ROOT_NOT_SAMPLED: Final = f"-{TraceFlags.RANDOM_TRACE_ID:02x}"
"""The end of a dropped root's ``traceparent``: flags as the SDK sets them for its random ids."""


@attrs.define
class _Request:
    """The trace of one inbound request, as the seams below need it."""

    span: Span | None
    """The server span, when it is recorded; None when the request is not sampled."""
    context: otel_context.Context | None
    """The context of the recorded span's children; None when the request is not sampled."""
    trace_id: str
    """32 hex digits: for the bill and the log lines."""
    traceparent: tuple[str, str]
    """``traceparent`` before and after the span id: an unsampled attempt's header, ready."""
    tracestate: str | None


@attrs.define
class _SupplierCall:
    """One traced supplier call: its span and the spans of the attempts sent so far."""

    span: Span
    context: otel_context.Context
    attempts: list[tuple[int, Span]] = attrs.Factory(list)


# The request's trace lives in context variables of ours, not in OpenTelemetry's
# current context: nothing else in QuoteFlow reads that one, and reading ours is
# a single lookup where the API's takes several calls — for every request the
# sampler drops, that was most of what tracing cost (docs/benchmark.md).
_REQUEST: contextvars.ContextVar[_Request] = contextvars.ContextVar("quoteflow_request_trace")
"""The request being served (supplier calls run in tasks that inherit it)."""
_CALL: contextvars.ContextVar[_SupplierCall] = contextvars.ContextVar("quoteflow_supplier_call")
"""The supplier call being traced in this task (each supplier call runs in a task of its own)."""


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


def _inject(headers: dict[str, str], context: SpanContext) -> None:
    """Name the span of ``context`` in ``headers`` (W3C Trace Context, version 00)."""
    headers["traceparent"] = (
        f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    )
    if context.trace_state:
        headers["tracestate"] = context.trace_state.to_header()


class _TraceIds(RandomIdGenerator):
    """The SDK's random ids, except a root request's trace id, drawn before its span.

    ``Tracing._root`` draws the id to decide the request's sampling; when it
    is sampled, it hands the id over here, and the SDK's ``start_span`` that
    follows at once (nothing can run in between) gives the span that very id.
    """

    def __init__(self) -> None:
        self._drawn: int | None = None

    def hand_over(self, trace_id: int) -> None:
        """The next trace id the SDK asks for is ``trace_id``."""
        self._drawn = trace_id

    def generate_trace_id(self) -> int:
        drawn, self._drawn = self._drawn, None
        return super().generate_trace_id() if drawn is None else drawn


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


def _wall_clock(now_ns: int, now: float, then: float) -> int:
    """``then`` (a ``time.monotonic()`` value of the bill) as epoch nanoseconds."""
    return now_ns - int((now - then) * 1e9)


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
        self._ids = _TraceIds()
        self._sampler, self._root_bound = _sampling(config)
        self._log_filter = _TraceIdInLogs()

    # -- the app's lifetime ----------------------------------------------------

    async def running(self, app: web.Application) -> AsyncIterator[None]:
        """``cleanup_ctx``: spans from start-up on, the last ones flushed at shutdown.

        Log lines written while a request's span is current carry its trace id.
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

    # -- the server span -------------------------------------------------------

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A server span around every request, whatever answers it (refusals too)."""
        headers = request.headers
        if "traceparent" in headers:
            served = self._started(_PROPAGATOR.extract(headers))
        else:
            served = self._root()
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
            if served.span is not None:
                self._describe_server_span(served.span, request, status)
                served.span.end()
            _REQUEST.reset(token)

    def _root(self) -> _Request:
        """The trace of a request that brings none: sampled by its trace id, before any span."""
        bound = self._root_bound
        if bound is None:  # every root is sampled: nothing to decide first
            return self._started(_NO_PARENT)
        trace_id = self._ids.generate_trace_id()
        if trace_id & TraceIdRatioBased.TRACE_ID_LIMIT < bound:
            self._ids.hand_over(trace_id)
            return self._started(_NO_PARENT)
        # Dropped: what the SDK's non-recording span would carry, without it —
        # the flags say the id is random (W3C level 2) and not sampled, and a
        # root has no tracestate. Its own span id would reach no one.
        hex_id = f"{trace_id:032x}"
        return _Request(None, None, hex_id, (f"00-{hex_id}-", _ROOT_NOT_SAMPLED), None)

    def _started(self, parent: otel_context.Context) -> _Request:
        """The trace of a request whose server span the SDK makes (and samples) under ``parent``.

        ``parent`` holds the caller's span, or nothing: an empty context, so
        the SDK looks no further (OpenTelemetry's current context is not ours).
        """
        # Named once it is known to be recorded (no built-in sampler reads the name).
        span = self._tracer.start_span("HTTP", context=parent, kind=SpanKind.SERVER)
        context = span.get_span_context()
        trace_id = f"{context.trace_id:032x}"
        state = context.trace_state
        recorded = span.is_recording()
        return _Request(
            span if recorded else None,
            otel_trace.set_span_in_context(span, parent) if recorded else None,
            trace_id,
            (f"00-{trace_id}-", f"-{context.trace_flags:02x}"),
            state.to_header() if state else None,
        )

    @staticmethod
    def _describe_server_span(span: Span, request: web.Request, status: int | None) -> None:
        resource = request.match_info.route.resource
        route = resource.canonical if resource is not None else None
        span.update_name(f"{request.method} {route}" if route else request.method)
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
        # The caller's name (CALLER_ATTRIBUTE) goes here once requests carry
        # one: the named-callers feature sets it on the request.
        if status is None:
            attributes[CALLER_LEFT] = True  # cancelled: no answer was sent
        else:
            attributes[HTTP_RESPONSE_STATUS_CODE] = status
            if status >= 500:
                # HTTP semantic conventions: only a 5xx is a server span's error.
                attributes[ERROR_TYPE] = str(status)
                span.set_status(Status(StatusCode.ERROR))
        span.set_attributes(attributes)

    def trace_id(self) -> str | None:
        """The trace id of the request being served (``handlers.CurrentTrace``)."""
        served = _REQUEST.get(None)
        return None if served is None else served.trace_id

    def circuit_open(self, supplier: str) -> None:
        """``supplier`` was not asked, its circuit being open: an event on the request's span."""
        served = _REQUEST.get(None)
        if served is not None and served.span is not None:
            served.span.add_event("circuit_open", {SUPPLIER: supplier})

    # -- supplier calls and their attempts ---------------------------------------

    def gateway(self, inner: SupplierGateway) -> SupplierGateway:
        """``inner`` with a span around each supplier call (once ``running`` has begun)."""
        assert self.provider is not None, "wrap the gateway after tracing's cleanup_ctx began"
        return _TracedGateway(inner, self._tracer)

    def sending(self, attempt: int, url: URL, headers: dict[str, str]) -> None:
        """An attempt is about to go out: start its span and name it in ``traceparent``."""
        served = _REQUEST.get(None)
        if served is None:
            return
        call = None if served.context is None else _CALL.get(None)
        if call is None:
            # Not sampled: pass the trace on, with a span id of the attempt's
            # own, and record nothing.
            before, after = served.traceparent
            # As the SDK's id generator makes them (random, never all zeros).
            span_id = random.getrandbits(64) or 1
            headers["traceparent"] = f"{before}{span_id:016x}{after}"
            if served.tracestate is not None:
                headers["tracestate"] = served.tracestate
            return
        attributes: dict[str, Any] = {
            HTTP_REQUEST_METHOD: "GET",
            # A password in the supplier's URL never leaves in a span.
            URL_FULL: str(url) if url.password is None else str(url.with_password("***")),
            SERVER_ADDRESS: url.host or "",
            ATTEMPT: attempt,
        }
        if url.port is not None:
            attributes[SERVER_PORT] = url.port
        if attempt > 1:
            attributes[HTTP_REQUEST_RESEND_COUNT] = attempt - 1
        span = self._tracer.start_span(
            "GET", context=call.context, kind=SpanKind.CLIENT, attributes=attributes
        )
        call.attempts.append((attempt, span))
        _inject(headers, span.get_span_context())


class _TracedGateway:
    """A ``SupplierGateway`` that puts a span around each call of the one it wraps.

    A coalesced or cached answer (the share feature) is marked here too:
    that wrapper sits inside this one, and records on the ``SupplierTrace``
    what it did; ``_end`` is where that becomes an attribute.
    """

    def __init__(self, inner: SupplierGateway, tracer: otel_trace.Tracer) -> None:
        self._inner = inner
        self._tracer = tracer

    def quote(
        self,
        trace: SupplierTrace,
        request: QuoteRequest,
        request_id: str,
        deadline: float,
    ) -> Coroutine[Any, Any, SupplierQuote | Failure]:
        """The wrapped call, in a span of its own when the request is sampled."""
        served = _REQUEST.get(None)
        if served is None or served.context is None:
            # Not sampled: the inner call itself, without a coroutine around it
            # that every one of its awaits would pass through.
            return self._inner.quote(trace, request, request_id, deadline)
        return self._traced(served.context, trace, request, request_id, deadline)

    async def _traced(
        self,
        parent: otel_context.Context,
        trace: SupplierTrace,
        request: QuoteRequest,
        request_id: str,
        deadline: float,
    ) -> SupplierQuote | Failure:
        span = self._tracer.start_span(
            f"supplier {trace.supplier}", context=parent, attributes={SUPPLIER: trace.supplier}
        )
        call = _SupplierCall(span, otel_trace.set_span_in_context(span))
        token = _CALL.set(call)
        outcome: SupplierQuote | Failure | None = None
        try:
            outcome = await self._inner.quote(trace, request, request_id, deadline)
            return outcome
        except Exception as exc:  # a bug of ours: it propagates (500), and is on the span
            span.record_exception(exc)
            raise
        finally:
            _CALL.reset(token)
            _end(call, trace, outcome, deadline)


def _end(
    call: _SupplierCall,
    trace: SupplierTrace,
    outcome: SupplierQuote | Failure | None,
    deadline: float,
) -> None:
    """End the call's attempt spans and its own span, from the bill in ``trace``."""
    now_ns, now = time.time_ns(), time.monotonic()
    span = call.span
    records = {record.attempt: record for record in trace.attempts}
    for attempt, attempt_span in call.attempts:
        record = records.get(attempt)
        if record is None:  # sent but not billed: only a bug of ours leaves this
            attempt_span.end()
            continue
        attributes: dict[str, Any] = {
            OUTCOME: record.outcome,
            SLOT_WAIT_MS: round(record.slot_wait * 1000, 3),
        }
        if record.status is not None:
            attributes[HTTP_RESPONSE_STATUS_CODE] = record.status
        if record.outcome != OK:
            # A refusal's status, else our code for what went wrong (invalid_data, ...).
            refused = record.status is not None and record.status != 200
            attributes[ERROR_TYPE] = str(record.status) if refused else record.outcome
            attempt_span.set_status(Status(StatusCode.ERROR))
        attempt_span.set_attributes(attributes)
        ended = _wall_clock(now_ns, now, record.ended)
        attempt_span.end(end_time=ended)
        if record.backoff is not None:
            span.add_event(
                "backoff",
                {ATTEMPT: record.attempt, BACKOFF_MS: round(record.backoff * 1000, 3)},
                timestamp=ended,
            )
    stopped = trace.stopped
    if outcome is None:
        # Cancelled (the deadline, or the caller leaving), or a bug: the
        # service writes the deadline on the bill only after this call is gone.
        past_deadline = now >= deadline - DEADLINE_SLACK
        stopped = stopped or (STOPPED_DEADLINE if past_deadline else CANCELLED)
        code = TIMEOUT if past_deadline else CANCELLED
    else:
        code = OK if isinstance(outcome, SupplierQuote) else outcome.code
    if stopped in NO_RETRY_REASONS and trace.attempts:
        last = trace.attempts[-1]
        span.add_event(
            "no_retry",
            {ATTEMPT: last.attempt, STOPPED: stopped},
            timestamp=_wall_clock(now_ns, now, last.ended),
        )
    attributes = {OUTCOME: code, ATTEMPTS: len(trace.attempts)}
    if stopped is not None:
        attributes[STOPPED] = stopped
    span.set_attributes(attributes)
    if code != OK:
        span.set_status(Status(StatusCode.ERROR))
    span.end()


class _TraceIdInLogs(logging.Filter):
    """Every event logged while a request's span is current carries its ``trace_id``."""

    def filter(self, record: logging.LogRecord) -> bool:
        fields = getattr(record, "fields", None)
        if fields is not None:
            served = _REQUEST.get(None)
            if served is not None:
                record.fields = {**fields, "trace_id": served.trace_id}
        return True
