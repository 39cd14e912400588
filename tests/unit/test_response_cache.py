"""The gateway's response cache stage: keys scoped by the weights that answer, exact entries read
by the gateway itself, and a breaker per backend, so a cache service that fails costs the semantic
hits and never the exact ones (nor any request: a failure is a miss)."""

from __future__ import annotations

import grpc
import pytest

from meshserve.gateway.response_cache import ResponseCache
from meshserve.services import cache_keys
from meshserve.services.config import GatewayConfig
from meshserve.services.gen import meshserve_pb2 as pb

REQUEST = pb.GenerateRequest(request_id="r", prompt="What is 2+2?", max_tokens=4, temperature=0)


class Entries:
    """Exact entries in Redis, as gateway.entries reads them."""

    def __init__(self) -> None:
        self.stored: dict[str, pb.CacheEntry] = {}

    async def get(self, key: str) -> pb.CacheEntry | None:
        return self.stored.get(key)

    async def put(self, key: str, req: pb.GenerateRequest, chunks: list[pb.GenerateResponse]) -> str:
        self.stored[key] = pb.CacheEntry(chunks=chunks)
        return ""

    async def close(self) -> None:
        pass


class DeadService:
    """A cache service that is not there: every call fails."""

    def __init__(self) -> None:
        self.calls = 0

    async def Lookup(self, request: pb.LookupRequest, **_: object) -> pb.LookupResponse:  # noqa: N802
        self.calls += 1
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")

    async def Store(self, request: pb.StoreRequest, **_: object) -> pb.StoreResponse:  # noqa: N802
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")


def cache(entries: Entries | None, service: object) -> ResponseCache:
    return ResponseCache(GatewayConfig(cache_breaker_failures=2, cache_breaker_s=60.0), service, entries)  # type: ignore[arg-type]


def test_the_key_names_the_weights_that_answer() -> None:
    c = cache(None, DeadService())
    old, new, unknown = (c.key(REQUEST, "t", "exact", w) for w in ("w1", "w2", ""))
    assert old.request.model.endswith("@w1") and new.request.model.endswith("@w2")
    assert len({old.exact, new.exact, unknown.exact}) == 3
    assert c.key(REQUEST, "other tenant", "exact", "w1").exact != old.exact
    assert REQUEST.model == ""  # the request itself is left as it came


async def test_a_failing_cache_service_costs_the_semantic_lookups_not_the_exact_hits() -> None:
    entries, service = Entries(), DeadService()
    c = cache(entries, service)
    key = c.key(REQUEST, "t", "semantic", "w1")
    await c.store(key, [pb.GenerateResponse(text="4", token_ids=[1], finish_reason="stop")], lambda: None)
    for _ in range(3):
        lookup = c.by_meaning(key)
        if lookup is not None:
            assert await lookup is None  # a failure is a miss
    assert service.calls == 2  # two failures opened its breaker: no third call
    hit = await c.read(key)
    assert hit is not None and hit.kind == cache_keys.KIND_EXACT and hit.chunks[0].text == "4"


async def test_without_the_redis_url_the_service_answers_and_its_failure_is_a_miss() -> None:
    c = cache(None, DeadService())
    assert not c.reads_entries and c.by_meaning(c.key(REQUEST, "t", "semantic", "")) is None
    assert await c.read(c.key(REQUEST, "t", "exact", "")) is None


def test_each_model_and_adapter_has_its_own_entry_scope_and_flight() -> None:
    """What answered is in every key: the exact entry's, the scope a semantic hit must share and
    the flight identical requests in flight share; the base model named or not is one model."""
    from meshserve.cache_service.semantic import scope_of

    c = cache(None, DeadService())

    def on(model: str, mode: str = "semantic") -> pb.GenerateRequest:
        req = pb.GenerateRequest()
        req.CopyFrom(REQUEST)
        req.model = model
        return c.key(req, "t", mode, "w1")

    served = GatewayConfig().model
    keys = [on(m) for m in ("", served, "support", "legal")]
    assert keys[0].exact == keys[1].exact and keys[0].flight == keys[1].flight
    assert len({k.exact for k in keys[1:]}) == len({k.flight for k in keys[1:]}) == 3
    assert len({scope_of(k.request, k.tenant)[0] for k in keys[1:]}) == 3  # type: ignore[index]
    assert on("support").request.model == "support@w1"  # the adapter, on the base model's weights
    assert on("support", "exact").flight != on("support").flight
