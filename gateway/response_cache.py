"""The gateway's response cache stage: finished deterministic answers, looked up before a request
is generated and stored after, exact or by meaning.

Two backends behind one interface. A gateway given the cache's Redis URL reads and writes exact
entries there itself (gateway.entries: one GET per lookup, no call to another process) and asks
the cache service only by meaning, while the request is generated; otherwise the cache service
answers both. Each backend has its own circuit breaker: a cache service that is down or slow (its
embedder behind) then costs the semantic hits, not the exact ones. Failures never fail a request:
it is served uncached.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import redis.exceptions

from meshserve.gateway import metrics
from meshserve.gateway.breaker import Breaker
from meshserve.gateway.entries import ExactEntries
from meshserve.gateway.relay import merge
from meshserve.services import cache_keys, telemetry, validation
from meshserve.services.config import GatewayConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

INDEX_TIMEOUT_S = 1.0  # the cache service queueing a stored entry to be indexed by meaning (after the answer)


@dataclass(frozen=True)
class CacheKey:
    """What a request is cached under: the request as the cache keys it (its model scoped by the
    weights that answer it), its exact entry's Redis key, the tenant, the mode and the weights."""

    request: pb.GenerateRequest
    exact: str
    tenant: str
    mode: str
    weights: str

    @property
    def flight(self) -> str:
        """The key identical requests in flight share one generation under (the coalescer's): the
        exact entry's, and the mode, so an "exact" request never gets a "semantic" one's hit."""
        return f"{self.exact}/{self.mode}"


class _Backend:
    """A breaker, and the warning its calls are failing logged once, not per request."""

    def __init__(self, what: str, breaker: Breaker) -> None:
        self.what = what
        self.breaker = breaker
        self._ok = True

    def failed(self, op: str, request_id: str, detail: str) -> None:
        metrics.CACHE_ERRORS.labels(op).inc()
        log.log(logging.WARNING if self._ok else logging.DEBUG,
                "request %s: cache %s failed, serving uncached: %s", request_id, op, detail)
        self._ok = False
        if self.breaker.failed():
            log.warning("%s: breaker open after %d failed calls in a row; not calling it for %gs",
                        self.what, self.breaker.threshold, self.breaker.open_s)

    def worked(self) -> None:
        self.breaker.worked()
        if not self._ok:
            log.info("%s answering again", self.what)
            self._ok = True


