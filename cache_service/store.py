"""The exact-match store: finished deterministic completions in Redis/Valkey, with a TTL.

An entry is a serialized ``CacheEntry`` (the chunks to replay and when they were stored), stored under the key from
``services.cache_keys``. Redis errors propagate as ``redis.exceptions.RedisError``; the servicer
turns them into UNAVAILABLE so the gateway serves uncached.
"""

from __future__ import annotations

from collections.abc import Sequence
import time
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from services.cache_keys import KIND_EXACT, exact_key
from services import validation
from services.gen import meshserve_pb2 as pb

# A cache must fail fast: the gateway gives up after a fraction of a second anyway.
SOCKET_TIMEOUT_S = 2.0
CONNECT_TIMEOUT_S = 1.0
FINISHED = frozenset({"stop", "length"})


def connect(url: str) -> aioredis.Redis:
    """A redis.asyncio client that retries a broken connection once, without backoff."""
    return aioredis.from_url(
        url,
        socket_timeout=SOCKET_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        retry=Retry(NoBackoff(), 1),
    )


@dataclass(frozen=True)
class StoreResult:
    stored: bool
    reason: str = ""


def refusal(req: pb.GenerateRequest, chunks: Sequence[pb.GenerateResponse]) -> str:
    """Why this completion must not be cached ('' when it may be)."""
    if req.skip_cache:
        return "skip_cache is set"
    if not validation.is_deterministic(req):
        return "not deterministic (needs temperature 0 or a fixed seed)"
    if not chunks:
        return "no chunks"
    if chunks[-1].finish_reason not in FINISHED:
        return f"not finished (finish_reason {chunks[-1].finish_reason!r})"
    return ""


class ExactStore:
    """Exact-match entries: same tenant and same output-changing fields -> same completion."""

    kind = KIND_EXACT

    def __init__(self, client: aioredis.Redis, ttl_seconds: int, key_prefix: str) -> None:
        self._redis = client
        self._ttl = ttl_seconds
        self._prefix = key_prefix

    def key(self, req: pb.GenerateRequest, tenant: str) -> str:
        return exact_key(req, tenant, self._prefix)

    async def lookup(self, req: pb.GenerateRequest, tenant: str) -> pb.CacheEntry | None:
        """The cached entry of ``req``, or None on a miss."""
        if req.skip_cache or not validation.is_deterministic(req):
            return None
        raw = await self._redis.get(self.key(req, tenant))
        if raw is None:
            return None
        return pb.CacheEntry.FromString(raw)

    async def store(
        self, req: pb.GenerateRequest, tenant: str, chunks: Sequence[pb.GenerateResponse]
    ) -> StoreResult:
        """Stores a finished deterministic completion for ``ttl_seconds``; refuses anything else."""
        reason = refusal(req, chunks)
        if reason:
            return StoreResult(False, reason)
        entry = pb.CacheEntry(stored_at=time.time())
        for chunk in chunks:
            # Per-request identity is not part of the answer; the gateway stamps its own on replay.
            entry.chunks.append(
                pb.GenerateResponse(
                    text=chunk.text,
                    token_ids=chunk.token_ids,
                    finish_reason=chunk.finish_reason,
                    usage=chunk.usage if chunk.HasField("usage") else None,
                    cached=True,
                )
            )
        await self._redis.set(self.key(req, tenant), entry.SerializeToString(), ex=self._ttl)
        return StoreResult(True)

    async def close(self) -> None:
        await self._redis.aclose()
