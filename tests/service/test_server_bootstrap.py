"""The shared serve() bootstrap: health, reflection, metrics, and draining on shutdown."""

from __future__ import annotations

import asyncio
import logging
import socket
import urllib.request
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from meshserve.services import server
from meshserve.services.config import ServerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import CannotListen, Lifecycle, insecure_channel, stall_options, start


class SlowLoad(pb_grpc.WorkerServicer):
    """Streams three load reports, waiting for a release between them."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()

    async def WatchLoad(self, request: pb.WatchLoadRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.LoadReport]:
        self.started.set()
        for i in range(3):
            yield pb.LoadReport(sequence=i)
            await self.release.wait()


def _register(servicer: SlowLoad):  # noqa: ANN202
    def register(server: grpc.aio.Server) -> list[str]:
        pb_grpc.add_WorkerServicer_to_server(servicer, server)
        return ["meshserve.v1.Worker"]

    return register


async def test_health_reflection_metrics_and_drain(tmp_path) -> None:  # noqa: ANN001
    servicer = SlowLoad()
    closed: list[str] = []

    async def on_close() -> None:
        closed.append("closed")

    ready = tmp_path / "ready"
    running = await start(
        "test", ServerConfig(port=0, metrics_port=0, grace_seconds=5, ready_file=str(ready)),
        _register(servicer), Lifecycle(on_close=[on_close]),
    )
    assert ready.read_text().split() == [f"127.0.0.1:{running.port}", str(running.metrics_port)]
    async with insecure_channel(f"127.0.0.1:{running.port}") as channel:
        health = health_pb2_grpc.HealthStub(channel)
        reply = await health.Check(health_pb2.HealthCheckRequest(service="meshserve.v1.Worker"))
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

        refl = reflection_pb2_grpc.ServerReflectionStub(channel)
        call = refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
        names = {s.name async for r in call for s in r.list_services_response.service}
        assert {"meshserve.v1.Worker", "grpc.health.v1.Health"} <= names

        body = await asyncio.to_thread(lambda: urllib.request.urlopen(f"http://127.0.0.1:{running.metrics_port}/metrics").read())
        assert b"python_info" in body

        # In-flight streams survive the start of a drain: a health watcher hears NOT_SERVING and
        # an open stream finishes within the grace period.
        watch = health.Watch(health_pb2.HealthCheckRequest(service="meshserve.v1.Worker"))
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.SERVING
        stream = pb_grpc.WorkerStub(channel).WatchLoad(pb.WatchLoadRequest())
        first = await stream.read()
        assert first.sequence == 0
        shutdown = asyncio.create_task(running.shutdown())
        assert (await watch.read()).status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()  # a watcher left open would hold the drain for the whole grace period
        servicer.release.set()
        assert [(await stream.read()).sequence for _ in range(2)] == [1, 2]
        assert await stream.read() is grpc.aio.EOF
        await shutdown
    assert closed == ["closed"]


async def test_a_busy_port_is_refused_not_shared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "BIND_WAIT_S", 0.3)  # how long a start waits for a port taken for a moment
    first = await start("first", ServerConfig(port=0, metrics_port=-1, grace_seconds=0), _register(SlowLoad()))
    try:
        # One line for the operator (a SystemExit: no traceback), naming the service and the port.
        with pytest.raises(CannotListen, match=f"^second: cannot serve gRPC on 127.0.0.1:{first.port}: the port is in use"):
            await start("second", ServerConfig(port=first.port, metrics_port=-1), _register(SlowLoad()))
    finally:
        await first.shutdown()


async def test_a_port_taken_for_a_moment_is_waited_for() -> None:
    """An earlier process still closing, or a client connection's own end on the port (the default
    ports lie in Linux's ephemeral range): the start waits for it to be let go, then serves on it."""
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    loop, waiting = asyncio.get_running_loop(), asyncio.Event()

    class Waiting(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if f"port 127.0.0.1:{port} is taken; trying again" in record.getMessage():
                loop.call_soon_threadsafe(waiting.set)

    seen, logger = Waiting(), logging.getLogger("meshserve.services.server")
    level = logger.level
    logger.setLevel(logging.WARNING)  # whatever an earlier test set: the line is what this test waits for
    logger.addHandler(seen)
    try:
        starting = asyncio.create_task(start("late", ServerConfig(port=port, metrics_port=-1, grace_seconds=0),
                                             _register(SlowLoad())))
        await asyncio.wait_for(waiting.wait(), 10)  # it found the port taken, and waits
        assert not starting.done()
        holder.close()
        running = await asyncio.wait_for(starting, 10)
    finally:
        holder.close()
        logger.removeHandler(seen)
        logger.setLevel(level)
    try:
        assert running.port == port
        async with insecure_channel(f"127.0.0.1:{port}") as channel:
            check = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert check.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await running.shutdown()


async def test_a_started_service_freezes_its_start_up_objects_and_collects_young_ones_less_often() -> None:
    import gc

    from meshserve.services.server import GC_GEN0_THRESHOLD

    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    survivor = [object() for _ in range(3)]  # alive at start-up: frozen, out of the collector's reach
    running = await start("gc", ServerConfig(port=0, metrics_port=-1, grace_seconds=0), _register(SlowLoad()))
    try:
        assert gc.get_threshold() == (GC_GEN0_THRESHOLD, 10, 10)
        assert gc.get_freeze_count() > len(survivor)
        assert all(o is not survivor for o in gc.get_objects())  # frozen: not in any generation
    finally:
        await running.shutdown()
    assert gc.get_freeze_count() == 0  # given back to the collector when the service stops


async def test_meshserve_health_exits_0_while_serving_and_1_once_draining() -> None:
    """`meshserve health` (the image's HEALTHCHECK) asks the server's own health service."""
    import subprocess
    import sys

    running = await start("test", ServerConfig(port=0, metrics_port=-1, grace_seconds=5), _register(SlowLoad()))
    address = f"127.0.0.1:{running.port}"

    def health(*extra: str) -> subprocess.CompletedProcess[str]:
        # Plaintext, whatever mesh the default run dir holds certificates of.
        return subprocess.run([sys.executable, "-m", "meshserve.commands.cli", "health", address,
                               "--mesh-tls-dir", "", *extra],
                              capture_output=True, text=True, timeout=60)

    try:
        serving = await asyncio.to_thread(health)
        assert serving.returncode == 0 and "SERVING" in serving.stdout
        await running.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        draining = await asyncio.to_thread(health)
        assert draining.returncode == 1 and "NOT_SERVING" in draining.stdout
        unknown = await asyncio.to_thread(health, "--service", "no.such.Service")
        assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr
    finally:
        await running.shutdown()


async def test_a_peer_slow_to_answer_a_new_connection_is_still_reached() -> None:
    """A peer on a busy machine may answer a new connection's handshake late: the mesh's channels
    wait for it rather than failing the RPC (gRPC reads ``min_reconnect_backoff_ms`` as the
    handshake's time limit; at 100 ms a CI run failed a request this way)."""
    server = grpc.aio.server()
    health_pb2_grpc.add_HealthServicer_to_server(health.aio.HealthServicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        finally:
            writer.close()

    async def late(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(0.5)  # the peer's side of the handshake arrives half a second late
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer), return_exceptions=True)

    relay = await asyncio.start_server(late, "127.0.0.1", 0)
    try:
        async with insecure_channel(f"127.0.0.1:{relay.sockets[0].getsockname()[1]}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        relay.close()
        await server.stop(0)


async def test_a_frozen_peers_new_connection_is_given_up_after_the_stall_timeout() -> None:
    """A frozen process's kernel still accepts TCP connections, but nothing answers the HTTP/2
    handshake: a worker channel gives up after its stall timeout (the RPC fails UNAVAILABLE and
    the gateway goes elsewhere), as it does for a connection whose pings go unanswered."""
    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(8)  # never accepted, never answered
        address = f"127.0.0.1:{frozen.getsockname()[1]}"
        async with insecure_channel(address, stall_options(0.5)) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as failed:
                await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=3)
    assert failed.value.code() == grpc.StatusCode.UNAVAILABLE, failed.value.details()


class Answering(pb_grpc.WorkerServicer):
    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.WorkerInfo:
        return pb.WorkerInfo(worker_id="w")

    async def WatchLoad(self, request: pb.WatchLoadRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.LoadReport]:
        yield pb.LoadReport(sequence=1)


async def test_a_request_message_that_cannot_be_read_is_the_callers_fault() -> None:
    """Not a message of its type (or one nested past protobuf's depth limit): INVALID_ARGUMENT, an
    HTTP 400 at the edge, not gRPC's own UNKNOWN, a 500; a good request is answered after."""
    def register(server: grpc.aio.Server) -> list[str]:
        pb_grpc.add_WorkerServicer_to_server(Answering(), server)
        return ["meshserve.v1.Worker"]

    running = await start("test", ServerConfig(port=0, metrics_port=-1, grace_seconds=0), register)
    try:
        async with insecure_channel(f"127.0.0.1:{running.port}") as channel:
            for method, stream in (("/meshserve.v1.Worker/Info", False), ("/meshserve.v1.Worker/WatchLoad", True)):
                call = (channel.unary_stream if stream else channel.unary_unary)(
                    method, request_serializer=None, response_deserializer=None)
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    reply = call(b"\xff\xff\xff", timeout=5)
                    _ = [r async for r in reply] if stream else await reply
                assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, err.value.code())
                assert "could not be read" in (err.value.details() or "")
            stub = pb_grpc.WorkerStub(channel)
            assert (await stub.Info(pb.InfoRequest(), timeout=5)).worker_id == "w"
            assert [r.sequence async for r in stub.WatchLoad(pb.WatchLoadRequest(), timeout=5)] == [1]
    finally:
        await running.shutdown()
