"""The usage ledger: per tenant, the tokens and requests the clients were sent, by how they were
answered (generated, an exact or semantic cache hit, coalesced with an identical request).

What counts is what a client request was sent: each choice's usage when it finished (its last
chunk's), or the tokens it streamed when it did not (a cancelled stream, one that failed
mid-stream: the client was sent no usage, and its prompt is not counted); a request's prompt and
cached prompt tokens once (from its first choice that finished, as OpenAI's ``n`` counts them).
A migrated stream's usage comes once, with its last chunk. A request sent nothing counts nowhere.

Kept twice: Prometheus counters on each gateway (``meshserve_gateway_tenant_*``), and a ledger in
Redis summed across the gateways (one hash per tenant), written off the request's path in
batches; what Redis cannot take yet is kept (merged, bounded by the tenants' count) and written
once it is back.
"""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from dataclasses import dataclass
from typing import Self

import prometheus_client
import redis.asyncio as aioredis
import redis.exceptions

from meshserve.services.gen import meshserve_pb2 as pb

log = logging.getLogger(__name__)

GENERATED = "generated"
ANSWERS = (GENERATED, "exact", "semantic", "coalesced")  # how a choice was answered (its cache_kind)
KINDS = ("requests", "prompt_tokens", "completion_tokens", "cached_prompt_tokens")
RETRY_S = 1.0  # after a failed write, the next one waits this long

TOKENS = prometheus_client.Counter(
    "meshserve_gateway_tenant_tokens_total", "Tokens the clients were sent, by tenant, kind (prompt, completion, "
    "cached_prompt) and how they were answered (generated, exact, semantic, coalesced)",
    ["tenant", "kind", "answered"])
REQUESTS = prometheus_client.Counter(
    "meshserve_gateway_tenant_requests_total", "Client requests answered, by tenant and how (generated, exact, "
    "semantic, coalesced: their first choice's)", ["tenant", "answered"])


@dataclass
class Sent:
    """What one choice of a client request was sent."""

    answered: str = GENERATED
    chunks: int = 0
    tokens: int = 0
    usage: pb.Usage | None = None

    def add(self, chunk: pb.GenerateResponse) -> None:
        if not self.chunks and chunk.cache_kind:
            self.answered = chunk.cache_kind
        self.chunks += 1
        self.tokens += len(chunk.token_ids)
        if chunk.finish_reason and chunk.HasField("usage"):
            self.usage = chunk.usage


@dataclass
class Tally:
    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_prompt_tokens: int = 0

    def __iadd__(self, other: Tally) -> Self:
        for kind in KINDS:
            setattr(self, kind, getattr(self, kind) + getattr(other, kind))
        return self


@dataclass
class Bill:
    """One client request's choices (OpenAI's ``n``; 1 otherwise), as they are sent."""

    choices: list[Sent]

    @classmethod
    def of(cls, n: int) -> Bill:
        return cls([Sent() for _ in range(n)])

    def tallies(self) -> dict[str, Tally]:
        """Its usage by how it was answered (empty when nothing was sent)."""
        if not any(c.chunks for c in self.choices):
            return {}
        out: dict[str, Tally] = defaultdict(Tally)
        for c in self.choices:
            if c.chunks:
                out[c.answered].completion_tokens += c.usage.completion_tokens if c.usage else c.tokens
        first = next((c for c in self.choices if c.usage is not None), None)
        lead = out[(first or next(c for c in self.choices if c.chunks)).answered]
        lead.requests += 1
        if first is not None and first.usage is not None:
            lead.prompt_tokens += first.usage.prompt_tokens
            lead.cached_prompt_tokens += first.usage.cached_prompt_tokens
        return dict(out)

    def tokens(self, prompt_estimate: int) -> int:
        """Tokens it used, as its tenant's limits count them: its prompt (``prompt_estimate`` when no
        choice finished: a cancelled request's prompt was read all the same) and its completions;
        nothing when it was sent nothing."""
        tallies = self.tallies().values()
        if not tallies:
            return 0
        prompt = sum(t.prompt_tokens for t in tallies)
        finished = any(c.usage is not None for c in self.choices)
        return (prompt if finished else prompt_estimate) + sum(t.completion_tokens for t in tallies)


