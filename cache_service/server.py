"""The Cache gRPC service: Lookup and Store of finished deterministic completions.

Only the exact-match kind exists today; a semantic kind (embedding similarity) would be a second
store consulted after an exact miss, reported with ``kind="semantic"``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import grpc
import prometheus_client
import redis.exceptions
from opentelemetry import trace

from cache_service.store import ExactStore, connect
from services.config import CacheConfig
from services.gen import meshserve_pb2 as pb
from services.gen import meshserve_pb2_grpc as pb_grpc
from services.server import Lifecycle, Running, serve, start

log = logging.getLogger(__name__)

LOOKUPS = prometheus_client.Counter(
    "meshserve_cache_lookups_total", "Cache lookups by result (hit, miss, error) and kind", ["result", "kind"]
)
STORES = prometheus_client.Counter(
    "meshserve_cache_stores_total", "Cache stores by result (stored, refused, error)", ["result"]
)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Cache"].full_name


class CacheServicer(pb_grpc.CacheServicer):
    """Thin edge over ExactStore: Redis errors become UNAVAILABLE, so callers serve uncached."""

    def __init__(self, exact: ExactStore) -> None:
        self._exact = exact

    async def Lookup(self, request: pb.LookupRequest, context: grpc.aio.ServicerContext) -> pb.LookupResponse:
        try:
            entry = await self._exact.lookup(request.request, request.tenant)
        except redis.exceptions.RedisError as e:
            LOOKUPS.labels("error", self._exact.kind).inc()
            trace.get_current_span().set_attribute("meshserve.cache.result", "error")
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cache backend (Redis) unavailable: {e}")
        result = "miss" if entry is None else "hit"
        # The span of this call (tracing interceptor in services.server).
        trace.get_current_span().set_attributes(
            {"meshserve.cache.result": result, "meshserve.cache.kind": self._exact.kind}
        )
        LOOKUPS.labels(result, self._exact.kind).inc()
        if entry is None:
            return pb.LookupResponse(hit=False)
        age = max(0.0, time.time() - entry.stored_at)
        return pb.LookupResponse(hit=True, kind=self._exact.kind, chunks=entry.chunks, age_s=age)

    async def Store(self, request: pb.StoreRequest, context: grpc.aio.ServicerContext) -> pb.StoreResponse:
        try:
            result = await self._exact.store(request.request, request.tenant, request.chunks)
        except redis.exceptions.RedisError as e:
            STORES.labels("error").inc()
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cache backend (Redis) unavailable: {e}")
        STORES.labels("stored" if result.stored else "refused").inc()
        trace.get_current_span().set_attribute(
            "meshserve.cache.result", "stored" if result.stored else "refused"
        )
        if not result.stored:
            log.debug("not stored (request %s): %s", request.request.request_id, result.reason)
        return pb.StoreResponse(stored=result.stored, reason=result.reason)


def _build(cfg: CacheConfig) -> tuple[CacheServicer, Lifecycle]:
    exact = ExactStore(connect(cfg.redis_url), cfg.ttl_seconds, cfg.key_prefix)
    return CacheServicer(exact), Lifecycle(on_close=[exact.close])


def _register(servicer: CacheServicer) -> Callable[[grpc.aio.Server], list[str]]:
    def register(server: grpc.aio.Server) -> list[str]:
        pb_grpc.add_CacheServicer_to_server(servicer, server)
        return [SERVICE_NAME]

    return register


async def start_cache(cfg: CacheConfig) -> Running:
    """Starts the cache service in this process (tests use port 0)."""
    servicer, lifecycle = _build(cfg)
    return await start("cache", cfg, _register(servicer), lifecycle)


async def main(cfg: CacheConfig) -> None:
    servicer, lifecycle = _build(cfg)
    await serve("cache", cfg, _register(servicer), lifecycle)
