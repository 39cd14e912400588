"""The semantic store: an earlier answer to a question asked in other words.

What is compared by meaning is only the request's last user message (or its prompt). Everything
else is its *scope* and must match exactly: tenant, model, every sampling field, the system
prompt and the conversation before the last message (``scope_of``). Within a scope, a stored
entry answers a new request when ``cache_service.matcher`` says so (the guards, and the
embeddings' cosine against the threshold for how the two texts' content words differ).

Redis holds everything, so any replica can rebuild it: per entry a hash
``{prefix}semvec:<digest>`` (scope, text, embedding, the exact entry's key) with the entry's
TTL, and a stream ``{prefix}semlog`` naming each new hash. Each cache-service replica keeps an
in-memory ANN index (usearch) of the hashes: rebuilt by a SCAN at start (and after Redis comes
back), kept in step by reading the stream, so an entry one replica stores is found by all.
The answer itself is the exact entry (``cache_service.store``); an index entry whose hash or
answer has expired is dropped when a lookup meets it.

A store is indexed off the caller's path, its text embedded in the embedder's next batch with
whatever else is waiting, and a lookup in a scope with entries still being indexed waits for them
(within its budget): an answer stored just before its paraphrase is asked is found.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import prometheus_client
import redis.asyncio as aioredis
import redis.exceptions
from usearch.index import Index

from meshserve.cache_service.embedder import Embedder
from meshserve.cache_service.matcher import Matcher
from meshserve.services.cache_keys import canonical
from meshserve.services.gen import meshserve_pb2 as pb

log = logging.getLogger(__name__)

KIND_SEMANTIC = "semantic"
NEIGHBOURS = 16           # nearest entries looked at per lookup (then filtered by scope)
MAX_PENDING_STORES = 4096  # entries being embedded and indexed; beyond, a store is skipped (counted)
MAX_PENDING_EMBEDDINGS = 512  # texts being embedded; beyond, a lookup is a miss without asking
SCAN_BATCH = 500
FOLLOW_BLOCK_MS = 1000
RETRY_S = (0.2, 0.5, 1.0, 2.0, 5.0)
CLOSE_TIMEOUT_S = 2.0

REJECTED = prometheus_client.Counter(
    "meshserve_cache_semantic_rejected_total",
    "Entries past the lowest threshold but refused by a guard or their own threshold (similarity)", ["guard"],
)
SKIPPED = prometheus_client.Counter(
    "meshserve_cache_semantic_skipped_total",
    "Requests not looked up or stored by meaning, by reason (too_long, not_user, backlog, slow)", ["reason"],
)
SIMILARITY = prometheus_client.Histogram(
    "meshserve_cache_semantic_similarity", "Cosine similarity of each semantic hit",
    buckets=[0.8, 0.85, 0.88, 0.9, 0.92, 0.94, 0.96, 0.98, 0.99, 1.0],
)
EMBED_SECONDS = prometheus_client.Histogram(
    "meshserve_cache_embed_seconds", "Time a lookup or store waited for its embedding (batching included)",
    buckets=[0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28],
)
INDEX_ENTRIES = prometheus_client.Gauge("meshserve_cache_semantic_index_entries", "Entries in this replica's ANN index")


def scope_of(req: pb.GenerateRequest, tenant: str) -> tuple[str, str] | None:
    """(scope digest, text compared by meaning) of ``req``; None if it has no such text (a chat
    whose last message is not the user's)."""
    scope = pb.GenerateRequest()
    scope.CopyFrom(req)
    if scope.messages:
        last = scope.messages[-1]
        if last.role != "user":
            return None
        text, last.content = last.content, ""
    else:
        text, scope.prompt = scope.prompt, ""
    if not text.strip():
        return None
    return hashlib.sha256(canonical(scope, tenant)).hexdigest(), text


@dataclass(frozen=True)
class _Entry:
    record: str      # the Redis hash
    scope: str
    text: str
    exact: str       # the exact entry's key (the answer)
    expires: float   # monotonic seconds


@dataclass(frozen=True)
class Match:
    exact: str
    similarity: float


class SemanticIndex:
    """The ANN index of one replica: entry id -> vector, with each entry's scope and text."""

    def __init__(self, dim: int, max_entries: int) -> None:
        self._index = Index(ndim=dim, metric="cos", dtype="f32")
        self._max = max_entries
        self._entries: OrderedDict[int, _Entry] = OrderedDict()  # oldest first
        self._ids: dict[str, int] = {}
        self._next = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, record: str) -> bool:
        return record in self._ids

    def add(self, entry: _Entry, vector: np.ndarray) -> None:
        if entry.record in self._ids:
            return
        while len(self._entries) >= self._max:
            self.remove(next(iter(self._entries.values())).record)
        key, self._next = self._next, self._next + 1
        self._index.add(key, vector)
        self._entries[key] = entry
        self._ids[entry.record] = key
        INDEX_ENTRIES.set(len(self._entries))

    def remove(self, record: str) -> None:
        key = self._ids.pop(record, None)
        if key is not None:
            del self._entries[key]
            self._index.remove(key)
            INDEX_ENTRIES.set(len(self._entries))

    def clear(self) -> None:
        self._index.reset()
        self._entries.clear()
        self._ids.clear()
        INDEX_ENTRIES.set(0)

    def nearest(self, vector: np.ndarray, scope: str, now: float) -> list[tuple[float, _Entry]]:
        """Live entries of ``scope`` among the nearest, most similar first."""
        if not self._entries:
            return []
        found = self._index.search(vector, min(NEIGHBOURS, len(self._entries)))
        out = []
        for key, distance in zip(found.keys, found.distances, strict=True):
            entry = self._entries.get(int(key))
            if entry is None or entry.scope != scope:
                continue
            if entry.expires <= now:
                self.remove(entry.record)
                continue
            out.append((1.0 - float(distance), entry))
        return out


