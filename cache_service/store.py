"""The exact-match store: finished deterministic completions in Redis/Valkey, with a TTL.

An entry is a serialized ``CacheEntry`` (the chunks to replay and when they were stored), stored under the key from
``services.cache_keys``. Redis errors propagate as ``redis.exceptions.RedisError``; the servicer
turns them into UNAVAILABLE so the gateway serves uncached.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import prometheus_client
import redis.asyncio as aioredis

from meshserve.services import validation
from meshserve.services.cache_keys import KIND_EXACT, entry_or_delete, exact_key, store_entry
from meshserve.services.gen import meshserve_pb2 as pb

CORRUPT = prometheus_client.Counter(
    "meshserve_cache_corrupt_entries_total", "Entries that did not parse: deleted and treated as a miss"
)


@dataclass(frozen=True)
class StoreResult:
    stored: bool
    reason: str = ""
    key: str = ""


class ExactStore:
    """Exact-match entries: same tenant and same output-changing fields -> same completion."""

    kind = KIND_EXACT

    def __init__(
        self, client: aioredis.Redis, ttl_seconds: int, key_prefix: str, max_entry_bytes: int = 1 << 20
    ) -> None:
        self._redis = client
        self._ttl = ttl_seconds
        self._prefix = key_prefix
        self._max_entry_bytes = max_entry_bytes

    def key(self, req: pb.GenerateRequest, tenant: str) -> str:
        return exact_key(req, tenant, self._prefix)

    async def lookup(self, req: pb.GenerateRequest, tenant: str) -> pb.CacheEntry | None:
        """The cached entry of ``req``, or None on a miss."""
        if validation.cache_mode(req, validation.CACHE_EXACT) == validation.CACHE_OFF:
            return None
        key = self.key(req, tenant)
        return await self.parse(key, await self._redis.get(key))

    async def parse(self, key: str, raw: bytes | None) -> pb.CacheEntry | None:
        """The entry stored under ``key`` from its bytes; a corrupt one is deleted (a miss)."""
        return await entry_or_delete(self._redis, key, raw, CORRUPT)

    async def store(
        self, req: pb.GenerateRequest, tenant: str, chunks: Sequence[pb.GenerateResponse]
    ) -> StoreResult:
        """Stores a finished deterministic completion for ``ttl_seconds``; refuses anything else."""
        key = self.key(req, tenant)
        reason = await store_entry(self._redis, key, req, chunks, self._ttl, self._max_entry_bytes)
        if reason:
            return StoreResult(False, reason)
        return StoreResult(True, key=key)

    async def close(self) -> None:
        await self._redis.aclose()
