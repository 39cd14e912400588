"""The tracing interceptor every service runs (services.server.start), with no exporter: the
caller's trace is continued, the trace id comes back in the response metadata (also on errors),
and outgoing calls carry it on."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest
from opentelemetry import trace

from meshserve.services import telemetry
from meshserve.services.config import ServerConfig
from meshserve.services.server import Running, insecure_channel, start

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE_ID}-b7ad6b7169203331-01"


async def _unary(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    if request == b"abort":
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "'x' is bad")
    return "".join(v for _, v in telemetry.outgoing_metadata()).encode()  # what a call from here sends


async def _recording(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
    return b"recorded" if trace.get_current_span().is_recording() else b"not recorded"


async def _stream(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    for _ in range(2):
        yield telemetry.current_trace_id().encode()


@pytest.fixture
async def server() -> AsyncIterator[Running]:
    def register(server: grpc.aio.Server) -> list[str]:
        server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("meshserve.v1.Echo", {
            "Unary": grpc.unary_unary_rpc_method_handler(_unary),
            "Recording": grpc.unary_unary_rpc_method_handler(_recording),
            "Stream": grpc.unary_stream_rpc_method_handler(_stream),
        })])
        return []

    running = await start("echo", ServerConfig(port=0, metrics_port=-1, grace_seconds=0), register)
    yield running
    await running.shutdown()


async def test_caller_trace_is_continued_and_returned(server: Running) -> None:
    async with insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.unary_unary("/meshserve.v1.Echo/Unary")(b"", metadata=(("traceparent", TRACEPARENT),))
        sent_on = (await call).decode()
        assert dict(await call.initial_metadata())["x-trace-id"] == TRACE_ID
        # A call made while serving carries the same trace, under this service's own span.
        version, trace_id, parent, flags = sent_on.split("-")
        assert (version, trace_id, flags) == ("00", TRACE_ID, "01") and parent != "b7ad6b7169203331"

        stream = channel.unary_stream("/meshserve.v1.Echo/Stream")(b"", metadata=(("traceparent", TRACEPARENT),))
        assert [m.decode() async for m in stream] == [TRACE_ID, TRACE_ID]
        assert dict(await stream.initial_metadata())["x-trace-id"] == TRACE_ID


async def test_a_call_without_traceparent_starts_a_trace(server: Running) -> None:
    async with insecure_channel(f"127.0.0.1:{server.port}") as channel:
        stream = channel.unary_stream("/meshserve.v1.Echo/Stream")(b"")
        ids = {m.decode() async for m in stream}
        assert len(ids) == 1 and len(ids.pop()) == 32


async def test_with_no_exporter_spans_are_recorded_only_for_a_sampled_caller(server: Running) -> None:
    """No OTLP endpoint: a call that starts its trace here records nothing (the span would go to
    nobody) but still gets a trace id; a caller's sampled trace is followed, an unsampled one too."""
    unsampled = TRACEPARENT[:-2] + "00"
    async with insecure_channel(f"127.0.0.1:{server.port}") as channel:
        recording = channel.unary_unary("/meshserve.v1.Echo/Recording")
        alone = recording(b"")
        assert await alone == b"not recorded"
        assert len(dict(await alone.initial_metadata())["x-trace-id"]) == 32
        assert await recording(b"", metadata=(("traceparent", TRACEPARENT),)) == b"recorded"
        assert await recording(b"", metadata=(("traceparent", unsampled),)) == b"not recorded"


async def test_errors_carry_the_trace_id_in_trailers(server: Running) -> None:
    async with insecure_channel(f"127.0.0.1:{server.port}") as channel:
        call = channel.unary_unary("/meshserve.v1.Echo/Unary")(b"abort", metadata=(("traceparent", TRACEPARENT),))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(err.value.trailing_metadata())["x-trace-id"] == TRACE_ID


async def test_the_exporter_sends_batches_from_its_thread_over_the_loop_and_drops_when_down() -> None:
    """AioOTLPSpanExporter: called from the batch thread, the service's loop sends the batch to a
    real receiver; with the receiver gone the export fails within its timeout and drops the batch."""
    import asyncio

    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExportResult

    from meshserve.services.config import TracesConfig
    from tests.conftest import free_port
    from meshserve.trace_service import server as traces

    receiver = await traces.start_traces(TracesConfig(port=free_port(), metrics_port=-1, grace_seconds=0))
    address = f"127.0.0.1:{receiver.port}"
    span = TracerProvider().get_tracer("t").start_span("exported")
    span.end()
    exporter = telemetry.AioOTLPSpanExporter(address, asyncio.get_running_loop(), timeout_s=1.0)
    assert await asyncio.to_thread(exporter.export, [span]) == SpanExportResult.SUCCESS
    got = await traces.fetch_trace(address, f"{span.get_span_context().trace_id:032x}")
    assert [s.name for s in got] == ["exported"]

    await receiver.shutdown()
    assert await asyncio.to_thread(exporter.export, [span]) == SpanExportResult.FAILURE
    await asyncio.to_thread(exporter.shutdown)
