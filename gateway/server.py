"""The gateway's gRPC edge: the public Inference service over the Orchestrator pipeline."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import grpc

from meshserve.gateway import admin
from meshserve.gateway.adapters import AdapterChanges, AdaptersServicer
from meshserve.gateway.clients import Clients
from meshserve.gateway.entries import ExactEntries
from meshserve.gateway.http_edge import HttpEdge
from meshserve.gateway.openai_servicer import OpenAIServicer
from meshserve.gateway.errors import GatewayError
from meshserve.gateway.orchestrator import Orchestrator
from meshserve.gateway.picks import EmbeddedRouter
from meshserve.services.config import EDGE_IDENTITY, EMBEDDED_ROUTER, GatewayConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.mesh_tls import MeshTls, peer_identity
from meshserve.services.server import Lifecycle, Running, run_until_signal, start

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Inference"].full_name
ADAPTERS_SERVICE = pb.DESCRIPTOR.services_by_name["Adapters"].full_name
# Cache entries, limits and the ledger are per tenant; the edge (Envoy, auth) sets this header.
TENANT_METADATA = "x-meshserve-tenant"


class TenantOf:
    """The tenant a call is for: its ``x-meshserve-tenant`` metadata. With mutual TLS inside the
    mesh it is believed only from the edge (a caller whose certificate names ``edge``); any other
    caller that names a tenant is refused with PERMISSION_DENIED, one that names none is served
    as no tenant. Without mutual TLS no caller is authenticated and the header is taken as sent
    (the gateway's port must then be reachable from the edge alone)."""

    def __init__(self, mutual_tls: bool, edge: str = EDGE_IDENTITY) -> None:
        self._mutual_tls = mutual_tls
        self._edge = edge

    async def __call__(self, context: grpc.aio.ServicerContext) -> str:
        tenant = ""
        for key, value in context.invocation_metadata() or ():
            if key == TENANT_METADATA:
                tenant = value if isinstance(value, str) else value.decode()
        if tenant and self._mutual_tls and (caller := peer_identity(context)) != self._edge:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"only the edge ({self._edge}) may name a tenant ({TENANT_METADATA}); this caller "
                                f"is {caller or 'anonymous'}: call through Envoy, or name no tenant")
        return tenant


class InferenceServicer(pb_grpc.InferenceServicer):
    """Thin: runs the orchestrator and turns GatewayError into a gRPC status."""

    def __init__(self, orchestrator: Orchestrator, tenant_of: TenantOf) -> None:
        self._orch = orchestrator
        self._tenant_of = tenant_of

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        stream = self._orch.generate(request, await self._tenant_of(context))
        try:
            async for chunk in stream:
                yield chunk
        except GatewayError as e:
            await context.abort(e.code, e.message, trailing_metadata=e.trailers)
        finally:
            # A cancelled client must cancel the worker call now, not when the generator is collected.
            await stream.aclose()

    async def Complete(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> pb.CompleteResponse:
        try:
            return await self._orch.complete(request, await self._tenant_of(context))
        except GatewayError as e:
            await context.abort(e.code, e.message, trailing_metadata=e.trailers)
            raise  # unreachable: abort raises


def _build(
    cfg: GatewayConfig, core: EmbeddedRouter | None,
) -> tuple[Callable[[grpc.aio.Server], list[str]], Lifecycle, HttpEdge | None]:
    """Both public services share one orchestrator (one admission bound, one set of channels),
    and so does the HTTP edge of the streaming OpenAI paths, when it is on. ``core``: the
    router's parts, for ``--router embedded``."""
    entries = (ExactEntries(cfg.redis_url, cfg.cache_timeout_s, cfg.cache_ttl_seconds, cfg.cache_max_entry_bytes)
               if cfg.redis_url else None)
    if (core is not None) != (cfg.router == EMBEDDED_ROUTER):
        raise ValueError(f"a gateway with --router {EMBEDDED_ROUTER} needs the router's parts and only it takes "
                         "them (`meshserve serve gateway` builds them)")
    tls = MeshTls.of(cfg)
    clients = Clients(core.servicer if core else cfg.router, cfg.cache, cfg.stall_timeout_s, entries, tls)
    orchestrator = Orchestrator(cfg, clients)
    tenant_of = TenantOf(mutual_tls=tls is not None)
    inference = InferenceServicer(orchestrator, tenant_of)
    openai = OpenAIServicer(orchestrator, cfg.model, tenant_of, limits=cfg)
    operators = admin.GatewayAdminServicer(orchestrator.ledger)
    changes = AdapterChanges(orchestrator.fleet, clients.worker, cfg.model, cfg.adapter_change_timeout_s)
    keys = orchestrator.tenants
    adapters = AdaptersServicer(changes, cfg.allow_runtime_lora_updating, tenant_of,
                                (lambda t: keys.of(t).admin == 1) if keys.tenants else None)

    def register(server: grpc.aio.Server) -> list[str]:
        orchestrator.start()
        pb_grpc.add_InferenceServicer_to_server(inference, server)
        pb_grpc.add_OpenAIServicer_to_server(openai, server)
        pb_grpc.add_GatewayAdminServicer_to_server(operators, server)
        pb_grpc.add_AdaptersServicer_to_server(adapters, server)
        names = [SERVICE_NAME, OpenAIServicer.SERVICE_NAME, admin.SERVICE_NAME, ADAPTERS_SERVICE]
        if core is not None:  # the router's view is asked here (meshserve top, a router's clients)
            pb_grpc.add_RouterServicer_to_server(core.servicer, server)
            core.start("gateway's router")
            names.append(pb.DESCRIPTOR.services_by_name["Router"].full_name)
        return names

    on_close: list[Callable[[], Awaitable[None]]] = [orchestrator.close]
    if core is not None:
        on_close.append(core.close)
    if cfg.http_port < 0:
        return register, Lifecycle(on_close=on_close), None
    edge = HttpEdge(openai, cfg.host, cfg.http_port, cfg.grace_seconds, cfg.max_message_bytes,
                    tls.server_ssl_context() if tls else None)
    # Draining: the HTTP edge stops taking requests with the gRPC server and its streams finish
    # within the same grace; both are done before the orchestrator closes.
    return register, Lifecycle(on_drain=[edge.drain], on_close=[edge.close, *on_close]), edge


async def start_gateway(cfg: GatewayConfig, router: EmbeddedRouter | None = None) -> Running:
    """Starts the gateway in this process (tests use port 0), with its HTTP edge if configured
    (listening before the gateway reports SERVING); ``router``: the router's parts it picks with,
    for ``--router embedded``."""
    register, lifecycle, edge = _build(cfg, router)
    if edge is not None:
        await edge.start()
    # The public service's bound (Envoy streams gRPC unbuffered: its body limit does not hold here).
    return await start("gateway", cfg, register, lifecycle, max_receive_bytes=cfg.max_message_bytes)


async def main(cfg: GatewayConfig, router: EmbeddedRouter | None = None) -> None:
    await run_until_signal("gateway", await start_gateway(cfg, router))
