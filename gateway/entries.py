"""Exact cache entries read and written straight in the cache's Redis/Valkey (``--redis-url``).

An exact lookup is one GET, and a store one SET, under the key the gateway and the cache service
both compute (``services.cache_keys``), so the gateway does both itself instead of asking the
cache service: a Python process and a gRPC call fewer on the path of every cacheable request, and
of every exact hit. The cache service still indexes entries by meaning (the gateway sends it the
request alone) and answers semantic lookups. Redis errors propagate as
``redis.exceptions.RedisError`` (or TimeoutError): the caller serves uncached and its breaker
counts them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from meshserve.gateway import metrics
from meshserve.services import cache_keys
from meshserve.services.gen import meshserve_pb2 as pb


class ExactEntries:
    def __init__(self, redis_url: str, timeout_s: float, ttl_seconds: int, max_entry_bytes: int) -> None:
        self._redis = cache_keys.connect(redis_url, socket_timeout_s=timeout_s)
        self._timeout_s = timeout_s
        self._ttl = ttl_seconds
        self._max_entry_bytes = max_entry_bytes

    async def get(self, key: str) -> pb.CacheEntry | None:
        """The entry under ``key``, or None; a corrupt one is deleted (a miss), as the cache
        service does. Bounded by ``timeout_s`` as a whole (the client's one retry included):
        TimeoutError past it."""
        async with asyncio.timeout(self._timeout_s):
            return await cache_keys.entry_or_delete(self._redis, key, await self._redis.get(key),
                                                    metrics.CACHE_CORRUPT)

    async def put(self, key: str, req: pb.GenerateRequest, chunks: Sequence[pb.GenerateResponse]) -> str:
        """Stores the finished stream ``chunks`` of ``req`` under ``key`` for the TTL; returns why
        it was refused ('' when stored). Bounded by ``timeout_s`` as ``get`` is."""
        async with asyncio.timeout(self._timeout_s):
            return await cache_keys.store_entry(self._redis, key, req, chunks, self._ttl, self._max_entry_bytes)

    async def close(self) -> None:
        await self._redis.aclose()
