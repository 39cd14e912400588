"""The cache gRPC service against a real Valkey and the real embedding model: exact and semantic
hits, scopes and tenants, replicas in step through Redis, refusals, TTL, bad entries, Redis down."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import grpc
import pytest
import redis.asyncio as aioredis

from meshserve.services import config
from meshserve.services.cache_keys import exact_key, store_entry
from meshserve.services.config import CacheConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from tests.conftest import free_port
from tests.integration.helpers import metric_sum, scrape, wait_until

TTL = 120


@pytest.fixture
def prefix() -> str:
    return f"test:{uuid.uuid4().hex}:"


class CacheReplica:
    """A cache service process (``meshserve serve cache``): its stub's calls, and its metrics."""

    def __init__(self, channel: grpc.aio.Channel, metrics_url: str) -> None:
        self.stub = pb_grpc.CacheStub(channel)
        self.Lookup = self.stub.Lookup
        self.Store = self.stub.Store
        self._metrics_url = metrics_url

    def metric(self, name: str, **labels: str) -> float:
        return metric_sum(scrape(self._metrics_url), name, **labels)


Replica = Callable[..., Awaitable[CacheReplica]]


@pytest.fixture
async def replica(redis_url: str, prefix: str, tmp_path: Path) -> AsyncIterator[Replica]:
    """Starts cache service processes on the same Redis and key prefix (replicas of one cache).
    Processes, as `meshserve up` runs them: the embedding model runs in the service, not here."""
    started: list[tuple[subprocess.Popen[bytes], grpc.aio.Channel]] = []

    async def make(**fields: object) -> CacheReplica:
        ready = tmp_path / f"cache-{len(started)}.ready"
        settings: dict[str, object] = {"redis_url": redis_url, "ttl_seconds": TTL, "key_prefix": prefix, **fields}
        cfg = CacheConfig(port=free_port(), metrics_port=0, grace_seconds=1, ready_file=str(ready), **settings)
        log = open(tmp_path / f"cache-{len(started)}.log", "wb")  # noqa: SIM115 (the process writes it)
        proc = subprocess.Popen([sys.executable, "-m", "meshserve.commands.cli", "serve", "cache", *config.to_argv(cfg)],
                                stdout=log, stderr=subprocess.STDOUT)
        channel = insecure_channel(f"127.0.0.1:{cfg.port}")
        started.append((proc, channel))
        await wait_until(lambda: ready.exists() or proc.poll() is not None, 120, "the cache service to be ready")
        assert proc.poll() is None, (tmp_path / f"cache-{len(started) - 1}.log").read_text()[-2000:]
        return CacheReplica(channel, f"http://127.0.0.1:{ready.read_text().split()[1]}/metrics")

    try:
        yield make
    finally:
        for proc, channel in started:
            await channel.close()
            proc.terminate()
        for proc, _ in started:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()


@pytest.fixture
async def cache(replica: Replica) -> CacheReplica:
    # A generous embedding budget: a loaded test machine must not turn lookups into misses.
    return await replica(semantic_budget_s=10.0)


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.from_url(redis_url)
    try:
        yield client
    finally:
        await client.aclose()


def greedy(prompt: str = "Hello") -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt=prompt, max_tokens=3, temperature=0, request_id="r1")


def chunks(finish: str = "length") -> list[pb.GenerateResponse]:
    return [
        pb.GenerateResponse(request_id="r1", text="a", token_ids=[1], worker="w1"),
        pb.GenerateResponse(request_id="r1", text="b", token_ids=[2], worker="w1"),
        pb.GenerateResponse(
            request_id="r1",
            text="c",
            token_ids=[3],
            worker="w1",
            finish_reason=finish,
            usage=pb.Usage(prompt_tokens=2, completion_tokens=3),
        ),
    ]


async def test_store_then_lookup_hits_with_identical_chunks(cache: CacheReplica) -> None:
    miss = await cache.Lookup(pb.LookupRequest(request=greedy(), tenant="t"), timeout=10)
    assert not miss.hit and not miss.chunks

    stored = await cache.Store(pb.StoreRequest(request=greedy(), tenant="t", chunks=chunks()), timeout=10)
    assert stored.stored, stored.reason

    other_id = greedy()
    other_id.request_id = "r2"
    hit = await cache.Lookup(pb.LookupRequest(request=other_id, tenant="t"), timeout=10)
    assert hit.hit and hit.kind == "exact"
    assert [(c.text, list(c.token_ids), c.finish_reason) for c in hit.chunks] == [
        ("a", [1], ""),
        ("b", [2], ""),
        ("c", [3], "length"),
    ]
    assert hit.chunks[-1].usage == pb.Usage(prompt_tokens=2, completion_tokens=3)
    assert all(c.cached and not c.worker and not c.request_id for c in hit.chunks)

    # Another tenant or another prompt does not see the entry.
    assert not (await cache.Lookup(pb.LookupRequest(request=greedy(), tenant="u"), timeout=10)).hit
    assert not (await cache.Lookup(pb.LookupRequest(request=greedy("Bye"), tenant="t"), timeout=10)).hit


