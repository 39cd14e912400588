"""Tracing for every meshserve service: the OpenTelemetry SDK set up from ServerConfig, W3C
``traceparent`` carried in gRPC metadata, one SERVER span per call, the trace id in logs and in
the response metadata.

Spans are exported in batches by a background thread (BatchSpanProcessor: a full queue drops
spans, it never blocks a request) that encodes them and hands each batch to the service's event
loop, which sends it over ``grpc.aio`` (AioOTLPSpanExporter). With no OTLP endpoint nothing is
exported and no trace is started sampled (spans are not recorded unless a caller's trace is
sampled), but trace ids and propagation work exactly the same, so logs and the ``x-trace-id``
header still tie a request together across services.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any

import grpc
from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased, TraceIdRatioBased
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from meshserve.services.config import ServerConfig
from meshserve.services.otlp import encode_spans

log = logging.getLogger(__name__)

TRACE_ID_METADATA = "x-trace-id"
# Calls that are not part of a request: health, reflection, the trace receiver itself, the
# router's long-lived load streams, worker probes, and the gateways' long-lived worker sessions
# and pick streams (each request on one has a span of its own).
UNTRACED_PREFIXES = ("/grpc.", "/opentelemetry.", "/meshserve.traces.", "/meshserve.v1.Worker/WatchLoad",
                     "/meshserve.v1.Worker/Info", "/meshserve.v1.Worker/Session", "/meshserve.v1.Router/Picks")
EXPORT_DELAY_MS = 1000   # how long a finished span may wait before its batch is sent
EXPORT_QUEUE_SIZE = 8192  # spans buffered for export; beyond, new spans are dropped

_PROPAGATOR = TraceContextTextMapPropagator()
tracer = trace.get_tracer("meshserve")
_exported = True  # whether this process's spans go anywhere (setup_tracing says; a provider it did not install may)


def exporting() -> bool:
    """Whether this process exports its spans. A span that nothing continues (a router's pick)
    is worth making only then: a recorded span costs a pick ~70 us, and a router without an
    OTLP endpoint would make thousands a second for nobody."""
    return _exported


def setup_tracing(service_name: str, cfg: ServerConfig) -> TracerProvider:
    """Installs the process's tracer provider (OpenTelemetry's API is process-global).

    A process runs one service; when tests run several in one process, the first one's
    settings apply to all of them.
    """
    global _exported
    current = trace.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    _exported = bool(cfg.otlp_endpoint)
    # A process that exports nothing starts no sampled trace: its spans would be recorded (tens of
    # microseconds each, several per request) for nobody. Trace ids are made and propagated all the
    # same, and a caller's decision is followed as always (a sampled parent still records here).
    root = TraceIdRatioBased(cfg.trace_sampling_ratio) if _exported else ALWAYS_OFF
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}), sampler=ParentBased(root))
    if cfg.otlp_endpoint:
        exporter = AioOTLPSpanExporter(cfg.otlp_endpoint, asyncio.get_running_loop())
        provider.add_span_processor(
            BatchSpanProcessor(exporter, max_queue_size=EXPORT_QUEUE_SIZE, schedule_delay_millis=EXPORT_DELAY_MS)
        )
    trace.set_tracer_provider(provider)
    log.info("tracing: %s", f"{cfg.otlp_endpoint} (sampling {cfg.trace_sampling_ratio:g})" if _exported
             else "not exported (trace ids only; a sampled caller's trace is still recorded)")
    return provider


class AioOTLPSpanExporter(SpanExporter):
    """OTLP/gRPC span export through a ``grpc.aio`` channel on the service's own event loop.

    The SDK's ``OTLPSpanExporter`` keeps a synchronous gRPC channel, and a synchronous channel in
    a process that serves with ``grpc.aio`` makes every RPC of that process dearer: measured on a
    sim worker at 300 streams, +4% CPU per request with the channel merely connected and idle.
    Here the batch thread encodes (services.otlp: OpenTelemetry's OTLP message, built in a third
    of the library encoder's time) and the loop sends it, one unary Export per batch. Must be
    created on the running loop; ``export`` is called from the batch thread, never from the loop
    (``flush`` runs in a thread for that reason)."""

    def __init__(self, endpoint: str, loop: asyncio.AbstractEventLoop, timeout_s: float = 5.0) -> None:
        self._endpoint = endpoint
        self._loop = loop
        self._timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None

    async def _send(self, request: Any) -> None:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(self._endpoint)
        stub = trace_service_pb2_grpc.TraceServiceStub(self._channel)
        await stub.Export(request, timeout=self._timeout_s)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            sent = asyncio.run_coroutine_threadsafe(self._send(encode_spans(spans)), self._loop)
            sent.result(self._timeout_s + 1)
        except Exception as e:  # the collector is down or slow, or the loop has ended: drop
            log.debug("could not export %d spans to %s: %s", len(spans), self._endpoint, e)
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        if self._channel is not None and self._loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._channel.close(), self._loop).result(self._timeout_s)


def flush(timeout_s: float = 2.0) -> None:
    """Exports what is still buffered (on shutdown)."""
    provider = trace.get_tracer_provider()
    if isinstance(provider, TracerProvider):
        provider.force_flush(int(timeout_s * 1000))


# -- propagation ------------------------------------------------------------------------------


def outgoing_metadata(ctx: otel_context.Context | None = None) -> tuple[tuple[str, str], ...]:
    """The trace context (default: the current one) as gRPC metadata (``traceparent``), for
    calls to other services."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, ctx)
    return tuple(carrier.items())


def incoming_context(metadata: Any) -> otel_context.Context:
    """The caller's trace context from gRPC invocation metadata (an empty context if none)."""
    carrier = {k: v for k, v in metadata or () if isinstance(v, str)}
    return _PROPAGATOR.extract(carrier)


def current_trace_id() -> str:
    """The current trace id as 32 hex digits, or '-' outside any trace."""
    ctx = trace.get_current_span().get_span_context()
    return trace.format_trace_id(ctx.trace_id) if ctx.is_valid else "-"


def trace_metadata() -> tuple[tuple[str, str], ...]:
    """``x-trace-id`` for response metadata (initial or trailing), empty outside any trace."""
    trace_id = current_trace_id()
    return ((TRACE_ID_METADATA, trace_id),) if trace_id != "-" else ()


class TraceIdLogFilter(logging.Filter):
    """Adds ``trace_id`` to every log record (the current span's, or '-')."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.trace_id = current_trace_id()
        return True


# -- the server side --------------------------------------------------------------------------


def _set_status(span: trace.Span, context: grpc.aio.ServicerContext) -> None:
    code = context.code()
    if code is None or code == grpc.StatusCode.OK:
        return
    span.set_attribute("rpc.grpc.status_code", code.value[0])
    span.set_status(Status(StatusCode.ERROR, f"{code.name}: {context.details() or ''}"))


def mark_failed(span: trace.Span, error: BaseException) -> None:
    """Marks a span for a call that ended by an exception other than ``context.abort``."""
    if isinstance(error, grpc.aio.AbortError):
        return  # the status code says it all (set by _set_status)
    if isinstance(error, (asyncio.CancelledError, GeneratorExit)):
        span.set_attribute("rpc.grpc.status_code", grpc.StatusCode.CANCELLED.value[0])
        span.set_status(Status(StatusCode.ERROR, "CANCELLED"))
        return
    span.record_exception(error)
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))


def traced(handler: grpc.RpcMethodHandler, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
    """``handler`` with a SERVER span around each call, continuing the caller's trace (or starting
    one), and the trace id returned: ``x-trace-id`` in the initial metadata with the first
    response, and in the trailing metadata of calls that fail before any. Applied to every call by
    services.server's interceptor, which also runs the streams."""
    method = details.method
    if method.startswith(UNTRACED_PREFIXES):
        return handler
    parent = incoming_context(details.invocation_metadata)
    name = method.lstrip("/").removeprefix("meshserve.v1.")
    attributes = {"rpc.system": "grpc", "rpc.method": method}
    if handler.unary_unary is not None:
        return handler._replace(unary_unary=_traced_unary(handler.unary_unary, name, parent, attributes))
    if handler.unary_stream is not None:
        return handler._replace(unary_stream=_traced_stream(handler.unary_stream, name, parent, attributes))
    return handler


