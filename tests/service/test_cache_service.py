"""The cache gRPC service against a real Valkey: store, hit, refusals, TTL, Redis down."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
import redis.asyncio as aioredis

from services.cache_keys import exact_key
from cache_service.server import start_cache
from services.config import CacheConfig
from services.gen import meshserve_pb2 as pb
from services.gen import meshserve_pb2_grpc as pb_grpc
from services.server import insecure_channel
from tests.conftest import free_port

TTL = 120


@pytest.fixture
def prefix() -> str:
    return f"test:{uuid.uuid4().hex}:"


@pytest.fixture
async def cache(redis_url: str, prefix: str) -> AsyncIterator[pb_grpc.CacheStub]:
    running = await start_cache(
        CacheConfig(
            port=0, metrics_port=-1, redis_url=redis_url, ttl_seconds=TTL, key_prefix=prefix, grace_seconds=1
        )
    )
    channel = insecure_channel(f"127.0.0.1:{running.port}")
    try:
        yield pb_grpc.CacheStub(channel)
    finally:
        await channel.close()
        await running.shutdown()


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


async def test_store_then_lookup_hits_with_identical_chunks(cache: pb_grpc.CacheStub) -> None:
    miss = await cache.Lookup(pb.LookupRequest(request=greedy(), tenant="t"))
    assert not miss.hit and not miss.chunks

    stored = await cache.Store(pb.StoreRequest(request=greedy(), tenant="t", chunks=chunks()))
    assert stored.stored, stored.reason

    other_id = greedy()
    other_id.request_id = "r2"
    hit = await cache.Lookup(pb.LookupRequest(request=other_id, tenant="t"))
    assert hit.hit and hit.kind == "exact"
    assert [(c.text, list(c.token_ids), c.finish_reason) for c in hit.chunks] == [
        ("a", [1], ""),
        ("b", [2], ""),
        ("c", [3], "length"),
    ]
    assert hit.chunks[-1].usage == pb.Usage(prompt_tokens=2, completion_tokens=3)
    assert all(c.cached and not c.worker and not c.request_id for c in hit.chunks)

    # Another tenant or another prompt does not see the entry.
    assert not (await cache.Lookup(pb.LookupRequest(request=greedy(), tenant="u"))).hit
    assert not (await cache.Lookup(pb.LookupRequest(request=greedy("Bye"), tenant="t"))).hit


async def test_entry_has_the_configured_ttl(
    cache: pb_grpc.CacheStub, redis_client: aioredis.Redis, prefix: str
) -> None:
    assert (await cache.Store(pb.StoreRequest(request=greedy(), tenant="t", chunks=chunks("stop")))).stored
    ttl = await redis_client.ttl(exact_key(greedy(), "t", prefix))
    assert 0 < ttl <= TTL


async def test_non_deterministic_is_not_stored(
    cache: pb_grpc.CacheStub, redis_client: aioredis.Redis, prefix: str
) -> None:
    sampled = pb.GenerateRequest(prompt="Hello", max_tokens=3, temperature=0.8)
    result = await cache.Store(pb.StoreRequest(request=sampled, tenant="t", chunks=chunks()))
    assert not result.stored and "deterministic" in result.reason
    assert await redis_client.keys(prefix + "*") == []
    assert not (await cache.Lookup(pb.LookupRequest(request=sampled, tenant="t"))).hit


@pytest.mark.parametrize("finish", ["", "abort"])
async def test_unfinished_or_aborted_is_not_stored(
    cache: pb_grpc.CacheStub, redis_client: aioredis.Redis, prefix: str, finish: str
) -> None:
    result = await cache.Store(pb.StoreRequest(request=greedy(), tenant="t", chunks=chunks(finish)))
    assert not result.stored and "not finished" in result.reason
    assert await redis_client.keys(prefix + "*") == []


async def test_seeded_sampling_is_cached(cache: pb_grpc.CacheStub) -> None:
    seeded = pb.GenerateRequest(prompt="Hello", max_tokens=3, temperature=0.8, seed=42)
    assert (await cache.Store(pb.StoreRequest(request=seeded, tenant="t", chunks=chunks()))).stored
    assert (await cache.Lookup(pb.LookupRequest(request=seeded, tenant="t"))).hit


async def test_redis_unreachable_is_unavailable() -> None:
    dead = f"redis://127.0.0.1:{free_port()}/0"
    running = await start_cache(CacheConfig(port=0, metrics_port=-1, redis_url=dead, grace_seconds=1))
    channel = insecure_channel(f"127.0.0.1:{running.port}")
    try:
        stub = pb_grpc.CacheStub(channel)
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
    finally:
        await channel.close()
        await running.shutdown()
