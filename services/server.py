"""The one bootstrap every meshserve service runs: grpc.aio server, standard health and
reflection services, a Prometheus endpoint, and SIGTERM -> drain -> close.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import grpc
import prometheus_client
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from meshserve.services import telemetry
from meshserve.services.config import ServerConfig
from meshserve.services.mesh_tls import MeshTls, channel

log = logging.getLogger(__name__)

LOOP_LAG = prometheus_client.Histogram(
    "meshserve_event_loop_lag_seconds",
    "How late the service's event loop ran a timer due every 100 ms: the time a request, a pick or "
    "a token waited for the loop to be free (a saturated loop, not a slow peer, when this grows)",
    buckets=[0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5],
)
LOOP_LAG_INTERVAL_S = 0.1

# Generous message limits: cached completions are replayed as one message.
CHANNEL_OPTIONS = [
    ("grpc.max_send_message_length", 64 * 2**20),
    ("grpc.max_receive_message_length", 64 * 2**20),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    # A restarted peer (a worker, the router) is reached again within 2 s, not gRPC's default
    # of up to 2 minutes of backoff.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    # gRPC core reads this one as the time a connection attempt gets to finish its TCP and HTTP/2
    # handshake, not as a backoff. At 100 ms an RPC failed UNAVAILABLE ("timed out before
    # receiving SETTINGS frame") when a busy 2-core machine answered a new connection late.
    ("grpc.min_reconnect_backoff_ms", 5000),
]


def configure_logging(level: str) -> None:
    """Every line carries the trace id of the request it is about ('-' outside any)."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s trace=%(trace_id)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(telemetry.TraceIdLogFilter())


# What a server accepts from its clients: keepalive pings as often as every 100 ms (a gateway
# finds a frozen worker by its unanswered pings; gRPC's default would call that abuse).
SERVER_OPTIONS = [
    ("grpc.http2.min_ping_interval_without_data_ms", 100),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", 100),
    ("grpc.http2.max_ping_strikes", 0),
    # Calls that have arrived but that the service has not taken up yet: gRPC core cancels them
    # past 1,000 (a CANCELLED with no message, before any handler runs) and past 3,000 at once. A
    # burst of 2,000 streams through Envoy to one gateway did that to 5% of them; each service
    # refuses past its own bound instead (the gateway: RESOURCE_EXHAUSTED with retry-after).
    ("grpc.server.max_pending_requests", 1 << 20),
    ("grpc.server.max_pending_requests_hard_limit", 1 << 20),
]


