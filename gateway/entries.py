"""Exact cache entries read straight from the cache's Redis/Valkey (``--redis-url``).

The cache service writes every entry (and indexes it for semantic lookups); an exact lookup is
one GET under the key both sides compute (``services.cache_keys``), so the gateway reads it
itself instead of asking the cache service: a Python process and a gRPC call fewer on the path of
every cacheable request, and of every exact hit. Redis errors propagate as
``redis.exceptions.RedisError``: the caller serves uncached and its breaker counts them.
"""

from __future__ import annotations

import logging

from gateway import metrics
from services import cache_keys
from services.gen import meshserve_pb2 as pb

log = logging.getLogger(__name__)


class ExactEntries:
    def __init__(self, redis_url: str, key_prefix: str, timeout_s: float) -> None:
        self._redis = cache_keys.connect(redis_url, socket_timeout_s=timeout_s)
        self.key_prefix = key_prefix

    async def get(self, key: str) -> pb.CacheEntry | None:
        """The entry under ``key``, or None; a corrupt one is deleted (a miss), as the cache
        service does."""
        raw = await self._redis.get(key)
        if raw is None:
            return None
        try:
            return cache_keys.parse_entry(raw)
        except ValueError as e:
            metrics.CACHE_CORRUPT.inc()
            log.warning("cache entry %s is corrupt (%s): deleted", key, e)
            await self._redis.delete(key)
            return None

    async def close(self) -> None:
        await self._redis.aclose()
