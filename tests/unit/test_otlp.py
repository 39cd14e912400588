"""services.otlp encodes spans exactly as OpenTelemetry's own OTLP encoder does."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans as library_encode
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from meshserve.services.otlp import encode_spans


class Kept(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def provider(service: str, kept: Kept) -> TracerProvider:
    p = TracerProvider(resource=Resource.create({"service.name": service, "host.cores": 2}))
    p.add_span_processor(SimpleSpanProcessor(kept))
    return p


def assert_same(spans: list[ReadableSpan]) -> None:
    ours, theirs = encode_spans(spans), library_encode(spans)
    assert ours == theirs
    assert ours.SerializeToString(deterministic=True) == theirs.SerializeToString(deterministic=True)


def test_a_request_s_spans_encode_as_the_library_encodes_them() -> None:
    kept = Kept()
    gateway, router = provider("gateway", kept), provider("router", kept)
    tracer = gateway.get_tracer("meshserve")
    other = gateway.get_tracer("meshserve.cache", "1.2", schema_url="https://opentelemetry.io/schemas/1.21.0")
    # A caller's context, as the gateway takes it from Envoy's traceparent (remote parent, trace state).
    parent = TraceContextTextMapPropagator().extract(
        {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "envoy=1,x=y"})
    with tracer.start_as_current_span("OpenAI/StreamChatCompletions", context=parent, kind=SpanKind.SERVER,
                                      attributes={"rpc.system": "grpc", "meshserve.tokens": 32}) as server:
        with tracer.start_as_current_span("router pick") as pick:
            pick.set_attributes({"meshserve.worker": "worker-0", "meshserve.router.predicted_cached_tokens": 0,
                                 "meshserve.scores": (0.5, 0.25), "meshserve.names": ("a", "b"),
                                 "meshserve.flags": (True, False), "meshserve.ids": (1, 2, 3)})
        with other.start_as_current_span("cache read", links=[Link(pick.get_span_context(), {"why": "same"})]) as read:
            read.set_status(Status(StatusCode.ERROR, "Redis: TimeoutError"))
        stream = tracer.start_span("worker stream", attributes={"meshserve.attempt": 1, "meshserve.e2e_s": 0.25})
        stream.add_event("first_token")
        stream.add_event("retry", {"meshserve.attempt": 2, "meshserve.cached": False})
        stream.set_status(Status(StatusCode.OK))
        stream.end()
        server.set_attribute("meshserve.cached", False)
    with router.get_tracer("meshserve").start_as_current_span("Router/Pick", kind=SpanKind.CLIENT):
        pass

    assert len(kept.spans) == 5
    assert_same(kept.spans)
    assert [len(r.scope_spans) for r in encode_spans(kept.spans).resource_spans] == [2, 1]  # gateway (2 scopes), router


def test_spans_past_the_limits_carry_what_was_dropped() -> None:
    kept = Kept()
    p = TracerProvider()
    p.add_span_processor(SimpleSpanProcessor(kept))
    with p.get_tracer("t").start_as_current_span("crowded") as span:
        for i in range(200):
            span.set_attribute(f"a{i}", i)
            span.add_event(f"e{i}")
    assert kept.spans[0].dropped_attributes and kept.spans[0].dropped_events
    assert_same(kept.spans)


attribute = st.one_of(
    st.text(max_size=20), st.booleans(), st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False), st.lists(st.text(max_size=5), max_size=3).map(tuple),
    st.lists(st.integers(-100, 100), max_size=3).map(tuple),
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=10), attribute, max_size=8))
def test_any_attributes_encode_as_the_library_encodes_them(attributes: dict[str, Any]) -> None:
    kept = Kept()
    p = provider("any", kept)
    with p.get_tracer("t").start_as_current_span("s", attributes=attributes) as span:
        span.add_event("e", attributes)
    assert_same(kept.spans)