class ResponseCache:
    def __init__(self, cfg: GatewayConfig, service: pb_grpc.CacheStub | None, entries: ExactEntries | None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._cfg = cfg
        self._service = service
        self._entries = entries
        breaker = Breaker(cfg.cache_breaker_failures, cfg.cache_breaker_s, clock)
        self._main = _Backend("the cache" if entries is None else "the cache's Redis", breaker)
        self._by_meaning = self._main if entries is None else _Backend(
            "the cache service (semantic lookups)",
            Breaker(cfg.cache_breaker_failures, cfg.cache_breaker_s, clock, metrics.SEMANTIC_BREAKER_OPEN))

    @property
    def available(self) -> bool:
        """Whether this gateway has a cache at all (``--cache ''``: none)."""
        return self._service is not None

    @property
    def reads_entries(self) -> bool:
        """Whether exact entries are read in Redis by the gateway itself (a hit needs no flight)."""
        return self._entries is not None

    def key(self, req: pb.GenerateRequest, tenant: str, mode: str, weights_id: str) -> CacheKey:
        """``req``'s key: an unnamed model is the served one, and the weights that answer it are
        part of its name (``name@weights_id``) when the workers say which, so new weights under
        the same name have entries of their own."""
        model = req.model or self._cfg.model
        if weights_id:
            model = f"{model}@{weights_id}"
        view = req
        if model != req.model:
            view = pb.GenerateRequest()
            view.CopyFrom(req)
            view.model = model
        return CacheKey(view, cache_keys.exact_key(view, tenant, self._cfg.cache_key_prefix), tenant, mode, weights_id)

    async def read(self, key: CacheKey) -> pb.LookupResponse | None:
        """The answer the cache holds for ``key`` (None: a miss, or the cache failed): the exact
        entry read in Redis when the gateway has its URL (by meaning: ``by_meaning``), else the
        cache service's answer in the key's mode."""
        if self._service is None or not self._main.breaker.allow():
            return None
        if self._entries is None:
            with telemetry.tracer.start_as_current_span("cache lookup") as span:
                return await self._ask_service(key, False, span, self._main)
        with telemetry.tracer.start_as_current_span("cache read") as span:
            started = time.perf_counter()
            try:
                entry = await self._entries.get(key.exact)
            except (redis.exceptions.RedisError, TimeoutError) as e:
                metrics.CACHE_READS.labels("error").inc()
                span.set_attribute("meshserve.cache.result", "error")
                self._main.failed("lookup", key.request.request_id, f"Redis: {type(e).__name__}: {e}")
                return None
            metrics.CACHE_READ_SECONDS.observe(time.perf_counter() - started)
            metrics.CACHE_READS.labels("miss" if entry is None else "hit").inc()
            self._main.worked()
            span.set_attributes({"meshserve.cache.result": "miss" if entry is None else "hit",
                                 "meshserve.cache.kind": cache_keys.KIND_EXACT})
        if entry is None:
            return None
        metrics.CACHE_HITS.labels(cache_keys.KIND_EXACT).inc()
        return pb.LookupResponse(hit=True, kind=cache_keys.KIND_EXACT, chunks=entry.chunks,
                                 age_s=max(0.0, time.time() - entry.stored_at))

    def by_meaning(self, key: CacheKey) -> Coroutine[Any, Any, pb.LookupResponse | None] | None:
        """The cache service's match by meaning for a request whose exact entry the gateway read
        and missed, to run while it is generated; None when there is none to ask."""
        if self._entries is None or key.mode != validation.CACHE_SEMANTIC or not self._by_meaning.breaker.allow():
            return None
        return self._lookup_by_meaning(key)

    async def _lookup_by_meaning(self, key: CacheKey) -> pb.LookupResponse | None:
        with telemetry.tracer.start_as_current_span("cache lookup") as span:
            return await self._ask_service(key, True, span, self._by_meaning)

    async def _ask_service(self, key: CacheKey, exact_missed: bool, span: Any, backend: _Backend
                           ) -> pb.LookupResponse | None:
        assert self._service is not None
        mode = validation.CACHE_SEMANTIC if exact_missed else key.mode
        try:
            resp = await self._service.Lookup(
                pb.LookupRequest(request=key.request, tenant=key.tenant, mode=mode, exact_missed=exact_missed),
                timeout=self._cfg.cache_timeout_s, metadata=telemetry.outgoing_metadata())
        except grpc.aio.AioRpcError as e:
            span.set_attribute("meshserve.cache.result", "error")
            backend.failed("lookup", key.request.request_id, f"{e.code().name} {e.details()}")
            return None
        backend.worked()
        hit = resp.hit and bool(resp.chunks)
        span.set_attributes({"meshserve.cache.result": "hit" if hit else "miss",
                             "meshserve.cache.kind": resp.kind or mode})
        if not hit:
            return None
        metrics.CACHE_HITS.labels(resp.kind).inc()
        if resp.similarity:
            span.set_attribute("meshserve.cache.similarity", resp.similarity)
        return resp

    async def store(self, key: CacheKey, chunks: Sequence[pb.GenerateResponse], stored: Callable[[], None]) -> None:
        """Stores a finished generation: in Redis by the gateway itself when it has the URL (and,
        for a semantic request, then asks the cache service to index it by meaning), else by the
        cache service. ``stored()`` as soon as the entry is written or the attempt is over."""
        if self._service is None or not self._main.breaker.allow():
            stored()
            return
        request_id = key.request.request_id
        with telemetry.tracer.start_as_current_span("cache store") as span:
            if self._entries is not None:
                try:
                    reason = await self._entries.put(key.exact, key.request, chunks)
                except (redis.exceptions.RedisError, TimeoutError) as e:
                    metrics.CACHE_WRITES.labels("error").inc()
                    span.set_attribute("meshserve.cache.result", "error")
                    self._main.failed("store", request_id, f"Redis: {type(e).__name__}: {e}")
                    return
                finally:
                    stored()
                metrics.CACHE_WRITES.labels("refused" if reason else "stored").inc()
            else:
                try:
                    resp = await self._service.Store(
                        pb.StoreRequest(request=key.request, tenant=key.tenant, chunks=chunks),
                        timeout=self._cfg.cache_timeout_s, metadata=telemetry.outgoing_metadata())
                except grpc.aio.AioRpcError as e:
                    span.set_attribute("meshserve.cache.result", "error")
                    self._main.failed("store", request_id, f"{e.code().name} {e.details()}")
                    return
                finally:
                    stored()
                reason = "" if resp.stored else resp.reason
            self._main.worked()
            span.set_attribute("meshserve.cache.result", "refused" if reason else "stored")
            if reason:
                log.debug("request %s: not cached: %s", request_id, reason)
            elif self._entries is not None and key.mode == validation.CACHE_SEMANTIC \
                    and not self._by_meaning.breaker.is_open:
                await self._index(key)  # in the store's span: the cache service's is its child

    async def _index(self, key: CacheKey) -> None:
        """Asks the cache service to index an entry the gateway stored by meaning. After the answer
        and off every request's path: a failure loses a future semantic hit, costs no request
        anything, and does not count for the breaker (lookups do; while theirs is open, none is sent)."""
        assert self._service is not None
        try:
            await self._service.Store(pb.StoreRequest(request=key.request, tenant=key.tenant, index_only=True),
                                      timeout=INDEX_TIMEOUT_S, metadata=telemetry.outgoing_metadata())
        except grpc.aio.AioRpcError as e:
            metrics.CACHE_ERRORS.labels("index").inc()
            log.debug("request %s: not indexed by meaning: %s %s", key.request.request_id, e.code().name, e.details())


def hit_chunk(req: pb.GenerateRequest, hit: pb.LookupResponse) -> pb.GenerateResponse:
    """A cache hit's stored answer as one chunk of ``req``, saying how it was answered."""
    chunk = merge(list(hit.chunks))
    chunk.request_id, chunk.cached, chunk.worker = req.request_id, True, ""
    chunk.cache_kind, chunk.cache_age_s, chunk.cache_similarity = hit.kind, hit.age_s, hit.similarity
    return chunk