class SemanticStore:
    """Lookups and stores by meaning, over Redis and this replica's index."""

    kind = KIND_SEMANTIC

    def __init__(
        self, client: aioredis.Redis, follower: aioredis.Redis, embedder: Embedder, ttl_seconds: int,
        key_prefix: str, matcher: Matcher, max_entries: int, budget_s: float = 0.05,
    ) -> None:
        self._redis = client
        self._follower = follower  # its own connection: the stream read blocks
        self._embedder = embedder
        self._ttl = ttl_seconds
        self._prefix = key_prefix
        self._log_key = f"{key_prefix}semlog"
        self.matcher = matcher
        self._budget_s = budget_s  # a lookup's wait for its embedding, at most
        self._max_entries = max_entries
        self.index = SemanticIndex(embedder.dim, max_entries)
        self._vectors: OrderedDict[str, np.ndarray] = OrderedDict()  # recent texts' embeddings
        self._embedding: dict[str, asyncio.Future[np.ndarray]] = {}  # texts being embedded
        self._task: asyncio.Task[None] | None = None
        self._stores: set[asyncio.Task[None]] = set()  # entries being embedded and indexed
        self._indexing: dict[str, int] = {}  # scope -> its entries being indexed
        self._indexed = asyncio.Condition()  # notified as each entry is indexed
        self._closing = False

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow(), name="semantic index")

    async def close(self) -> None:
        # Cancelled inside a Redis call, redis-py may raise its own error instead of
        # CancelledError; the loops then see _closing and return rather than retry forever.
        self._closing = True
        tasks = [t for t in (self._task, *self._stores) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=CLOSE_TIMEOUT_S)
        await asyncio.wait_for(self._follower.aclose(), CLOSE_TIMEOUT_S)
        self._embedder.close()

    # -- requests ---------------------------------------------------------------------------------

    def _fits(self, text: str) -> bool:
        if self._embedder.fits(text):
            return True
        SKIPPED.labels("too_long").inc()
        return False

    async def _vector(self, text: str, budget_s: float | None = None) -> np.ndarray | None:
        """The embedding of ``text``; None if it is not ready within ``budget_s``. One embedding
        per text in flight: a lookup that gives up leaves it running, and its request's store
        (or an identical lookup) takes it when it lands instead of embedding the text again."""
        vector = self._vectors.get(text)
        if vector is not None:
            return vector
        pending = self._embedding.get(text)
        if pending is None:
            if budget_s is not None and len(self._embedding) >= MAX_PENDING_EMBEDDINGS:
                SKIPPED.labels("backlog").inc()
                return None
            behind = budget_s is not None and self._embedder.wait_s() > budget_s
            pending = self._embedding[text] = asyncio.ensure_future(self._embedder.embed(text))
            pending.add_done_callback(lambda done: self._landed(text, done))
            if behind:
                # The texts ahead would take longer than the budget: a miss now, not after waiting
                # the budget out (the request's store takes the embedding when it lands).
                SKIPPED.labels("slow").inc()
                return None
        started = time.perf_counter()
        try:
            vector = await asyncio.wait_for(asyncio.shield(pending), budget_s)
        except TimeoutError:
            SKIPPED.labels("slow").inc()  # the embedder is behind: a miss now beats a late answer
            return None
        EMBED_SECONDS.observe(time.perf_counter() - started)
        return vector

    def _landed(self, text: str, done: asyncio.Future[np.ndarray]) -> None:
        """Keeps a finished embedding for the text's next lookup or store (the 1,024 latest)."""
        del self._embedding[text]
        if done.cancelled() or done.exception() is not None:
            return
        self._vectors[text] = done.result()
        if len(self._vectors) > 1024:
            self._vectors.popitem(last=False)

    async def lookup(self, req: pb.GenerateRequest, tenant: str) -> tuple[bytes, Match] | None:
        """The stored answer (raw exact entry) of the most similar live entry that passes every
        guard, and how it matched; None on a miss."""
        view = scope_of(req, tenant)
        if view is None:
            SKIPPED.labels("not_user").inc()
            return None
        scope, text = view
        if not self._fits(text) or not (len(self.index) or self._indexing.get(scope)):
            return None
        deadline = time.perf_counter() + self._budget_s
        vector = await self._vector(text, self._budget_s)
        if vector is None or not await self._caught_up(scope, deadline):
            return None
        for similarity, entry in self.index.nearest(vector, scope, time.monotonic()):
            if similarity < self.matcher.threshold:
                break
            refusal = self.matcher.refusal(text, entry.text, similarity)
            if refusal:
                REJECTED.labels(refusal).inc()
                continue
            raw = await self._redis.get(entry.exact)
            if raw is None:  # the answer expired or was evicted
                self.index.remove(entry.record)
                continue
            SIMILARITY.observe(similarity)
            return raw, Match(entry.exact, similarity)
        return None

    async def _caught_up(self, scope: str, deadline: float) -> bool:
        """Waits, until ``deadline`` (perf_counter), for the stores of ``scope`` queued or being
        indexed; False if some are still not indexed then (the lookup is then a miss, counted)."""
        if not self._indexing.get(scope):
            return True
        async with self._indexed:
            try:
                await asyncio.wait_for(self._indexed.wait_for(lambda: not self._indexing.get(scope)),
                                       max(0.0, deadline - time.perf_counter()))
            except TimeoutError:
                SKIPPED.labels("slow").inc()
                return False
        return True

    def store_later(self, req: pb.GenerateRequest, tenant: str, exact_key: str) -> None:
        """Starts making ``exact_key`` findable by meaning: the caller (the gateway's store) does
        not wait for the embedding, which joins the embedder's next batch with the lookups
        arriving meanwhile; past MAX_PENDING_STORES entries being indexed, it is skipped (counted)."""
        view = scope_of(req, tenant)
        if view is None:
            return
        if len(self._stores) >= MAX_PENDING_STORES:
            SKIPPED.labels("backlog").inc()
            return
        scope = view[0]
        self._indexing[scope] = self._indexing.get(scope, 0) + 1
        task = asyncio.create_task(self._index(req, tenant, exact_key, scope), name="semantic store")
        self._stores.add(task)
        task.add_done_callback(self._stores.discard)

    async def _index(self, req: pb.GenerateRequest, tenant: str, exact_key: str, scope: str) -> None:
        try:
            await self.store(req, tenant, exact_key)
        except redis.exceptions.RedisError as e:
            log.debug("semantic store of %s failed: %s", exact_key, e)
        except Exception:
            if not self._closing:
                log.exception("semantic store of %s failed", exact_key)
        finally:
            if self._indexing[scope] == 1:
                del self._indexing[scope]
            else:
                self._indexing[scope] -= 1
            async with self._indexed:
                self._indexed.notify_all()

    async def store(self, req: pb.GenerateRequest, tenant: str, exact_key: str) -> None:
        """Makes the stored exact entry ``exact_key`` findable by meaning, on every replica."""
        view = scope_of(req, tenant)
        if view is None:
            return
        scope, text = view
        vector = await self._vector(text) if self._fits(text) else None
        if vector is None:
            return
        record = f"{self._prefix}semvec:{exact_key.rsplit(':', 1)[-1]}"
        fields = {"scope": scope, "text": text, "exact": exact_key, "vector": vector.astype(np.float32).tobytes()}
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(record, mapping=fields)
            pipe.expire(record, self._ttl)
            pipe.xadd(self._log_key, {"record": record}, maxlen=self._max_entries, approximate=True)
            await pipe.execute()
        self.index.add(_Entry(record, scope, text, exact_key, time.monotonic() + self._ttl), vector)

    # -- keeping the index in step with Redis ------------------------------------------------------

    def _entry(self, record: str, fields: dict[bytes, bytes], ttl_s: float) -> tuple[_Entry, np.ndarray] | None:
        try:
            vector = np.frombuffer(fields[b"vector"], dtype=np.float32)
            if vector.shape != (self._embedder.dim,):
                raise ValueError(f"vector of {vector.shape}")
            entry = _Entry(record, fields[b"scope"].decode(), fields[b"text"].decode(),
                           fields[b"exact"].decode(), time.monotonic() + ttl_s)
        except (KeyError, ValueError, UnicodeDecodeError) as e:
            log.warning("semantic record %s is corrupt (%s): ignored", record, e)
            return None
        return entry, vector

    async def _load(self, records: list[str]) -> None:
        """Adds these hashes (names) to the index, with their remaining TTL."""
        for i in range(0, len(records), SCAN_BATCH):
            batch = [r for r in records[i:i + SCAN_BATCH] if r not in self.index]
            if not batch:
                continue
            async with self._follower.pipeline(transaction=False) as pipe:
                for record in batch:
                    pipe.hgetall(record)
                    pipe.ttl(record)
                replies = await pipe.execute()
            for record, fields, ttl in zip(batch, replies[0::2], replies[1::2], strict=True):
                if fields and ttl != -2:
                    parsed = self._entry(record, fields, ttl if ttl > 0 else self._ttl)
                    if parsed is not None:
                        self.index.add(*parsed)

    async def _rebuild(self) -> str:
        """Reloads the index from Redis; returns the stream position to follow from."""
        last = await self._follower.xrevrange(self._log_key, count=1)
        position = last[0][0].decode() if last else "0-0"
        self.index.clear()
        records = [key.decode() async for key in self._follower.scan_iter(match=f"{self._prefix}semvec:*", count=1000)]
        await self._load(records)
        log.info("semantic index rebuilt from Redis: %d entries", len(self.index))
        return position

    async def _follow(self) -> None:
        position: str | None = None
        failures = 0
        while not self._closing:
            try:
                if position is None:
                    position = await self._rebuild()
                replies = await self._follower.xread({self._log_key: position}, block=FOLLOW_BLOCK_MS, count=SCAN_BATCH)
                for _, messages in replies or []:
                    position = messages[-1][0].decode()
                    await self._load([fields[b"record"].decode() for _, fields in messages])
                failures = 0
            except (redis.exceptions.RedisError, OSError) as e:
                if self._closing:
                    return
                # Redis went away: rebuild when it is back (it may have lost or changed its data).
                delay = RETRY_S[min(failures, len(RETRY_S) - 1)]
                if failures == 0:
                    log.warning("semantic index: Redis unavailable (%s); rebuilding when it is back", e)
                failures += 1
                position = None
                await asyncio.sleep(delay)
