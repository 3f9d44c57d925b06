"""A real OTLP/HTTP trace receiver for tests: what QuoteFlow exported, decoded span by span.

An aiohttp app taking ``POST /v1/traces`` (``application/x-protobuf``), decoded
with ``opentelemetry-proto``'s own ``ExportTraceServiceRequest``, the way a
collector would. ``hang`` makes it read each export and never answer: the
collector that is up but stuck.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import attrs
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status

SERVER, INTERNAL, CLIENT = (
    ProtoSpan.SPAN_KIND_SERVER,
    ProtoSpan.SPAN_KIND_INTERNAL,
    ProtoSpan.SPAN_KIND_CLIENT,
)
ERROR = Status.STATUS_CODE_ERROR


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(item) for item in value.array_value.values]
    return getattr(value, kind) if kind else None


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs if isinstance(pair, KeyValue)}


@attrs.frozen
class Event:
    """One span event: its name, attributes and epoch nanoseconds."""

    name: str
    attributes: dict[str, Any]
    time_ns: int


@attrs.frozen
class ReceivedSpan:
    """One exported span, ids as lower-case hex (as ``traceparent`` writes them)."""

    trace_id: str
    span_id: str
    parent_id: str
    name: str
    kind: int
    attributes: dict[str, Any]
    events: tuple[Event, ...]
    status: int
    start_ns: int
    end_ns: int
    service: str

    def event(self, name: str) -> Event:
        """The span's only event called ``name``."""
        (found,) = [event for event in self.events if event.name == name]
        return found


class Receiver:
    """Collects every span exported to it; ``hang`` stops it answering."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.exports = 0
        self.hang = False
        self.app = web.Application()
        self.app.router.add_post("/v1/traces", self._export)
        self.url = ""
        """The traces endpoint, once the server is started."""

    async def _export(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.exports += 1
        if self.hang:
            await asyncio.sleep(3600)
        export = ExportTraceServiceRequest.FromString(body)
        for resource_spans in export.resource_spans:
            service = _attributes(resource_spans.resource.attributes).get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        ReceivedSpan(
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_id=span.parent_span_id.hex(),
                            name=span.name,
                            kind=span.kind,
                            attributes=_attributes(span.attributes),
                            events=tuple(
                                Event(e.name, _attributes(e.attributes), e.time_unix_nano)
                                for e in span.events
                            ),
                            status=span.status.code,
                            start_ns=span.start_time_unix_nano,
                            end_ns=span.end_time_unix_nano,
                            service=service,
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )

    async def wait_for(
        self, enough: Callable[[list[ReceivedSpan]], bool], within_s: float = 5.0
    ) -> list[ReceivedSpan]:
        """The spans so far, once ``enough`` says they are (flushes are batched)."""
        deadline = time.monotonic() + within_s
        while not enough(self.spans):
            if time.monotonic() > deadline:
                names = [span.name for span in self.spans]
                raise AssertionError(f"spans did not arrive in {within_s} s; got {names}")
            await asyncio.sleep(0.02)
        return list(self.spans)

    async def trace_of(self, request_id: str, spans: int, within_s: float = 5.0) -> Trace:
        """The trace whose server span has ``quoteflow.request_id``, once it has ``spans`` spans."""

        def trace(found: list[ReceivedSpan]) -> list[ReceivedSpan]:
            roots = [s for s in found if s.attributes.get("quoteflow.request_id") == request_id]
            if not roots:
                return []
            return [s for s in found if s.trace_id == roots[0].trace_id]

        await self.wait_for(lambda found: len(trace(found)) >= spans, within_s)
        return Trace(trace(self.spans))


@attrs.frozen
class Trace:
    """The spans of one request, looked up by structure."""

    spans: list[ReceivedSpan]

    @property
    def server(self) -> ReceivedSpan:
        """The request's server span."""
        (found,) = [span for span in self.spans if span.kind == SERVER]
        return found

    def supplier(self, name: str) -> ReceivedSpan:
        """The span of the call to supplier ``name``."""
        (found,) = [s for s in self.spans if s.attributes.get("quoteflow.supplier") == name]
        return found

    def children(self, parent: ReceivedSpan) -> list[ReceivedSpan]:
        """``parent``'s child spans, in the order they started."""
        found = [span for span in self.spans if span.parent_id == parent.span_id]
        return sorted(found, key=lambda span: span.start_ns)