async def test_entry_has_the_configured_ttl(
    cache: CacheReplica, redis_client: aioredis.Redis, prefix: str
) -> None:
    assert (await cache.Store(pb.StoreRequest(request=greedy(), tenant="t", chunks=chunks("stop")), timeout=10)).stored
    ttl = await redis_client.ttl(exact_key(greedy(), "t", prefix))
    assert 0 < ttl <= TTL


async def test_non_deterministic_is_not_stored(
    cache: CacheReplica, redis_client: aioredis.Redis, prefix: str
) -> None:
    sampled = pb.GenerateRequest(prompt="Hello", max_tokens=3, temperature=0.8)
    result = await cache.Store(pb.StoreRequest(request=sampled, tenant="t", chunks=chunks()), timeout=10)
    assert not result.stored and "deterministic" in result.reason
    assert await redis_client.keys(prefix + "*") == []
    assert not (await cache.Lookup(pb.LookupRequest(request=sampled, tenant="t"), timeout=10)).hit


@pytest.mark.parametrize("finish", ["", "abort"])
async def test_unfinished_or_aborted_is_not_stored(
    cache: CacheReplica, redis_client: aioredis.Redis, prefix: str, finish: str
) -> None:
    result = await cache.Store(pb.StoreRequest(request=greedy(), tenant="t", chunks=chunks(finish)), timeout=10)
    assert not result.stored and "not finished" in result.reason
    assert await redis_client.keys(prefix + "*") == []


async def test_seeded_sampling_is_cached(cache: CacheReplica) -> None:
    seeded = pb.GenerateRequest(prompt="Hello", max_tokens=3, temperature=0.8, seed=42)
    assert (await cache.Store(pb.StoreRequest(request=seeded, tenant="t", chunks=chunks()), timeout=10)).stored
    assert (await cache.Lookup(pb.LookupRequest(request=seeded, tenant="t"), timeout=10)).hit


async def test_redis_unreachable_is_unavailable(replica: Replica) -> None:
    stub = await replica(redis_url=f"redis://127.0.0.1:{free_port()}/0")
    for call in (
        stub.Lookup(pb.LookupRequest(request=greedy(), tenant="t"), timeout=10),
        stub.Store(pb.StoreRequest(request=greedy(), tenant="t", chunks=chunks()), timeout=10),
    ):
        started = time.monotonic()
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "Redis" in err.value.details()
        assert time.monotonic() - started < 5


# -- semantic ------------------------------------------------------------------------------------


def ask(text: str, chat: bool = False, system: str = "", **fields: object) -> pb.GenerateRequest:
    req = pb.GenerateRequest(max_tokens=3, temperature=0, **fields)
    if chat:
        if system:
            req.messages.add(role="system", content=system)
        req.messages.add(role="user", content=text)
    else:
        req.prompt = text
    return req


async def lookup(stub: CacheReplica, req: pb.GenerateRequest, tenant: str = "t", mode: str = "") -> pb.LookupResponse:
    return await stub.Lookup(pb.LookupRequest(request=req, tenant=tenant, mode=mode), timeout=10)


async def store(stub: CacheReplica, req: pb.GenerateRequest, tenant: str = "t") -> None:
    assert (await stub.Store(pb.StoreRequest(request=req, tenant=tenant, chunks=chunks("stop")), timeout=10)).stored


async def until_hit(stub: CacheReplica, req: pb.GenerateRequest, tenant: str = "t") -> pb.LookupResponse:
    """The lookup, once it hits: an entry is indexed by meaning just after its Store returns."""
    async with asyncio.timeout(10):
        while not (resp := await lookup(stub, req, tenant)).hit:
            await asyncio.sleep(0.02)
    return resp


