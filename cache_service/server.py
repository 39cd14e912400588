"""The Cache gRPC service: Lookup and Store of finished deterministic completions.

Two kinds of hit: ``exact`` (the same request, ``cache_service.store``) and ``semantic`` (the
same question in other words within the same scope, ``cache_service.semantic``), looked up in
that order. Redis errors become UNAVAILABLE, so the gateway serves uncached.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import grpc
import prometheus_client
import redis.asyncio as aioredis
import redis.exceptions
from opentelemetry import trace

from meshserve.cache_service.matcher import matcher_for
from meshserve.cache_service.semantic import SemanticStore
from meshserve.cache_service.store import ExactStore
from meshserve.services import validation
from meshserve.services.cache_keys import connect, refusal
from meshserve.services.config import SERVICE_IDENTITIES, CacheConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.mesh_tls import peer_identity
from meshserve.services.server import Lifecycle, Running, serve, start

log = logging.getLogger(__name__)

LOOKUPS = prometheus_client.Counter(
    "meshserve_cache_lookups_total", "Cache lookups by result (hit, miss, error) and kind", ["result", "kind"]
)
LOOKUP_SECONDS = prometheus_client.Histogram(
    "meshserve_cache_lookup_seconds", "Time of a lookup in the cache service, by mode (exact, semantic)", ["mode"],
    buckets=[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64],
)
STORES = prometheus_client.Counter(
    "meshserve_cache_stores_total", "Cache stores by result (stored, refused, error)", ["result"]
)
INDEX_ONLY = prometheus_client.Counter(
    "meshserve_cache_index_requests_total",
    "Entries a gateway stored in Redis itself, sent to be indexed by meaning: queued or refused", ["result"]
)
REDIS_EVICTED = prometheus_client.Gauge(
    "meshserve_cache_redis_evicted_keys", "Keys Redis evicted to stay within its maxmemory (its INFO evicted_keys)"
)
REDIS_MEMORY = prometheus_client.Gauge("meshserve_cache_redis_used_memory_bytes", "Memory Redis uses (INFO used_memory)")

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Cache"].full_name
REDIS_STATS_S = 5.0


class CacheServicer(pb_grpc.CacheServicer):
    """Exact entries, then semantic ones; a Redis error is UNAVAILABLE (the caller serves uncached).
    With mutual TLS (``mutual_tls``) only a gateway may name a tenant: it is the one that believes
    a tenant only from the edge."""

    def __init__(self, exact: ExactStore, semantic: SemanticStore | None = None, mutual_tls: bool = False) -> None:
        self._exact = exact
        self._semantic = semantic
        self._mutual_tls = mutual_tls

    async def _check_tenant(self, tenant: str, context: grpc.aio.ServicerContext) -> None:
        gateway = SERVICE_IDENTITIES["gateway"]
        if tenant and self._mutual_tls and (caller := peer_identity(context)) != gateway:
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                f"only a gateway ({gateway}) may name a tenant; this caller is {caller or 'anonymous'}")

    async def Lookup(self, request: pb.LookupRequest, context: grpc.aio.ServicerContext) -> pb.LookupResponse:
        await self._check_tenant(request.tenant, context)
        mode = request.mode or validation.CACHE_SEMANTIC
        if self._semantic is None:
            mode = validation.CACHE_EXACT
        span = trace.get_current_span()  # the span of this call (tracing interceptor in services.server)
        started = time.perf_counter()
        try:
            resp = await self._lookup(request, mode)
        except redis.exceptions.RedisError as e:
            LOOKUPS.labels("error", mode).inc()
            span.set_attribute("meshserve.cache.result", "error")
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"cache backend (Redis) unavailable: {e}")
        LOOKUP_SECONDS.labels(mode).observe(time.perf_counter() - started)
        kind = resp.kind if resp.hit else mode
        LOOKUPS.labels("hit" if resp.hit else "miss", kind).inc()
        span.set_attributes({"meshserve.cache.result": "hit" if resp.hit else "miss", "meshserve.cache.kind": kind})
        if resp.hit and resp.kind == self._semantic_kind():
            span.set_attribute("meshserve.cache.similarity", resp.similarity)
        return resp

    def _semantic_kind(self) -> str:
        return self._semantic.kind if self._semantic is not None else ""

    async def _lookup(self, request: pb.LookupRequest, mode: str) -> pb.LookupResponse:
        req, tenant = request.request, request.tenant
        # The gateway that reads exact entries from Redis itself asks only for a semantic match.
        entry = None if request.exact_missed else await self._exact.lookup(req, tenant)
        similarity = 1.0
        kind = self._exact.kind
        if entry is None and mode == validation.CACHE_SEMANTIC and self._semantic is not None:
            if validation.cache_mode(req, mode) == validation.CACHE_OFF:
                return pb.LookupResponse(hit=False)
            found = await self._semantic.lookup(req, tenant)
            if found is not None:
                raw, match = found
                entry = await self._exact.parse(match.exact, raw)
                similarity, kind = match.similarity, self._semantic.kind
        if entry is None:
            return pb.LookupResponse(hit=False)
        age = max(0.0, time.time() - entry.stored_at)
        return pb.LookupResponse(hit=True, kind=kind, chunks=entry.chunks, age_s=age,
                                 similarity=similarity if kind != self._exact.kind else 0.0)

    async def Store(self, request: pb.StoreRequest, context: grpc.aio.ServicerContext) -> pb.StoreResponse:
        await self._check_tenant(request.tenant, context)
        if request.index_only:
            return self._index_only(request)
        try:
            result = await self._exact.store(request.request, request.tenant, request.chunks)
            if result.stored and self._semantic is not None:
                self._semantic.store_later(request.request, request.tenant, result.key)
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

    def _index_only(self, request: pb.StoreRequest) -> pb.StoreResponse:
        """An entry the gateway stored in Redis itself, made findable by meaning (queued)."""
        semantic = self._semantic
        reason = "this cache service has no semantic store" if semantic is None else refusal(request.request)
        if semantic is not None and not reason:
            semantic.store_later(request.request, request.tenant, self._exact.key(request.request, request.tenant))
        INDEX_ONLY.labels("queued" if not reason else "refused").inc()
        return pb.StoreResponse(stored=not reason, reason=reason)


async def _watch_redis(client: aioredis.Redis, stop: asyncio.Event) -> None:
    """Keeps the Redis gauges (evictions, memory) current until ``stop`` is set."""
    while not stop.is_set():
        try:
            stats = await client.info("stats")
            memory = await client.info("memory")
            REDIS_EVICTED.set(float(stats.get("evicted_keys", 0)))
            REDIS_MEMORY.set(float(memory.get("used_memory", 0)))
        except redis.exceptions.RedisError:
            pass  # lookups report it; the gauges keep their last values
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), REDIS_STATS_S)


def _build(cfg: CacheConfig) -> tuple[CacheServicer, Lifecycle]:
    client = connect(cfg.redis_url)
    exact = ExactStore(client, cfg.ttl_seconds, cfg.key_prefix, cfg.max_entry_bytes)
    lifecycle = Lifecycle(on_close=[exact.close])
    semantic = None
    if cfg.semantic:
        from meshserve.cache_service.embedder import Embedder  # noqa: PLC0415 (loads torch and the model)

        # The index follower blocks on a stream read: its own connection, a longer timeout.
        follower = connect(cfg.redis_url, socket_timeout_s=5.0)
        embedder = Embedder(threads=cfg.embed_threads, runtime=cfg.embed_runtime)
        matcher = matcher_for(cfg)
        matcher.warm_up()  # as the embedder ran its model: before the service says it is ready
        semantic = SemanticStore(client, follower, embedder, cfg.ttl_seconds, cfg.key_prefix,
                                 matcher, cfg.semantic_max_entries, cfg.semantic_budget_s)
        semantic.start()
        lifecycle.on_close.insert(0, semantic.close)
    stop = asyncio.Event()
    stats = asyncio.create_task(_watch_redis(client, stop), name="redis stats")

    async def stop_stats() -> None:
        # A flag, then a cancel: redis-py may turn a cancel inside a call into its own error.
        stop.set()
        stats.cancel()
        await asyncio.wait([stats], timeout=2.0)

    lifecycle.on_close.insert(0, stop_stats)
    return CacheServicer(exact, semantic, mutual_tls=bool(cfg.mesh_tls_dir)), lifecycle


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