def server_span(name: str, parent: otel_context.Context, attributes: dict[str, Any]) -> Any:
    """The SERVER span of one call (or of one request on a session stream), made current;
    errors are marked by the caller, which knows the status the call ends with."""
    return tracer.start_as_current_span(name, parent, SpanKind.SERVER, attributes,
                                        record_exception=False, set_status_on_exception=False)


def _traced_unary(inner: Any, name: str, parent: otel_context.Context, attributes: dict[str, str]) -> Any:
    async def behavior(request: Any, context: grpc.aio.ServicerContext) -> Any:
        with server_span(name, parent, attributes) as span:
            context.set_trailing_metadata(trace_metadata())
            try:
                response = await inner(request, context)
            except BaseException as e:
                mark_failed(span, e)
                raise
            finally:
                _set_status(span, context)
            await context.send_initial_metadata(trace_metadata())
            return response

    return behavior


def _traced_stream(inner: Any, name: str, parent: otel_context.Context, attributes: dict[str, str]) -> Any:
    async def behavior(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        with server_span(name, parent, attributes) as span:
            context.set_trailing_metadata(trace_metadata())
            first = True
            try:
                async with aclosing(inner(request, context)) as stream:
                    async for response in stream:
                        if first:
                            await context.send_initial_metadata(trace_metadata())
                            first = False
                        yield response
            except BaseException as e:
                mark_failed(span, e)
                raise
            finally:
                _set_status(span, context)

    return behavior