@pytest.mark.parametrize("chat", [False, True])
async def test_a_paraphrase_is_a_semantic_hit_with_the_stored_answer(
    cache: CacheReplica, redis_client: aioredis.Redis, prefix: str, chat: bool
) -> None:
    await store(cache, ask("What is the capital of France?", chat, system="Be brief."))
    hit = await until_hit(cache, ask("what's the capital of france?", chat, system="Be brief."))
    assert hit.hit and hit.kind == "semantic" and 0.9 <= hit.similarity < 1.0
    assert "".join(c.text for c in hit.chunks) == "abc" and hit.chunks[-1].finish_reason == "stop"
    # In Redis: the exact entry and, beside it, the record the semantic index is built from.
    records = await redis_client.keys(prefix + "semvec:*")
    assert len(records) == 1
    assert (await redis_client.hget(records[0], "text")) == b"What is the capital of France?"
    assert len(await redis_client.hget(records[0], "vector")) == 384 * 4


async def test_an_entry_a_gateway_stored_itself_is_indexed_by_meaning_only(
    cache: CacheReplica, redis_client: aioredis.Redis, prefix: str
) -> None:
    """A gateway with --redis-url writes the exact entry and sends the request alone: the cache
    service indexes it (a semantic hit follows) and writes no entry of its own."""
    question = ask("What is the capital of France?")
    key = exact_key(question, "t", prefix)
    assert not await store_entry(redis_client, key, question, chunks("stop"), TTL, 1 << 20)  # as the gateway does
    sets = (await redis_client.info("commandstats"))["cmdstat_set"]["calls"]
    resp = await cache.Store(pb.StoreRequest(request=question, tenant="t", index_only=True), timeout=10)
    assert resp.stored
    hit = await until_hit(cache, ask("what's the capital of france?"))
    assert hit.kind == "semantic" and "".join(c.text for c in hit.chunks) == "abc"
    assert (await redis_client.hget((await redis_client.keys(prefix + "semvec:*"))[0], "exact")) == key.encode()
    assert (await redis_client.info("commandstats"))["cmdstat_set"]["calls"] == sets  # no SET of its own
    # A request that may not be cached is not indexed either, and says why.
    sampled = ask("What is the capital of Spain?")
    sampled.temperature = 0.8
    refused = await cache.Store(pb.StoreRequest(request=sampled, tenant="t", index_only=True), timeout=10)
    assert not refused.stored and "not deterministic" in refused.reason
    assert cache.metric("meshserve_cache_index_requests_total", result="queued") == 1
    assert cache.metric("meshserve_cache_index_requests_total", result="refused") == 1


async def test_the_same_words_in_another_scope_never_hit(cache: CacheReplica) -> None:
    question = "What is the capital of France?"
    await store(cache, ask(question, chat=True, system="Be brief."))
    paraphrase = "what's the capital of france?"
    await until_hit(cache, ask(paraphrase, chat=True, system="Be brief."))  # indexed
    for other, tenant in [
        (ask(paraphrase, chat=True, system="Be brief."), "another-tenant"),
        (ask(paraphrase, chat=True, system="Answer in French."), "t"),      # another system prompt
        (ask(paraphrase, chat=True, system="Be brief.", seed=3), "t"),      # another sampling field
        (ask(paraphrase, chat=False), "t"),                                 # a prompt, not a chat
    ]:
        assert not (await lookup(cache, other, tenant)).hit
    assert not (await lookup(cache, ask(paraphrase, chat=True, system="Be brief."), mode="exact")).hit
    assert not (await lookup(cache, ask(paraphrase, chat=True, system="Be brief.", cache="off"))).hit


async def test_a_near_miss_is_refused_by_its_guard(cache: CacheReplica) -> None:
    # Cosine 0.953 (past the 0.90 threshold): only the negation guard tells them apart.
    await store(cache, ask("Give me a pasta recipe with garlic."))
    await until_hit(cache, ask("Please give me a pasta recipe with garlic"))  # indexed
    refused = cache.metric("meshserve_cache_semantic_rejected_total", guard="negation")
    assert not (await lookup(cache, ask("Give me a pasta recipe without garlic."))).hit
    assert cache.metric("meshserve_cache_semantic_rejected_total", guard="negation") == refused + 1


async def test_a_prompt_too_long_to_embed_is_cached_exactly_only(
    cache: CacheReplica, redis_client: aioredis.Redis, prefix: str
) -> None:
    long_prompt = "Summarise this text: " + "the river runs to the sea " * 60
    skipped = cache.metric("meshserve_cache_semantic_skipped_total", reason="too_long")
    await store(cache, ask(long_prompt))
    async with asyncio.timeout(10):  # the store's indexing, just after it returned, skips it
        while cache.metric("meshserve_cache_semantic_skipped_total", reason="too_long") == skipped:
            await asyncio.sleep(0.02)
    assert await redis_client.keys(prefix + "semvec:*") == []
    assert not (await lookup(cache, ask(long_prompt.replace("Summarise", "Summarize")))).hit
    assert (await lookup(cache, ask(long_prompt))).kind == "exact"
    assert cache.metric("meshserve_cache_semantic_skipped_total", reason="too_long") == skipped + 2