class Ledger:
    """Counts bills per tenant; ``redis``: the mesh's, where the gateways' counts are summed
    (None: the counters alone)."""

    def __init__(self, redis: aioredis.Redis | None, key_prefix: str, timeout_s: float) -> None:
        self._redis = redis
        self._prefix = key_prefix
        self._timeout_s = timeout_s
        self._pending: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))  # tenant -> field -> n
        self._wake = asyncio.Event()
        self._writer: asyncio.Task[None] | None = None
        self._closing = False
        self._own: dict[str, dict[str, Tally]] = defaultdict(lambda: defaultdict(Tally))  # this gateway's

    def start(self) -> None:
        if self._redis is not None:
            self._writer = asyncio.get_running_loop().create_task(self._write_forever())

    def add(self, tenant: str, bill: Bill) -> None:
        label = tenant or "-"
        for answered, t in bill.tallies().items():
            self._own[tenant][answered] += t
            if t.requests:
                REQUESTS.labels(label, answered).inc(t.requests)
            for kind in ("prompt", "completion", "cached_prompt"):
                if n := getattr(t, f"{kind}_tokens"):
                    TOKENS.labels(label, kind, answered).inc(n)
            if self._redis is not None:
                fields = self._pending[tenant]
                for kind in KINDS:
                    if n := getattr(t, kind):
                        fields[f"{answered}:{kind}"] += n
                self._wake.set()

    async def _write_forever(self) -> None:
        while not self._closing:
            await self._wake.wait()
            self._wake.clear()
            if not await self.flush() and not self._closing:
                await asyncio.sleep(RETRY_S)

    async def flush(self) -> bool:
        """Writes what is pending in one transaction; False (kept for the next) when Redis fails."""
        if self._redis is None or not self._pending:
            return True
        pending, self._pending = self._pending, defaultdict(lambda: defaultdict(int))
        try:
            async with asyncio.timeout(self._timeout_s):
                async with self._redis.pipeline(transaction=True) as pipe:
                    for tenant, fields in pending.items():
                        for name, n in fields.items():
                            pipe.hincrby(self._key(tenant), name, n)
                    pipe.sadd(self._prefix + "tenants", *pending)
                    await pipe.execute()
            return True
        except (redis.exceptions.RedisError, OSError, TimeoutError) as e:
            log.warning("usage ledger: Redis did not take a write (%s); kept for the next", type(e).__name__)
            for tenant, fields in pending.items():
                for name, n in fields.items():
                    self._pending[tenant][name] += n
            self._wake.set()
            return False

    @property
    def shared(self) -> bool:
        return self._redis is not None

    async def read(self) -> dict[str, dict[str, Tally]]:
        """Every tenant's ledger: tenant -> how answered -> tally; summed across the gateways in
        Redis, or this gateway's own since it started when it has none. Redis errors propagate."""
        if self._redis is None:
            return {tenant: dict(rows) for tenant, rows in self._own.items()}
        async with asyncio.timeout(self._timeout_s * 10):
            tenants = sorted(t.decode() for t in await self._redis.smembers(self._prefix + "tenants"))
            async with self._redis.pipeline(transaction=False) as pipe:
                for tenant in tenants:
                    pipe.hgetall(self._key(tenant))
                hashes = await pipe.execute()
        out: dict[str, dict[str, Tally]] = {}
        for tenant, fields in zip(tenants, hashes, strict=True):
            rows: dict[str, Tally] = defaultdict(Tally)
            for name, n in fields.items():
                answered, _, kind = name.decode().partition(":")
                if kind in KINDS:
                    setattr(rows[answered], kind, int(n))
            out[tenant] = dict(rows)
        return out

    def _key(self, tenant: str) -> str:
        return f"{self._prefix}ledger:{tenant}"

    async def close(self) -> None:
        """Writes what is pending (a write under way is let finish: a pipeline cancelled mid-way
        would leave its connection to the pool's close)."""
        if self._writer is not None:
            self._closing = True
            self._wake.set()
            await asyncio.wait([self._writer], timeout=2 * self._timeout_s)
            self._writer.cancel()
            await asyncio.gather(self._writer, return_exceptions=True)
        await self.flush()