def stall_options(stall_timeout_s: float) -> list[tuple[str, int]]:
    """Channel options that close a connection whose peer answers no keepalive ping within
    ``stall_timeout_s``: a process that froze (SIGSTOP, a hung host) without closing its socket.
    Pings are answered by gRPC's transport, not by the peer's Python code, so a busy peer is
    not taken for a frozen one. A new connection whose handshake goes unanswered that long is
    given up the same way (its kernel still accepts the TCP connection of a frozen process)."""
    timeout_ms = max(1, int(stall_timeout_s * 1000))
    return [("grpc.keepalive_time_ms", max(1, timeout_ms // 4)), ("grpc.keepalive_timeout_ms", timeout_ms),
            ("grpc.http2.ping_timeout_ms", timeout_ms), ("grpc.min_reconnect_backoff_ms", timeout_ms)]


def mesh_channel(address: str, tls: MeshTls | None, peer: str = "",
                 extra: list[tuple[str, int]] | None = None) -> grpc.aio.Channel:
    """An aio channel to another meshserve service, with the mesh's channel options (``extra``
    ones override them), over mutual TLS when ``tls`` is given (``peer``: the identity the
    server's certificate must carry; services.mesh_tls.channel)."""
    options: dict[str, int | str] = dict(CHANNEL_OPTIONS)
    options.update(extra or [])
    return channel(address, tls, peer, list(options.items()))


def insecure_channel(address: str, extra: list[tuple[str, int]] | None = None) -> grpc.aio.Channel:
    """A plaintext ``mesh_channel`` (a mesh without mutual TLS, Envoy's public port)."""
    return mesh_channel(address, None, "", extra)


@dataclass
class Lifecycle:
    """Hooks a service gives ``serve``: called on drain (stop taking work) and on close."""

    on_drain: list[Callable[[], Awaitable[None]]] = field(default_factory=list)
    on_close: list[Callable[[], Awaitable[None]]] = field(default_factory=list)


@dataclass
class Running:
    """A started server, for tests and for the ready file."""

    server: grpc.aio.Server
    port: int
    metrics_port: int
    health: health.aio.HealthServicer
    lifecycle: Lifecycle
    service_names: list[str]
    grace_seconds: float
    lag_monitor: asyncio.Task[None] | None = None

    async def shutdown(self) -> None:
        """Drain: report NOT_SERVING, stop accepting, let in-flight streams finish, then close."""
        for name in ["", *self.service_names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        for hook in self.lifecycle.on_drain:
            await hook()
        await self.server.stop(self.grace_seconds)
        for hook in self.lifecycle.on_close:
            await hook()
        if self.lag_monitor is not None:
            self.lag_monitor.cancel()
        await asyncio.to_thread(telemetry.flush)
        gc.unfreeze()  # a stopped service gives what it froze at start back to the collector


class ServiceCalls(grpc.aio.ServerInterceptor):
    """How every call to our services (not gRPC's own: health, reflection) runs: traced
    (``telemetry.traced``), and each server-streaming handler as a coroutine that writes with
    ``context.write``, not as the async generator it is written as: grpc.aio does not close a
    generator handler whose RPC is cancelled while it waits in a write, so the servicer's cleanup
    (cancel the worker call, abort the engine request) would wait for garbage collection. Here the
    end of the RPC (a client that went away included) cancels the handler wherever it waits, and
    the cancellation unwinds through ``aclosing``, which closes the servicer's stream. One
    interceptor, so a call pays for one."""

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or details.method.startswith("/grpc."):
            return handler
        handler = _decoded(handler)
        handler = telemetry.traced(handler, details)
        if handler.unary_stream is None:
            return handler
        return handler._replace(unary_stream=_write_loop(handler.unary_stream))


class _Undecodable:
    """A request message its deserializer could not read (nested past protobuf's depth limit,
    not a message of its type): what the behavior gets instead, to refuse it."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def _decoded(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of single requests whose undecodable request is the caller's fault
    (INVALID_ARGUMENT), not an error of the service's (gRPC's own answer: UNKNOWN, an HTTP 500
    at the edge)."""
    if handler.request_streaming or handler.request_deserializer is None:
        return handler
    deserialize = handler.request_deserializer

    def safely(data: bytes) -> Any:
        try:
            return deserialize(data)
        except Exception as e:  # noqa: BLE001 - whatever the message's parser raises
            return _Undecodable(e)

    async def refuse(request: _Undecodable, context: grpc.aio.ServicerContext) -> None:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                            f"the request message could not be read: {request.error}")

    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        async def refused(request: _Undecodable, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            await refuse(request, context)
            yield  # never reached: abort raises

        def unary_stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
            # The servicer's own stream, not one wrapped around it: no generator more per chunk.
            return refused(request, context) if isinstance(request, _Undecodable) else inner_stream(request, context)

        return handler._replace(request_deserializer=safely, unary_stream=unary_stream)
    inner = handler.unary_unary

    async def unary_unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
        if isinstance(request, _Undecodable):
            await refuse(request, context)
        return await inner(request, context)

    return handler._replace(request_deserializer=safely, unary_unary=unary_unary)


def _write_loop(inner: Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]) -> Any:
    async def behavior(request: Any, context: grpc.aio.ServicerContext) -> None:
        task = asyncio.current_task()
        if task is not None:  # after a normal finish this is a no-op
            context.add_done_callback(lambda _: task.cancel())
        async with contextlib.aclosing(inner(request, context)) as stream:
            async for response in stream:
                await context.write(response)

    return behavior


class CannotListen(SystemExit):
    """A service's port is taken (or its host is not this machine's): the process ends with this
    one line on stderr, and exit status 1, instead of a traceback."""

    def __init__(self, name: str, what: str, host: str, port: int, flag: str) -> None:
        super().__init__(f"{name}: cannot serve {what} on {host}:{port}: the port is in use by another process, "
                         f"or {host} is not an address of this machine; stop that process or choose another "
                         f"port ({flag})")


# How long a start waits for a port that is taken for a moment: an earlier process on it still
# closing, or an outgoing connection's own end (the default ports 50051+ lie in Linux's ephemeral
# range, 32768-60999, from which every client connection takes one).
BIND_WAIT_S = 5.0


def _port_taken(host: str, port: int) -> bool:
    """Whether ``host:port`` is in use now: no address it resolves to can be bound, as gRPC's
    listener would bind it (SO_REUSEADDR, no SO_REUSEPORT), and one of them because it is in use.
    Any other failure (a foreign address, a privileged port) is left to the bind to report."""
    if port == 0:
        return False
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return False
    in_use = False
    for family, kind, proto, _, address in addresses:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
            return False
        except OSError as e:
            in_use = in_use or e.errno == errno.EADDRINUSE
    return in_use


async def port_free(name: str, what: str, host: str, port: int) -> None:
    """Returns once ``host:port`` is not in use, or after BIND_WAIT_S (the bind then fails and says why)."""
    if not _port_taken(host, port):
        return
    log.warning("%s: %s port %s:%d is taken; trying again for up to %.0f s", name, what, host, port, BIND_WAIT_S)
    deadline = time.monotonic() + BIND_WAIT_S
    while time.monotonic() < deadline:
        await asyncio.sleep(0.1)
        if not _port_taken(host, port):
            return


async def start(
    name: str,
    cfg: ServerConfig,
    register: Callable[[grpc.aio.Server], Iterable[str]],
    lifecycle: Lifecycle | None = None,
    max_receive_bytes: int | None = None,
) -> Running:
    """Starts a service: ``register`` adds its servicers and returns their full names.
    ``max_receive_bytes``: the largest message it reads from a client (a public service's bound;
    the mesh's own services take CHANNEL_OPTIONS' generous one)."""
    telemetry.setup_tracing(name.partition("[")[0], cfg)
    # No SO_REUSEPORT: a second server on a busy port must fail, not share it silently.
    options = dict([*CHANNEL_OPTIONS, *SERVER_OPTIONS, ("grpc.so_reuseport", 0)])
    if max_receive_bytes is not None:
        options["grpc.max_receive_message_length"] = max_receive_bytes
    server = grpc.aio.server(
        options=list(options.items()),
        interceptors=[ServiceCalls()],
    )
    service_names = list(register(server))
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection(
        [*service_names, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name, reflection.SERVICE_NAME],
        server,
    )
    await port_free(name, "gRPC", cfg.host, cfg.port)
    tls = MeshTls.of(cfg)
    try:
        address = f"{cfg.host}:{cfg.port}"
        port = server.add_insecure_port(address) if tls is None else server.add_secure_port(
            address, tls.server_credentials())
    except RuntimeError:  # grpc's own message says only "Failed to bind"
        raise CannotListen(name, "gRPC", cfg.host, cfg.port, "--port") from None
    metrics_port = -1
    if cfg.metrics_port >= 0:
        await port_free(name, "metrics", cfg.host, cfg.metrics_port)
        try:
            http_server, _ = prometheus_client.start_http_server(cfg.metrics_port, addr=cfg.host)
        except OSError:
            raise CannotListen(name, "metrics", cfg.host, cfg.metrics_port, "--metrics-port") from None
        metrics_port = http_server.server_port
    await server.start()
    _settle_garbage_collector()
    if cfg.ready_file:  # written before SERVING, so whoever waits for SERVING can read it
        tmp = cfg.ready_file + ".tmp"
        with open(tmp, "w") as f:
            f.write(f"{cfg.host}:{port} {metrics_port}\n")
        os.replace(tmp, cfg.ready_file)
    for svc in ["", *service_names]:
        await health_servicer.set(svc, health_pb2.HealthCheckResponse.SERVING)
    log.info("%s serving gRPC%s on %s:%d, metrics on :%d", name, " (mutual TLS)" if tls else "", cfg.host, port,
             metrics_port)
    return Running(server, port, metrics_port, health_servicer, lifecycle or Lifecycle(), service_names,
                   cfg.grace_seconds, asyncio.create_task(watch_loop_lag(), name="loop lag"))


async def watch_loop_lag(interval_s: float = LOOP_LAG_INTERVAL_S) -> None:
    """Observes ``LOOP_LAG`` until cancelled: how much later than due a timer every
    ``interval_s`` ran. A plain callback, not a task: an idle service's every wake-up costs it
    ~0.2 ms of CPU here (measured: a timer every 25 ms was ~0.9% of a core per idle service,
    every 100 ms ~0.17%); a busy loop runs the timer within an iteration it makes anyway."""
    loop = asyncio.get_running_loop()

    def tick(due: float) -> None:
        nonlocal handle
        now = loop.time()
        LOOP_LAG.observe(max(0.0, now - due))
        handle = loop.call_at(now + interval_s, tick, now + interval_s)

    first = loop.time() + interval_s
    handle = loop.call_at(first, tick, first)
    try:
        await loop.create_future()  # until cancelled
    finally:
        handle.cancel()


# Young-generation collections every this many new container objects (Python's default: 700).
GC_GEN0_THRESHOLD = 10_000


def _settle_garbage_collector() -> None:
    """Once started: move every object made so far (modules, stubs, config) out of the
    collector's reach, and collect the young generation less often. A relaying service makes and
    drops many short-lived objects per token, and with tracing on every request's spans live
    until their batch is exported, so at the default threshold the gateway spent ~8% of its CPU
    (~11% with tracing) in the collector; with this, ~1.5% (measured: 0.56 / 0.81 s -> 0.10 /
    0.11 s of collection per 1,220-request run at 300 users, tracing off / on)."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


async def serve(
    name: str,
    cfg: ServerConfig,
    register: Callable[[grpc.aio.Server], Iterable[str]],
    lifecycle: Lifecycle | None = None,
) -> None:
    """Runs a service until SIGTERM or SIGINT, then drains and closes it."""
    await run_until_signal(name, await start(name, cfg, register, lifecycle))


async def run_until_signal(name: str, running: Running) -> None:
    """Waits for SIGTERM or SIGINT, then drains and closes a started service."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("%s draining (grace %.1fs)", name, running.grace_seconds)
    await running.shutdown()
    log.info("%s stopped", name)
