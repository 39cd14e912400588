"""Exact cache entries read straight from the cache's Redis/Valkey (``--redis-url``).

The cache service writes every entry (and indexes it for semantic lookups); an exact lookup is
one GET under the key both sides compute (``services.cache_keys``), so the gateway reads it
itself instead of asking the cache service: a Python process and a gRPC call fewer on the path of
every cacheable request, and of every exact hit. Redis errors propagate as
``redis.exceptions.RedisError`` (or TimeoutError): the caller serves uncached and its breaker
counts them.
"""

from __future__ import annotations

import asyncio

from gateway import metrics
from services import cache_keys
from services.gen import meshserve_pb2 as pb


class ExactEntries:
    def __init__(self, redis_url: str, timeout_s: float) -> None:
        self._redis = cache_keys.connect(redis_url, socket_timeout_s=timeout_s)
        self._timeout_s = timeout_s

    async def get(self, key: str) -> pb.CacheEntry | None:
        """The entry under ``key``, or None; a corrupt one is deleted (a miss), as the cache
        service does. Bounded by ``timeout_s`` as a whole (the client's one retry included):
        TimeoutError past it."""
        async with asyncio.timeout(self._timeout_s):
            return await cache_keys.entry_or_delete(self._redis, key, await self._redis.get(key),
                                                    metrics.CACHE_CORRUPT)

    async def close(self) -> None:
        await self._redis.aclose()