async def test_replicas_share_entries_through_redis(replica: Replica) -> None:
    a, b = await replica(semantic_budget_s=10.0), await replica(semantic_budget_s=10.0)
    await store(a, ask("How do I reverse a list in Python?"))
    paraphrase = ask("how can I reverse a Python list")

    async def found(stub: CacheReplica) -> None:
        async with asyncio.timeout(10):
            while not (await lookup(stub, paraphrase)).hit:  # b follows the stream: soon, not at once
                await asyncio.sleep(0.02)

    await found(a)
    await found(b)
    late = await replica(semantic_budget_s=10.0)  # started after the store: rebuilt from Redis
    await found(late)


async def test_lookups_under_load_share_embedding_batches(cache: CacheReplica) -> None:
    await store(cache, ask("What is the population of Paris?"))
    await until_hit(cache, ask("what is the population of Paris?"))  # the index is not empty
    batches, texts = cache.metric("meshserve_cache_embed_batches_total"), cache.metric("meshserve_cache_embedded_texts_total")
    timed = cache.metric("meshserve_cache_embed_batch_seconds_count")
    await asyncio.gather(*(lookup(cache, ask(f"What is the population of city number {i}?")) for i in range(40)))
    assert cache.metric("meshserve_cache_embedded_texts_total") - texts == 40
    assert cache.metric("meshserve_cache_embed_batches_total") - batches < 40
    # Each call of the model timed once (its wall time: how long the embedder had a CPU for it).
    calls = cache.metric("meshserve_cache_embed_batches_total") - batches
    assert cache.metric("meshserve_cache_embed_batch_seconds_count") - timed == calls


async def test_a_lookup_does_not_wait_past_its_budget_for_a_busy_embedder(replica: Replica) -> None:
    patient, hasty = await replica(semantic_budget_s=10.0), await replica(semantic_budget_s=1e-6)
    await store(patient, ask("How many legs does a spider have?"))
    paraphrase = ask("how many legs does a spider have")
    await until_hit(patient, paraphrase)
    slow = hasty.metric("meshserve_cache_semantic_skipped_total", reason="slow")
    await until_hit(hasty, ask("How many legs does a spider have?"))  # exact: no embedding needed
    assert not (await lookup(hasty, paraphrase)).hit
    assert hasty.metric("meshserve_cache_semantic_skipped_total", reason="slow") == slow + 1


async def test_a_lookup_that_gives_up_on_its_embedding_leaves_it_to_the_store(replica: Replica) -> None:
    """The embedding a lookup stopped waiting for keeps running, and the request's store takes it:
    the model embeds the text once (its own count of texts), not once per call."""
    hasty = await replica(semantic_budget_s=0.001)
    await store(hasty, ask("How many legs does a spider have?"))  # an index to look up in
    await wait_until(lambda: hasty.metric("meshserve_cache_semantic_index_entries") == 1, 10, "the first entry")
    texts = hasty.metric("meshserve_cache_embedded_texts_total")
    question = ask("What is the boiling point of water at sea level?")
    assert not (await lookup(hasty, question)).hit
    await store(hasty, question)
    await wait_until(lambda: hasty.metric("meshserve_cache_semantic_index_entries") == 2, 10, "the second entry")
    assert hasty.metric("meshserve_cache_embedded_texts_total") == texts + 1


# Paraphrases the matching rule answers by a wide margin: a miss among them is a lost hit. Two
# bursts of different texts: the second must not find its embeddings made by the first.
BURSTS = [[
    ("What is the capital of Portugal?", "what's the capital of portugal?"),
    ("How many legs does an insect have?", "How many legs does an insect have"),
    ("How do I boil an egg?", "how do I boil an egg"),
    ("What is the tallest tree species?", "Which tree species is the tallest?"),
    ("How do I sort a list in Python?", "How can I sort a list in Python?"),
    ("Who wrote The Odyssey?", "who wrote the odyssey"),
    ("What causes ocean tides?", "What causes the tides in the ocean?"),
    ("How do I make a paper crane?", "how do i make a paper crane?"),
    ("What is the boiling point of water?", "What's the boiling point of water?"),
    ("How do I clear my terminal screen?", "How can I clear my terminal screen?"),
    ("Why do cats sleep so much?", "why do cats sleep so much"),
    ("What is a haiku poem?", "What is a haiku poem"),
    ("How do I fold a shirt neatly?", "How can I fold a shirt neatly?"),
    ("What is the speed of sound in air?", "what is the speed of sound in air?"),
    ("How do I water a cactus?", "How should I water a cactus?"),
    ("What do pandas eat in the wild?", "What do pandas eat in the wild"),
    ("How do I whistle loudly?", "how can i whistle loudly"),
    ("What is the largest desert on Earth?", "Which is the largest desert on Earth?"),
    ("How do I fix a flat bicycle tire?", "how do i fix a flat bicycle tire"),
    ("Why is the ocean salty?", "Why is the ocean salty"),
], [
    ("What is the capital of Norway?", "what's the capital of norway?"),
    ("How many legs does a crab have?", "How many legs does a crab have"),
    ("How do I fry an egg?", "how do I fry an egg"),
    ("What is the oldest tree species?", "Which tree species is the oldest?"),
    ("How do I reverse a list in Python?", "How can I reverse a list in Python?"),
    ("Who wrote The Iliad?", "who wrote the iliad"),
    ("What causes sea breezes?", "What causes the breezes at sea?"),
    ("How do I make a paper boat?", "how do i make a paper boat?"),
    ("What is the melting point of ice?", "What's the melting point of ice?"),
    ("How do I clear my browser history?", "How can I clear my browser history?"),
    ("Why do dogs sleep so much?", "why do dogs sleep so much"),
    ("What is a sonnet poem?", "What is a sonnet poem"),
    ("How do I fold a towel neatly?", "How can I fold a towel neatly?"),
    ("What is the speed of light in water?", "what is the speed of light in water?"),
    ("How do I water an orchid?", "How should I water an orchid?"),
    ("What do koalas eat in the wild?", "What do koalas eat in the wild"),
    ("How do I snap my fingers loudly?", "how can i snap my fingers loudly"),
    ("What is the largest lake on Earth?", "Which is the largest lake on Earth?"),
    ("How do I fix a squeaky bicycle chain?", "how do i fix a squeaky bicycle chain"),
    ("Why is the sea blue?", "Why is the sea blue"),
]]
BURST_GAP_S = 0.025  # between one pair's first request and the next's: 20 pairs in 0.5 s


async def test_a_fresh_service_answers_a_burst_of_paraphrases_as_a_warm_one(replica: Replica) -> None:
    """Just after the service says it is ready: a burst of pairs, each a question stored then its
    paraphrase looked up at once (one tenant each), the pairs starting 25 ms apart. Every
    paraphrase is answered, as in a second burst once the service is warm: a lookup finds the
    entry stored just before it even while the embedder is still indexing it. (The budget is
    generous so that a loaded test machine decides nothing here; what the default budget answers
    under load is measured by bench/semantic.py.)"""
    cache = await replica(semantic_budget_s=30.0)

    async def burst(pairs: list[tuple[str, str]], tenants: str) -> int:
        async def pair(i: int, question: str, paraphrase: str) -> bool:
            await asyncio.sleep(i * BURST_GAP_S)
            await store(cache, ask(question), f"{tenants}-{i}")
            return (await lookup(cache, ask(paraphrase), f"{tenants}-{i}")).hit

        return sum(await asyncio.gather(*(pair(i, q, p) for i, (q, p) in enumerate(pairs))))

    fresh = await burst(BURSTS[0], "fresh")
    warm = await burst(BURSTS[1], "warm")
    assert (fresh, warm) == (len(BURSTS[0]), len(BURSTS[1]))
    assert cache.metric("meshserve_cache_semantic_skipped_total", reason="slow") == 0


# -- bad entries ----------------------------------------------------------------------------------


async def test_a_corrupt_entry_is_deleted_and_a_miss(
    cache: CacheReplica, redis_client: aioredis.Redis, prefix: str
) -> None:
    key = exact_key(greedy(), "t", prefix)
    for garbage in (b"\xff\x00 not a protobuf", pb.CacheEntry(chunks=chunks("")).SerializeToString()):
        await redis_client.set(key, garbage)
        corrupt = cache.metric("meshserve_cache_corrupt_entries_total")
        assert not (await lookup(cache, greedy())).hit
        assert await redis_client.exists(key) == 0
        assert cache.metric("meshserve_cache_corrupt_entries_total") == corrupt + 1


async def test_an_oversized_entry_is_not_stored(
    replica: Replica, redis_client: aioredis.Redis, prefix: str
) -> None:
    small = await replica(max_entry_bytes=64, semantic=False)
    big = [pb.GenerateResponse(text="x" * 100, token_ids=[1], finish_reason="stop")]
    result = await small.Store(pb.StoreRequest(request=greedy(), tenant="t", chunks=big), timeout=10)
    assert not result.stored and "too large" in result.reason
    assert await redis_client.keys(prefix + "*") == []
