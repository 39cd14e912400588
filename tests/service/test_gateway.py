"""The gateway against fake router/workers (real gRPC servers implementing the real interfaces)
and the real cache servicer on a real Valkey."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
import redis
from prometheus_client import REGISTRY

from meshserve.cache_service.server import CacheServicer
from meshserve.cache_service.store import ExactStore
from meshserve.gateway.entries import ExactEntries
from meshserve.gateway.server import TENANT_METADATA, start_gateway
from meshserve.services import validation
from meshserve.services.cache_keys import connect, exact_key, parse_entry
from meshserve.services.config import DEFAULT_MODEL, GatewayConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.offload import OFFLOAD_CHARS
from meshserve.services.server import insecure_channel
from tests.conftest import free_port
from tests.integration.helpers import until, wait_until
from meshserve.worker.session import Session

WAIT_S = 10.0   # upper bound on any wait; a healthy run takes milliseconds
PIECES = ["Hel", "lo", " world"]


# -- fakes ------------------------------------------------------------------------------------------


@dataclass(eq=False)
class FakeWorker(pb_grpc.WorkerServicer):
    """Streams PIECES (one token each: 10, 11, 12), after those a migrated stream already has
    (``continue_token_ids``, as a real worker does); ``mode`` makes it fail in one of the ways a
    real worker can."""

    worker_id: str
    mode: str = "ok"  # ok | unavailable | exhausted | invalid | hang | die_mid | hold
    requests: list[pb.GenerateRequest] = field(default_factory=list)
    first_sent: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def calls(self) -> int:
        return len(self.requests)

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        self.requests.append(request)
        try:
            if self.mode == "unavailable":
                await context.abort(grpc.StatusCode.UNAVAILABLE, "engine is gone")
            if self.mode == "exhausted":
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full")
            if self.mode == "invalid":
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "'max_tokens' exceeds the context")
            if self.mode == "hang":
                await asyncio.Event().wait()
            for i, piece in enumerate(PIECES):
                if i < len(request.continue_token_ids):
                    continue  # the client has it already
                last = i == len(PIECES) - 1
                yield pb.GenerateResponse(
                    request_id=request.request_id,
                    text=piece,
                    token_ids=[10 + i],
                    worker=self.worker_id,
                    finish_reason="length" if last else "",
                    usage=pb.Usage(prompt_tokens=4, completion_tokens=len(PIECES)) if last else None,
                )
                if i == 0:
                    self.first_sent.set()
                    if self.mode == "hold":
                        await self.release.wait()
                if i == 1 and self.mode == "die_mid":
                    await context.abort(grpc.StatusCode.UNAVAILABLE, "engine crashed")
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def Session(self, request_iterator: AsyncIterator[pb.SessionRequest],
                      context: grpc.aio.ServicerContext) -> None:
        # The gateway's path: the worker's own session server over this fake's Generate.
        await Session(self.Generate, ended=lambda: False).serve(request_iterator, context)


@dataclass(eq=False)
class FakeRouter(pb_grpc.RouterServicer):
    """Picks the first worker in order that is not excluded; lists them all, healthy, serving the
    weights in ``weights`` (worker id -> weights id; none given: ''), and pushes that list to each
    fleet watcher when it changes; with a ``gate``, the gateway's picks are answered once it is set."""

    workers: list[tuple[str, str]]
    picks: list[pb.PickRequest] = field(default_factory=list)
    weights: dict[str, str] = field(default_factory=dict)
    gate: asyncio.Event | None = None
    lists: int = 0
    fleet_views: int = 0  # views pushed to the gateway
    def _answer(self, request: pb.PickRequest) -> pb.PickResponse:
        self.picks.append(request)
        for worker_id, address in self.workers:
            if worker_id not in request.exclude:
                return pb.PickResponse(worker_id=worker_id, address=address, reason="first")
        return pb.PickResponse(error_code=grpc.StatusCode.UNAVAILABLE.value[0], error_message="no worker available")

    def _states(self) -> list[pb.WorkerState]:
        return [pb.WorkerState(worker_id=worker_id, address=address, healthy=True,
                               weights_id=self.weights.get(worker_id, "")) for worker_id, address in self.workers]

    async def ListWorkers(self, request: pb.ListWorkersRequest, context: grpc.aio.ServicerContext
                          ) -> pb.ListWorkersResponse:
        self.lists += 1
        return pb.ListWorkersResponse(workers=self._states())

    async def WatchFleet(self, request: pb.WatchFleetRequest, context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[pb.FleetUpdate]:
        # Tests change ``workers`` and ``weights`` in place; this fake looks for a change every
        # few ms and pushes it, as the router pushes the changes it sees.
        pushed: list[pb.WorkerState] | None = None
        while True:
            if (states := self._states()) != pushed:
                pushed = states
                self.fleet_views += 1
                yield pb.FleetUpdate(workers=states)
            await asyncio.sleep(0.005)

    async def Pick(self, request: pb.PickRequest, context: grpc.aio.ServicerContext) -> pb.PickResponse:
        answer = self._answer(request)
        if answer.error_code:
            await context.abort(grpc.StatusCode.UNAVAILABLE, answer.error_message)
        return answer

    def _answer_on_stream(self, request: pb.PickRequest) -> pb.PickResponse:
        answer = self._answer(request)
        answer.pick_id = request.pick_id
        return answer

    async def Picks(self, request_iterator: AsyncIterator[pb.PickRequest],
                    context: grpc.aio.ServicerContext) -> None:
        async for request in request_iterator:
            await context.write(self._answer_on_stream(request))

    async def PickBatches(self, request_iterator: AsyncIterator[pb.PickBatch],
                          context: grpc.aio.ServicerContext) -> None:  # the gateway's path
        async for batch in request_iterator:
            if self.gate is not None:
                await self.gate.wait()
            await context.write(pb.PickBatchResponse(answers=[self._answer_on_stream(r) for r in batch.picks]))


class ObservedCache(CacheServicer):
    """The real cache servicer, counting calls and signalling each finished Store."""

    def __init__(self, store: ExactStore) -> None:
        super().__init__(store)
        self.lookups = 0
        self.modes: list[str] = []
        self.exact_missed: list[bool] = []
        self.stores: asyncio.Queue[pb.StoreResponse] = asyncio.Queue()
        self.index_only: list[bool] = []  # of each Store call
        self.lookup_gate: asyncio.Event | None = None  # set: lookups answer (None: at once)
        self.semantic_answer: pb.LookupResponse | None = None  # the answer to lookups by meaning
        self.index_gate: asyncio.Event | None = None  # set: index_only stores answer (None: at once)

    async def Lookup(self, request: pb.LookupRequest, context: grpc.aio.ServicerContext) -> pb.LookupResponse:
        self.lookups += 1
        self.modes.append(request.mode)
        self.exact_missed.append(request.exact_missed)
        if self.lookup_gate is not None:
            await self.lookup_gate.wait()
        if self.semantic_answer is not None and request.exact_missed:
            return self.semantic_answer
        return await super().Lookup(request, context)

    async def Store(self, request: pb.StoreRequest, context: grpc.aio.ServicerContext) -> pb.StoreResponse:
        self.index_only.append(request.index_only)
        if request.index_only and self.index_gate is not None:
            await self.index_gate.wait()
        resp = await super().Store(request, context)
        self.stores.put_nowait(resp)
        return resp


async def _serve(stack: AsyncExitStack, add: Callable[[grpc.aio.Server], None],
                 servers: list[grpc.aio.Server] | None = None) -> str:
    server = grpc.aio.server()
    add(server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stack.push_async_callback(server.stop, 0)
    if servers is not None:
        servers.append(server)
    return f"127.0.0.1:{port}"


@dataclass
class Mesh:
    stub: pb_grpc.InferenceStub
    router: FakeRouter
    a: FakeWorker
    b: FakeWorker
    cache: ObservedCache | None
    router_server: grpc.aio.Server | None = None
    redis_url: str = ""  # the cache's Redis, and the prefix of its keys
    key_prefix: str = ""
    reads_redis: bool = False  # the gateway reads and writes exact entries there itself
    openai: pb_grpc.OpenAIStub | None = None  # the gateway's OpenAI service (its health check)
    admin: pb_grpc.GatewayAdminStub | None = None  # the gateway's operators' service (the usage ledger)


MeshFactory = Callable[..., Awaitable[Mesh]]


@pytest.fixture
async def mesh(redis_url: str) -> AsyncIterator[MeshFactory]:
    """Builds gateway + fake router + fake workers A, B + cache; ``cache`` is one of
    'real', 'off', 'dead-port' (nothing listens), 'dead-redis' (cache up, Redis down) or
    'dead-service' (Redis up, nothing listens at the cache service's address);
    ``reads_redis``: the gateway reads exact entries from the cache's Redis itself (--redis-url)."""
    async with AsyncExitStack() as stack:

        async def make(
            a: str = "ok", b: str = "ok", cache: str = "real", router: str = "up", reads_redis: bool = False,
            **cfg: Any,
        ) -> Mesh:
            workers = {name: FakeWorker(name, mode) for name, mode in (("A", a), ("B", b))}
            addresses = {}
            for name, worker in workers.items():
                addresses[name] = await _serve(
                    stack, lambda s, w=worker: pb_grpc.add_WorkerServicer_to_server(w, s)
                )
            fake_router = FakeRouter([(name, addresses[name]) for name in ("A", "B")])
            router_servers: list[grpc.aio.Server] = []
            router_address = await _serve(
                stack, lambda s: pb_grpc.add_RouterServicer_to_server(fake_router, s), router_servers
            )
            if router == "down":
                router_address = f"127.0.0.1:{free_port()}"

            observed: ObservedCache | None = None
            cache_address = url = ""
            prefix = f"test:{uuid.uuid4().hex}:"
            if cache in ("real", "dead-redis"):
                url = redis_url if cache == "real" else f"redis://127.0.0.1:{free_port()}/0"
                store = ExactStore(connect(url), ttl_seconds=60, key_prefix=prefix)
                stack.push_async_callback(store.close)
                observed = ObservedCache(store)
                cache_address = await _serve(
                    stack, lambda s: pb_grpc.add_CacheServicer_to_server(observed, s)
                )
            elif cache in ("dead-port", "dead-service"):
                cache_address = f"127.0.0.1:{free_port()}"
                url = redis_url if cache == "dead-service" else ""  # Redis up, the cache service not

            if reads_redis:
                cfg.update(redis_url=url, cache_key_prefix=prefix)
            gateway_cfg = GatewayConfig(
                port=0, metrics_port=-1, grace_seconds=1, router=router_address, cache=cache_address, **cfg
            )
            running = await start_gateway(gateway_cfg)
            stack.push_async_callback(running.shutdown)
            channel = insecure_channel(f"127.0.0.1:{running.port}")
            stack.push_async_callback(channel.close)
            return Mesh(pb_grpc.InferenceStub(channel), fake_router, workers["A"], workers["B"], observed,
                        router_servers[0], url, prefix, reads_redis, pb_grpc.OpenAIStub(channel),
                        pb_grpc.GatewayAdminStub(channel))

        yield make


def greedy(prompt: str = "Hello there", **kw: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt=prompt, max_tokens=3, temperature=0, **kw)


async def collect(call: Any) -> list[pb.GenerateResponse]:
    async with asyncio.timeout(WAIT_S):
        return [chunk async for chunk in call]


def joined(chunks: list[pb.GenerateResponse]) -> str:
    """The streamed text: the gateway may merge deltas that queued, so chunk boundaries vary."""
    return "".join(c.text for c in chunks)


def tokens(chunks: list[pb.GenerateResponse]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


async def failing(call: Any) -> tuple[grpc.aio.AioRpcError, list[pb.GenerateResponse]]:
    """A stream that must end with an error: the error and what was received before it."""
    received: list[pb.GenerateResponse] = []
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async with asyncio.timeout(WAIT_S):
            async for chunk in call:
                received.append(chunk)
    return err.value, received


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRY.get_sample_value(name, labels or {}) or 0.0


# -- tests ------------------------------------------------------------------------------------------


async def test_streams_chunks_through_with_an_assigned_request_id(mesh: MeshFactory) -> None:
    m = await mesh()
    ok_before = sample("meshserve_gateway_requests_total", {"code": "OK"})
    engine = {"source": "engine"}
    tokens_before = sample("meshserve_gateway_output_tokens_total", engine)
    messages_before = sample("meshserve_gateway_stream_messages_total", engine)
    chunks = await collect(m.stub.Generate(greedy(skip_cache=True)))

    assert joined(chunks) == "".join(PIECES) and tokens(chunks) == [10, 11, 12]
    assert chunks[-1].finish_reason == "length" and chunks[-1].usage.completion_tokens == 3
    assert {c.worker for c in chunks} == {"A"} and not any(c.cached for c in chunks)
    request_id = m.a.requests[0].request_id
    assert len(request_id) == 32 and {c.request_id for c in chunks} == {request_id}
    assert m.router.picks[0].request_id == request_id and m.router.picks[0].prompt == "Hello there"
    assert m.cache is not None and m.cache.lookups == 0  # skip_cache
    assert sample("meshserve_gateway_requests_total", {"code": "OK"}) == ok_before + 1
    # What the client got: the tokens, and the messages they came in.
    assert sample("meshserve_gateway_output_tokens_total", engine) == tokens_before + 3
    assert sample("meshserve_gateway_stream_messages_total", engine) == messages_before + len(chunks)


async def test_client_request_id_is_kept_for_the_client_and_never_the_workers_key(mesh: MeshFactory) -> None:
    m = await mesh(cache="off")
    chunks = await collect(m.stub.Generate(greedy(request_id="mine")))
    assert {c.request_id for c in chunks} == {"mine"}
    assert len(m.a.requests[0].request_id) == 32 and m.router.picks[0].request_id == m.a.requests[0].request_id
    complete = await asyncio.wait_for(m.stub.Complete(greedy(request_id="mine")), WAIT_S)
    assert complete.request_id == "mine" and m.a.requests[1].request_id not in ("mine", m.a.requests[0].request_id)


async def test_two_tenants_with_the_same_request_id_on_one_worker_are_two_requests(mesh: MeshFactory) -> None:
    """Tenant B sends the id tenant A's stream is using, to the same worker: B is served, and A
    leaving cancels A's generation only."""
    m = await mesh(a="hold", cache="off")
    alice = m.stub.Generate(greedy(request_id="same", skip_cache=True), metadata=((TENANT_METADATA, "alice"),))
    bob = m.stub.Generate(greedy(request_id="same", skip_cache=True), metadata=((TENANT_METADATA, "bob"),))
    async with asyncio.timeout(WAIT_S):
        first = [await alice.read(), await bob.read()]
    assert [c.text for c in first] == [PIECES[0]] * 2 and {c.request_id for c in first} == {"same"}
    assert m.a.calls == 2 and m.a.requests[0].request_id != m.a.requests[1].request_id
    alice.cancel()
    async with asyncio.timeout(WAIT_S):
        await m.a.cancelled.wait()
    m.a.release.set()
    rest = []
    async with asyncio.timeout(WAIT_S):
        while (chunk := await bob.read()) is not grpc.aio.EOF:
            rest.append(chunk)
    assert joined([first[1], *rest]) == "".join(PIECES) and {c.request_id for c in rest} == {"same"}
    assert rest[-1].finish_reason == "length"


async def stored_and_landed(m: Mesh) -> None:
    """The answer is stored (by the cache service, or by a gateway that writes Redis itself before
    its flight ends), and the gateway's flight that held it is closed: until then an identical
    request is answered from the flight (coalesced), not from the cache."""
    if not m.reads_redis:
        assert m.cache is not None
        async with asyncio.timeout(WAIT_S):
            assert (await m.cache.stores.get()).stored
    await wait_until(lambda: sample("meshserve_gateway_flights") == 0, WAIT_S, "the flight to close")


@pytest.mark.parametrize("reads_redis", [False, True], ids=["via-cache-service", "gateway-reads-redis"])
async def test_second_identical_greedy_request_is_a_cache_hit(mesh: MeshFactory, reads_redis: bool) -> None:
    m = await mesh(reads_redis=reads_redis)
    assert m.cache is not None
    hits_before = sample("meshserve_cache_hits_total", {"kind": "exact"})
    first = await collect(m.stub.Generate(greedy()))
    await stored_and_landed(m)
    cache = {"source": "cache"}
    tokens_before = sample("meshserve_gateway_output_tokens_total", cache)
    messages_before = sample("meshserve_gateway_stream_messages_total", cache)

    second = await collect(m.stub.Generate(greedy(request_id="again")))
    assert sample("meshserve_gateway_output_tokens_total", cache) == tokens_before + 3
    assert sample("meshserve_gateway_stream_messages_total", cache) == messages_before + len(second)

    assert [c.text for c in second] == [c.text for c in first] and joined(first) == "".join(PIECES)
    assert [list(c.token_ids) for c in second] == [list(c.token_ids) for c in first]
    assert second[-1].usage == first[-1].usage and second[-1].finish_reason == "length"
    assert all(c.cached and c.worker == "" and c.request_id == "again" for c in second)
    assert all(c.cache_kind == "exact" and 0 <= c.cache_age_s < WAIT_S for c in second)
    assert not any(c.cache_kind for c in first)
    assert m.a.calls + m.b.calls == 1 and len(m.router.picks) == 1
    assert sample("meshserve_cache_hits_total", {"kind": "exact"}) == hits_before + 1

    # Another tenant does not see this tenant's entry.
    await collect(m.stub.Generate(greedy(), metadata=((TENANT_METADATA, "other"),)))
    assert m.a.calls == 2


async def test_complete_can_be_a_cache_hit_and_explicit_model_shares_the_entry(mesh: MeshFactory) -> None:
    m = await mesh()
    assert m.cache is not None
    await m.stub.Complete(greedy(), timeout=WAIT_S)
    await stored_and_landed(m)
    resp = await m.stub.Complete(greedy(model=DEFAULT_MODEL), timeout=WAIT_S)
    assert resp.cached and resp.text == "".join(PIECES) and m.a.calls == 1


async def test_non_deterministic_request_is_never_cached(mesh: MeshFactory) -> None:
    m = await mesh()
    assert m.cache is not None
    sampled = pb.GenerateRequest(prompt="Hello there", max_tokens=3, temperature=0.7)
    for _ in range(2):
        chunks = await collect(m.stub.Generate(sampled))
        assert not any(c.cached for c in chunks)
    assert m.a.calls == 2 and m.cache.lookups == 0 and m.cache.stores.empty()


async def test_failover_before_first_token_reaches_worker_b(mesh: MeshFactory) -> None:
    m = await mesh(a="unavailable", cache="off")
    failovers = sample("meshserve_gateway_failovers_total")
    chunks = await collect(m.stub.Generate(greedy()))

    assert joined(chunks) == "".join(PIECES) and {c.worker for c in chunks} == {"B"}
    assert m.a.calls == 1 and m.b.calls == 1
    assert [list(p.exclude) for p in m.router.picks] == [[], ["A"]]
    assert m.b.requests[0].request_id == m.a.requests[0].request_id
    assert sample("meshserve_gateway_failovers_total") == failovers + 1


async def test_silent_worker_counts_as_failed_and_is_cancelled(mesh: MeshFactory) -> None:
    m = await mesh(a="hang", cache="off", first_token_timeout_s=0.3)
    chunks = await collect(m.stub.Generate(greedy()))
    assert {c.worker for c in chunks} == {"B"}
    async with asyncio.timeout(WAIT_S):
        await m.a.cancelled.wait()


async def test_overloaded_worker_fails_over_and_both_overloaded_is_resource_exhausted(
    mesh: MeshFactory,
) -> None:
    m = await mesh(a="exhausted", b="exhausted", cache="off")
    call = m.stub.Generate(greedy())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(call)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "retry" in err.value.details()
    assert m.a.calls == 1 and m.b.calls == 1


async def test_both_workers_failing_is_unavailable(mesh: MeshFactory) -> None:
    m = await mesh(a="unavailable", b="unavailable", cache="off")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(m.stub.Generate(greedy()))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "engine is gone" in err.value.details()
    assert len(m.router.picks) == 2  # retried once, not more


@pytest.mark.parametrize("mode", ["die_mid", "hold"])
async def test_failure_mid_stream_without_migrations_ends_with_unavailable(mesh: MeshFactory, mode: str) -> None:
    # "hold": the worker goes silent after the first chunk and the idle timeout fires.
    m = await mesh(a=mode, cache="off", first_token_timeout_s=0.5, migrations=0)
    err, received = await failing(m.stub.Generate(greedy()))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "worker lost mid-stream" in err.details()
    assert "no worker could continue the stream" in err.details()
    # Everything the worker sent before failing, nothing more (deltas may arrive merged).
    assert joined(received) == "".join(PIECES[: 2 if mode == "die_mid" else 1])
    assert m.b.calls == 0


@pytest.mark.parametrize("mode", ["die_mid", "hold"])
async def test_a_stream_whose_worker_is_lost_mid_stream_continues_on_another(mesh: MeshFactory, mode: str) -> None:
    # "die_mid": A's stream ends with an error after two tokens; "hold": A goes silent after one.
    m = await mesh(a=mode, cache="off", first_token_timeout_s=0.5)
    ok_before = sample("meshserve_gateway_migrations_total", {"outcome": "ok"})
    chunks = await collect(m.stub.Generate(greedy()))
    # One stream, no gap, no duplicate: every token once, in order, and the text with it.
    assert tokens(chunks) == [10, 11, 12]
    assert joined(chunks) == "".join(PIECES)
    assert chunks[-1].finish_reason == "length"
    assert chunks[-1].usage.completion_tokens == len(PIECES)  # one request's usage
    sent_by_a = [10, 11] if mode == "die_mid" else [10]
    assert [c.worker for c in chunks if c.token_ids][0] == "A" and chunks[-1].worker == "B"
    # B was asked to continue from what the client had, with the same request otherwise.
    assert m.b.calls == 1
    assert list(m.b.requests[0].continue_token_ids) == sent_by_a
    assert m.b.requests[0].prompt == m.a.requests[0].prompt
    assert m.b.requests[0].request_id == m.a.requests[0].request_id
    assert m.router.picks[-1].exclude == ["A"]
    assert sample("meshserve_gateway_migrations_total", {"outcome": "ok"}) == ok_before + 1


async def test_a_lost_stream_with_no_worker_to_continue_on_ends_with_unavailable(mesh: MeshFactory) -> None:
    m = await mesh(a="die_mid", b="unavailable", cache="off")
    failed_before = sample("meshserve_gateway_migrations_total", {"outcome": "failed"})
    err, received = await failing(m.stub.Generate(greedy()))
    assert err.code() == grpc.StatusCode.UNAVAILABLE
    assert "after 2 tokens, and no worker could continue the stream" in err.details()
    assert tokens(received) == [10, 11]  # nothing after the loss, nothing twice
    assert m.b.calls == 1  # B refused the continuation; then no worker was left to pick
    assert sample("meshserve_gateway_migrations_total", {"outcome": "failed"}) == failed_before + 1


async def test_coalesced_readers_of_a_migrated_stream_all_get_the_whole_answer(mesh: MeshFactory) -> None:
    m = await mesh(a="hold", first_token_timeout_s=0.5)
    leader = asyncio.create_task(collect(m.stub.Generate(greedy())))
    async with asyncio.timeout(WAIT_S):
        await m.a.first_sent.wait()
    follower = await collect(m.stub.Generate(greedy()))  # joins the flight A holds
    for chunks in (await leader, follower):
        assert tokens(chunks) == [10, 11, 12]
        assert joined(chunks) == "".join(PIECES)
    assert m.a.calls == 1 and m.b.calls == 1  # one generation, moved once


async def test_with_the_router_away_the_gateway_picks_from_the_workers_it_named(mesh: MeshFactory) -> None:
    m = await mesh(cache="off")
    answered = sample("meshserve_gateway_pick_seconds_count")
    assert tokens(await collect(m.stub.Generate(greedy()))) == [10, 11, 12]  # the router named A
    assert sample("meshserve_gateway_pick_seconds_count") == answered + 1  # its answer, timed
    answered += 1
    assert m.router_server is not None
    await m.router_server.stop(0)  # the router dies
    before = sample("meshserve_gateway_fallback_picks_total")
    for _ in range(3):
        chunks = await collect(m.stub.Generate(greedy()))
        assert tokens(chunks) == [10, 11, 12] and chunks[-1].worker == "A"
    assert sample("meshserve_gateway_fallback_picks_total") == before + 3
    assert sample("meshserve_gateway_pick_seconds_count") == answered  # no answer was waited for
    assert m.a.calls == 4 and len(m.router.picks) == 1


async def test_a_fleet_of_one_worker_gets_its_requests_without_waiting_for_the_router(mesh: MeshFactory) -> None:
    m = await mesh(cache="off")
    both = list(m.router.workers)
    assert m.openai is not None

    async def serving(n: int) -> bool:  # the gateway's view of the fleet, as its health check says
        return (await m.openai.Health(pb.HealthRequest(), timeout=WAIT_S)).workers == n

    m.router.workers = both[:1]  # the router's fleet is A alone: it pushes that to the gateway
    await until(lambda: serving(1), "the gateway's fleet view to hold A alone")
    m.router.gate = asyncio.Event()  # the router answers no pick until the gate opens
    sole = sample("meshserve_gateway_sole_worker_picks_total")
    for i in range(3):
        chunks = await collect(m.stub.Generate(greedy(f"prompt {i}", skip_cache=True)))
        assert tokens(chunks) == [10, 11, 12] and chunks[-1].worker == "A"
    assert m.a.calls == 3 and m.b.calls == 0
    assert sample("meshserve_gateway_sole_worker_picks_total") == sole + 3
    # The router still gets every pick (its view of A's load, its span in the trace), off their path.
    m.router.gate.set()
    await until(lambda: asyncio.sleep(0, len(m.router.picks) == 3), "the router to get every pick")
    assert [p.prompt for p in m.router.picks] == [f"prompt {i}" for i in range(3)]

    # A second worker in the fleet: the router's pick is waited for again once its view is pushed.
    m.router.workers = both
    await until(lambda: serving(2), "the gateway's fleet view to hold both workers")
    answered = sample("meshserve_gateway_pick_seconds_count")
    await collect(m.stub.Generate(greedy(skip_cache=True)))
    assert sample("meshserve_gateway_pick_seconds_count") == answered + 1
    assert m.router.lists == 0  # the gateway never asked for a list: the router pushed its view


async def test_a_refusal_from_the_router_is_not_overridden_by_fallback_picks(mesh: MeshFactory) -> None:
    m = await mesh(cache="off")
    assert tokens(await collect(m.stub.Generate(greedy()))) == [10, 11, 12]  # A's session is open
    m.router.workers = []  # the router answers, and has no worker to give
    before = sample("meshserve_gateway_fallback_picks_total")
    err, _ = await failing(m.stub.Generate(greedy()))
    assert err.code() == grpc.StatusCode.UNAVAILABLE and err.details() == "router: no worker available"
    assert sample("meshserve_gateway_fallback_picks_total") == before and m.a.calls == 1


async def test_clients_may_not_set_continue_token_ids(mesh: MeshFactory) -> None:
    m = await mesh(cache="off")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(m.stub.Generate(greedy(continue_token_ids=[1, 2])))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "continue_token_ids" in err.value.details()
    assert m.a.calls == 0


async def test_client_cancel_cancels_the_worker_call(mesh: MeshFactory) -> None:
    m = await mesh(a="hold", cache="off")
    call = m.stub.Generate(greedy())
    async with asyncio.timeout(WAIT_S):
        first = await call.read()
    assert first.text == PIECES[0]
    call.cancel()
    async with asyncio.timeout(WAIT_S):
        await m.a.cancelled.wait()


@pytest.mark.parametrize(
    ("request_", "named", "code"),
    [
        (pb.GenerateRequest(prompt="hi", temperature=-1), "'temperature'", grpc.StatusCode.INVALID_ARGUMENT),
        (pb.GenerateRequest(prompt=""), "'prompt'", grpc.StatusCode.INVALID_ARGUMENT),
        (pb.GenerateRequest(prompt="hi", max_tokens=0), "'max_tokens'", grpc.StatusCode.INVALID_ARGUMENT),
        (pb.GenerateRequest(prompt="hi", model="gpt-4"), "the model 'gpt-4' does not exist", grpc.StatusCode.NOT_FOUND),
        (pb.GenerateRequest(prompt="hi", cache="always"), "'cache'", grpc.StatusCode.INVALID_ARGUMENT),
    ],
)
async def test_bad_input_is_refused_and_gateway_keeps_serving(
    mesh: MeshFactory, request_: pb.GenerateRequest, named: str, code: grpc.StatusCode
) -> None:
    m = await mesh(cache="off")
    for rpc in (m.stub.Generate, m.stub.Complete):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            call = rpc(request_, timeout=WAIT_S)
            await (collect(call) if rpc is m.stub.Generate else call)
        assert err.value.code() == code
        assert named in err.value.details()
    assert m.a.calls == 0 and not m.router.picks
    assert joined(await collect(m.stub.Generate(greedy()))) == "".join(PIECES)


@pytest.mark.parametrize(("request_", "param"), [
    (greedy(prompt="p" * 1025), "prompt"),
    (greedy(stop=["a", "b", "c", "d", "e"]), "stop"),
    (greedy(logit_bias={i: 1.0 for i in range(301)}), "logit_bias"),
    (pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="x")] * 2049), "messages"),
    (greedy(structured_outputs=pb.StructuredOutputs(json="[" * 65 + "]" * 65)), "structured_outputs.json"),
])
async def test_a_request_past_the_gateways_bounds_reaches_no_cache_router_or_worker(
    mesh: MeshFactory, request_: pb.GenerateRequest, param: str
) -> None:
    m = await mesh(max_prompt_bytes=1024)
    lookups = m.cache.lookups if m.cache is not None else 0
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(m.stub.Generate(request_))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(err.value.trailing_metadata() or ())["x-meshserve-param"] == param, err.value.details()
    assert m.a.calls == m.b.calls == 0 and not m.router.picks
    assert m.cache is not None and m.cache.lookups == lookups


async def test_a_message_past_the_gateways_receive_bound_is_refused_by_grpc_unread(mesh: MeshFactory) -> None:
    """Envoy streams gRPC through unbuffered: the gateway's own bound is what holds there."""
    m = await mesh(cache="off", max_message_bytes=64 * 2**10, max_prompt_bytes=2**20)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(m.stub.Generate(greedy(prompt="p" * (64 * 2**10))))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert m.a.calls == 0 and not m.router.picks
    assert joined(await collect(m.stub.Generate(greedy(prompt="p" * (60 * 2**10))))) == "".join(PIECES)


async def test_a_large_request_is_checked_off_the_event_loop(
    mesh: MeshFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long prompt or a JSON schema (its check costs milliseconds) is checked in the gateway's
    thread; a short plain request on the loop, where a hop would cost more than the check."""
    checked_on: list[bool] = []
    validate = validation.validate

    def recording(*args: Any, **kwargs: Any) -> None:
        checked_on.append(threading.current_thread() is threading.main_thread())
        validate(*args, **kwargs)

    monkeypatch.setattr(validation, "validate", recording)
    m = await mesh(cache="off")
    schema = pb.StructuredOutputs(json='{"type": "object"}')
    for request in (greedy(), greedy(prompt="p" * OFFLOAD_CHARS), greedy(structured_outputs=schema)):
        assert joined(await collect(m.stub.Generate(request))) == "".join(PIECES)
    assert checked_on == [True, False, False]


async def test_worker_invalid_argument_is_passed_through_without_failover(mesh: MeshFactory) -> None:
    m = await mesh(a="invalid", cache="off")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(m.stub.Generate(greedy()))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'max_tokens'" in err.value.details()
    assert m.b.calls == 0


async def test_past_max_in_flight_is_resource_exhausted_fast(mesh: MeshFactory) -> None:
    m = await mesh(a="hold", cache="off", max_in_flight=1)
    held = m.stub.Generate(greedy())
    async with asyncio.timeout(WAIT_S):
        assert (await held.read()).text == PIECES[0]

    started = time.monotonic()
    refused = m.stub.Generate(greedy())
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(refused)
    assert time.monotonic() - started < 1.0
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "retry" in err.value.details()
    assert ("retry-after", "1") in tuple(err.value.trailing_metadata() or ())
    assert m.a.calls == 1

    # The admitted request is unaffected, and its slot is released when it ends.
    m.a.release.set()
    async with asyncio.timeout(WAIT_S):
        rest = []
        while (chunk := await held.read()) is not grpc.aio.EOF:
            rest.append(chunk)
        assert joined(rest) == "".join(PIECES[1:])
        assert await held.code() == grpc.StatusCode.OK
    async with asyncio.timeout(WAIT_S):
        assert (await m.stub.Complete(greedy(), timeout=WAIT_S)).text == "".join(PIECES)


async def redis_info(url: str, section: str) -> dict[str, Any]:
    client = connect(url)
    try:
        return await client.info(section)
    finally:
        await client.aclose()


async def test_a_gateway_with_the_redis_url_reads_and_writes_exact_entries_there_not_through_the_cache_service(
    mesh: MeshFactory,
) -> None:
    m = await mesh(reads_redis=True)
    assert m.cache is not None
    reads = {r: sample("meshserve_gateway_cache_reads_total", {"result": r}) for r in ("hit", "miss")}
    stats = await redis_info(m.redis_url, "commandstats")
    sets, gets = (stats.get(f"cmdstat_{c}", {}).get("calls", 0) for c in ("set", "get"))
    exact = await collect(m.stub.Generate(greedy(prompt="exact one", cache="exact")))
    semantic = await collect(m.stub.Generate(greedy(prompt="semantic one", cache="semantic")))
    await stored_and_landed(m)
    # One GET per miss (Redis's own count): the flight that generates does not read it again.
    assert (await redis_info(m.redis_url, "commandstats"))["cmdstat_get"]["calls"] == gets + 2
    # The exact miss never reached the cache service; the semantic one asked it by meaning only.
    assert m.cache.lookups == 1 and m.cache.modes == ["semantic"] and m.cache.exact_missed == [True]
    assert sample("meshserve_gateway_cache_reads_total", {"result": "miss"}) == reads["miss"] + 2
    # Both answers were written by the gateway (two SETs, Redis's own count); the cache service got
    # one call, to index the semantic one by meaning (refused: this one has no semantic store).
    assert (await redis_info(m.redis_url, "commandstats"))["cmdstat_set"]["calls"] == sets + 2
    assert m.cache.index_only == [True]
    assert not (await m.cache.stores.get()).stored
    client = connect(m.redis_url)
    try:
        for prompt in ("exact one", "semantic one"):
            key = exact_key(greedy(prompt=prompt, model=DEFAULT_MODEL), "", m.key_prefix)
            assert parse_entry(await client.get(key)).chunks[-1].finish_reason == "length"
            assert 0 < await client.ttl(key) <= GatewayConfig.cache_ttl_seconds
    finally:
        await client.aclose()

    redis_hits = (await redis_info(m.redis_url, "stats"))["keyspace_hits"]
    gets = (await redis_info(m.redis_url, "commandstats"))["cmdstat_get"]["calls"]
    again = [await collect(m.stub.Generate(greedy(prompt=p, cache=mode, request_id=f"again-{mode}")))
             for p, mode in (("exact one", "exact"), ("semantic one", "semantic"))]

    assert [joined(c) for c in again] == [joined(exact), joined(semantic)]
    assert all(c.cached and c.cache_kind == "exact" for chunks in again for c in chunks)
    assert [len(c) for c in again] == [1, 1] and all(c[0].request_id.startswith("again-") for c in again)
    assert (await redis_info(m.redis_url, "commandstats"))["cmdstat_get"]["calls"] == gets + 2  # one each
    assert m.cache.lookups == 1 and m.a.calls == 2  # both hits: Redis, read by the gateway
    assert (await redis_info(m.redis_url, "stats"))["keyspace_hits"] == redis_hits + 2
    assert sample("meshserve_gateway_cache_reads_total", {"result": "hit"}) == reads["hit"] + 2


def _keys(m: Mesh, *models: str) -> list[bool]:
    """Whether Redis holds the entry of ``greedy()`` for each model name (``name@weights``)."""
    with redis.Redis.from_url(m.redis_url) as client:
        return [bool(client.exists(exact_key(greedy(model=model), "", m.key_prefix))) for model in models]


@pytest.mark.parametrize("reads_redis", [False, True], ids=["via-cache-service", "gateway-reads-redis"])
async def test_new_weights_under_the_same_name_never_get_the_old_weights_answers(
    mesh: MeshFactory, reads_redis: bool
) -> None:
    m = await mesh(reads_redis=reads_redis, cache_mode="exact")
    m.router.weights.update(A="w1", B="w1")
    old, new = f"{DEFAULT_MODEL}@w1", f"{DEFAULT_MODEL}@w2"
    await collect(m.stub.Generate(greedy(request_id="first")))
    await stored_and_landed(m)
    hit = await collect(m.stub.Generate(greedy(request_id="hit")))
    assert m.a.calls == 1 and [c.cached for c in hit] == [True]
    # Keyed by the weights that answered (Redis's own keys), not by the model's name alone.
    assert _keys(m, old, new, DEFAULT_MODEL) == [True, False, False]

    m.router.weights.update(A="w2", B="w2")  # new weights rolled out under the same name

    async def answered_by_the_engine() -> bool:
        return not (await collect(m.stub.Generate(greedy())))[0].cached

    await until(answered_by_the_engine, "a request answered by the new weights", timeout=WAIT_S)
    await stored_and_landed(m)
    calls = m.a.calls
    again = await collect(m.stub.Generate(greedy(request_id="again")))
    assert [c.cached for c in again] == [True] and m.a.calls == calls  # the new weights' entry
    assert _keys(m, old, new) == [True, True]


async def test_an_answer_is_stored_under_the_weights_of_the_worker_that_generated_it(mesh: MeshFactory) -> None:
    # Halfway through a rollout the fleet holds two weights; lookups use the one of most workers
    # (a tie: the first, w1), but A, which the fake router picks, serves w2: its answer must not be
    # found under w1's key.
    m = await mesh(reads_redis=True, cache_mode="exact")
    m.router.weights.update(A="w2", B="w1")
    await collect(m.stub.Generate(greedy(request_id="first")))
    await stored_and_landed(m)
    second = await collect(m.stub.Generate(greedy(request_id="second")))
    await stored_and_landed(m)

    assert not any(c.cached for c in second) and m.a.calls == 2
    assert _keys(m, f"{DEFAULT_MODEL}@w1", f"{DEFAULT_MODEL}@w2") == [False, True]


async def test_an_entry_in_redis_answers_while_it_is_still_being_indexed_by_meaning(mesh: MeshFactory) -> None:
    # Once the gateway has stored an answer in Redis, an identical request is an exact hit there,
    # even while the cache service is still indexing the entry by meaning (tens of ms under load);
    # the finished flight no longer answers it from memory as "coalesced".
    m = await mesh(reads_redis=True)
    assert m.cache is not None
    m.cache.index_gate = asyncio.Event()
    request = greedy(prompt="indexed slowly", cache="semantic")
    first = await collect(m.stub.Generate(request))
    key = exact_key(greedy(prompt="indexed slowly", model=DEFAULT_MODEL), "", m.key_prefix)
    with redis.Redis.from_url(m.redis_url) as client:
        await wait_until(lambda: client.exists(key), WAIT_S, "the entry in Redis")
    await wait_until(lambda: m.cache.index_only == [True], WAIT_S, "the entry sent to be indexed")

    again = await collect(m.stub.Generate(greedy(prompt="indexed slowly", cache="semantic", request_id="again")))

    assert joined(again) == joined(first) and m.a.calls + m.b.calls == 1
    assert [(c.cached, c.cache_kind) for c in again] == [(True, "exact")]
    m.cache.index_gate.set()
    async with asyncio.timeout(WAIT_S):
        await m.cache.stores.get()  # the indexing call ended (refused: no semantic store here)


async def test_a_request_whose_read_missed_an_identical_flight_that_came_and_landed_reads_again(
    mesh: MeshFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A request reads Redis and misses; before its read returns, an identical request's flight
    # starts, generates, stores and lands. No flight is left to join, so the late request starts
    # its own: it must find the stored entry (exact), not generate again.
    m = await mesh(reads_redis=True, cache_mode="exact")
    read = ExactEntries.get
    missed, gate = asyncio.Event(), asyncio.Event()

    async def slow_first_read(self: ExactEntries, key: str) -> Any:
        entry = await read(self, key)
        if not missed.is_set():  # the first read: back from Redis (a miss), held here
            missed.set()
            await gate.wait()
        return entry

    monkeypatch.setattr(ExactEntries, "get", slow_first_read)
    late = asyncio.create_task(collect(m.stub.Generate(greedy(prompt="came and went", request_id="late"))))
    async with asyncio.timeout(WAIT_S):
        await missed.wait()
    first = await collect(m.stub.Generate(greedy(prompt="came and went", request_id="first")))
    await stored_and_landed(m)
    gate.set()
    again = await late

    assert joined(again) == joined(first) and m.a.calls + m.b.calls == 1
    assert [(c.cached, c.cache_kind) for c in again] == [(True, "exact")]


async def test_a_corrupt_entry_the_gateway_reads_is_deleted_and_a_miss(mesh: MeshFactory) -> None:
    m = await mesh(reads_redis=True, cache_mode="exact")
    assert m.cache is not None
    key = exact_key(greedy(model=DEFAULT_MODEL), "", m.key_prefix)
    client = connect(m.redis_url)
    try:
        await client.set(key, b"\x0a\xff not a CacheEntry")
        corrupt = sample("meshserve_gateway_cache_corrupt_entries_total")
        deletes = (await redis_info(m.redis_url, "commandstats")).get("cmdstat_del", {}).get("calls", 0)
        chunks = await collect(m.stub.Generate(greedy()))
        assert joined(chunks) == "".join(PIECES) and not any(c.cached for c in chunks) and m.a.calls == 1
        assert sample("meshserve_gateway_cache_corrupt_entries_total") == corrupt + 1
        # Deleted by the gateway that read it (Redis's own count of DEL calls; the store is a SET).
        assert (await redis_info(m.redis_url, "commandstats"))["cmdstat_del"]["calls"] == deletes + 1
        await stored_and_landed(m)  # the generated answer replaced it
        assert parse_entry(await client.get(key)).chunks[-1].finish_reason == "length"
    finally:
        await client.aclose()


async def test_a_request_is_generated_while_it_is_looked_up_by_meaning(mesh: MeshFactory) -> None:
    """A miss costs the slower of the lookup and the generation, not their sum: the worker is
    asked, and sends its first token, while the cache service has not answered yet; the tokens
    reach the client once it says miss."""
    m = await mesh(reads_redis=True, a="hold", cache_timeout_s=2 * WAIT_S)  # the lookup never gives up here
    assert m.cache is not None
    m.cache.lookup_gate = asyncio.Event()
    call = asyncio.create_task(collect(m.stub.Generate(greedy(prompt="new question", cache="semantic"))))
    async with asyncio.timeout(WAIT_S):
        await m.a.first_sent.wait()
    assert m.cache.lookups == 1 and m.cache.exact_missed == [True] and not call.done()
    m.cache.lookup_gate.set()
    m.a.release.set()
    chunks = await call
    assert joined(chunks) == "".join(PIECES) and not any(c.cached for c in chunks)


async def test_a_hit_by_meaning_during_the_generation_wins_and_cancels_it(mesh: MeshFactory) -> None:
    m = await mesh(reads_redis=True, a="hold")
    assert m.cache is not None
    m.cache.lookup_gate = asyncio.Event()
    stored = pb.GenerateResponse(text="the stored answer", token_ids=[7, 8], finish_reason="stop", cached=True)
    m.cache.semantic_answer = pb.LookupResponse(hit=True, kind="semantic", similarity=0.95, chunks=[stored])
    call = asyncio.create_task(collect(m.stub.Generate(greedy(prompt="a paraphrase", cache="semantic"))))
    async with asyncio.timeout(WAIT_S):
        await m.a.first_sent.wait()  # generating: its first token is held back, not sent
        m.cache.lookup_gate.set()
        await m.a.cancelled.wait()   # the hit came: the worker's request is cancelled
    chunks = await call
    assert joined(chunks) == "the stored answer"
    assert all(c.cached and c.cache_kind == "semantic" and c.cache_similarity == pytest.approx(0.95) for c in chunks)


def test_a_redis_url_without_the_cache_service_is_refused() -> None:
    with pytest.raises(ValueError, match="--redis-url is the cache's Redis: it needs the cache service"):
        GatewayConfig(cache="", redis_url="redis://127.0.0.1:6379/0")


async def test_the_cache_mode_is_the_requests_or_the_gateways(mesh: MeshFactory) -> None:
    m = await mesh(cache_mode="exact")
    assert m.cache is not None
    await collect(m.stub.Generate(greedy(prompt="one")))
    await collect(m.stub.Generate(greedy(prompt="two", cache="semantic")))
    await collect(m.stub.Generate(greedy(prompt="three", cache="off")))
    assert m.cache.modes == ["exact", "semantic"] and m.a.calls == 3


async def test_an_open_breaker_stops_calling_a_failing_cache(mesh: MeshFactory) -> None:
    m = await mesh(cache="dead-redis", cache_breaker_failures=3, cache_breaker_s=600)
    assert m.cache is not None
    skipped = sample("meshserve_gateway_cache_skipped_total")
    for i in range(4):
        assert joined(await collect(m.stub.Generate(greedy(prompt=f"p{i}")))) == "".join(PIECES)
    # lookup 1, store 1, lookup 2 failed: open; from then on the cache is not called.
    assert m.cache.lookups == 2 and m.a.calls == 4
    assert sample("meshserve_gateway_cache_skipped_total") >= skipped + 3
    assert sample("meshserve_gateway_cache_breaker_open") == 1


async def test_a_failing_cache_service_costs_the_semantic_lookups_not_the_exact_hits(mesh: MeshFactory) -> None:
    m = await mesh(cache="dead-service", reads_redis=True, cache_breaker_failures=2, cache_breaker_s=600)
    # At once, as under load: each misses in Redis, then fails to ask the cache service by meaning
    # (a single breaker would open on these failures in a row and skip the gateway's own writes).
    answers = await asyncio.gather(*(collect(m.stub.Generate(greedy(prompt=f"q{i}", cache="semantic")))
                                     for i in range(3)))
    assert all(joined(a) == "".join(PIECES) for a in answers)
    await stored_and_landed(m)  # written to Redis by the gateway (indexing them failed)
    assert sample("meshserve_gateway_semantic_breaker_open") == 1
    # The Redis side's breaker stayed closed: an identical request is an exact hit read there.
    again = await collect(m.stub.Generate(greedy(prompt="q0", cache="semantic", request_id="again")))
    assert all(c.cached and c.cache_kind == "exact" for c in again) and m.a.calls + m.b.calls == 3
    # A new question meanwhile: generated, with no lookup by meaning.
    new = await collect(m.stub.Generate(greedy(prompt="q9", cache="semantic")))
    assert joined(new) == "".join(PIECES) and not any(c.cached for c in new) and m.a.calls + m.b.calls == 4


@pytest.mark.parametrize(("cache", "reads_redis"), [("dead-port", False), ("dead-redis", False), ("dead-redis", True)])
async def test_cache_down_request_is_still_served(mesh: MeshFactory, cache: str, reads_redis: bool) -> None:
    m = await mesh(cache=cache, cache_timeout_s=0.5, reads_redis=reads_redis)
    for i in range(2):
        # Two prompts: a second identical one could replay the first's answer from memory.
        chunks = await collect(m.stub.Generate(greedy(prompt=f"Hello {i}")))
        assert joined(chunks) == "".join(PIECES) and not any(c.cached for c in chunks)
    assert m.a.calls == 2


async def test_router_down_is_unavailable(mesh: MeshFactory) -> None:
    m = await mesh(router="down", cache="off")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await collect(m.stub.Generate(greedy()))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "router unavailable" in err.value.details()


async def test_complete_aggregates_text_and_usage(mesh: MeshFactory) -> None:
    m = await mesh(cache="off")
    request = pb.GenerateRequest(prompt="Hi", max_tokens=3, request_id="c1")
    resp = await m.stub.Complete(request, timeout=WAIT_S)
    assert resp.text == "".join(PIECES)
    assert list(resp.token_ids) == [10, 11, 12]
    assert resp.finish_reason == "length" and resp.usage == pb.Usage(prompt_tokens=4, completion_tokens=3)
    assert resp.request_id == "c1" and resp.worker == "A" and not resp.cached


async def test_complete_maps_mid_stream_failure_to_unavailable(mesh: MeshFactory) -> None:
    m = await mesh(a="die_mid", b="unavailable", cache="off")
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await m.stub.Complete(greedy(), timeout=WAIT_S)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "worker lost mid-stream" in err.value.details()


async def test_complete_of_a_migrated_stream_is_the_whole_answer(mesh: MeshFactory) -> None:
    m = await mesh(a="die_mid", cache="off")
    resp = await m.stub.Complete(greedy(), timeout=WAIT_S)
    assert resp.text == "".join(PIECES) and list(resp.token_ids) == [10, 11, 12]
    assert resp.usage.completion_tokens == len(PIECES) and resp.worker == "B"


# -- coalescing: identical requests in flight share one generation ----------------------------------


async def _first_chunk(call: Any) -> pb.GenerateResponse:
    async with asyncio.timeout(WAIT_S):
        return await call.read()


async def _rest(call: Any) -> list[pb.GenerateResponse]:
    async with asyncio.timeout(WAIT_S):
        out = []
        while (chunk := await call.read()) is not grpc.aio.EOF:
            out.append(chunk)
        return out


@pytest.mark.parametrize("cache", ["real", "off"])
async def test_identical_requests_in_flight_share_one_generation(mesh: MeshFactory, cache: str) -> None:
    m = await mesh(a="hold", cache=cache)
    coalesced = sample("meshserve_gateway_coalesced_total")
    calls = [m.stub.Generate(greedy(request_id=f"r{i}")) for i in range(5)]
    # Every one has its first token while the worker holds the only generation after it.
    firsts = [await _first_chunk(call) for call in calls]
    m.a.release.set()
    answers = [[first, *await _rest(call)] for first, call in zip(firsts, calls, strict=True)]

    assert m.a.calls + m.b.calls == 1
    for i, chunks in enumerate(answers):
        assert joined(chunks) == "".join(PIECES) and tokens(chunks) == [10, 11, 12]
        assert {c.request_id for c in chunks} == {f"r{i}"} and chunks[-1].usage.completion_tokens == 3
        assert {c.worker for c in chunks} == {"A"} and not any(c.cached for c in chunks)
    kinds = sorted(tuple({c.cache_kind for c in chunks}) for chunks in answers)
    assert kinds == [("",), *[("coalesced",)] * 4]  # the leader's own generation, and four readers of it
    assert sample("meshserve_gateway_coalesced_total") == coalesced + 4


async def test_a_leaving_leader_or_follower_does_not_end_the_others(mesh: MeshFactory) -> None:
    m = await mesh(a="hold", cache="off")
    leader, follower, other = (m.stub.Generate(greedy(request_id=r)) for r in ("lead", "f1", "f2"))
    for call in (leader, follower, other):
        assert (await _first_chunk(call)).text == PIECES[0]
    leader.cancel()
    follower.cancel()
    m.a.release.set()
    assert joined(await _rest(other)) == "".join(PIECES[1:])
    assert m.a.calls == 1 and not m.a.cancelled.is_set()


async def test_the_last_reader_leaving_cancels_the_generation(mesh: MeshFactory) -> None:
    m = await mesh(a="hold", cache="off")
    calls = [m.stub.Generate(greedy(request_id=r)) for r in ("a", "b")]
    for call in calls:
        await _first_chunk(call)
    for call in calls:
        call.cancel()
    async with asyncio.timeout(WAIT_S):
        await m.a.cancelled.wait()
    # The key is free again: the next identical request starts a generation of its own.
    m.a.mode = "ok"
    assert joined(await collect(m.stub.Generate(greedy()))) == "".join(PIECES) and m.a.calls == 2


async def test_a_failing_generation_fails_every_reader(mesh: MeshFactory) -> None:
    m = await mesh(a="hold", cache="off", migrations=0)
    calls = [m.stub.Generate(greedy(request_id=r)) for r in ("a", "b")]
    for call in calls:
        await _first_chunk(call)
    m.a.mode = "die_mid"  # the held generation dies after its next chunk
    m.a.release.set()
    for call in calls:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await _rest(call)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert m.a.calls == 1


@pytest.mark.parametrize(
    ("second", "cfg"),
    [
        (greedy(), {"coalesce": False}),                                  # turned off
        (pb.GenerateRequest(prompt="Hello there", max_tokens=3, temperature=0.7), {}),  # sampled
        (greedy(skip_cache=True), {}),                                    # opted out
        (greedy(prompt="Hello here"), {}),                                # another prompt
    ],
)
async def test_requests_that_must_not_share_a_generation_do_not(
    mesh: MeshFactory, second: pb.GenerateRequest, cfg: dict[str, Any]
) -> None:
    m = await mesh(a="hold", b="hold", cache="off", **cfg)
    first = m.stub.Generate(greedy())
    await _first_chunk(first)
    other = m.stub.Generate(second)
    await _first_chunk(other)  # while the first is held: a coalesced one would have it too
    m.a.release.set()
    await _rest(first)
    assert joined(await _rest(other)) == "".join(PIECES[1:])
    assert m.a.calls == 2


async def test_another_tenants_identical_request_is_not_coalesced(mesh: MeshFactory) -> None:
    m = await mesh(a="hold", cache="off")
    first = m.stub.Generate(greedy())
    await _first_chunk(first)
    other = m.stub.Generate(greedy(), metadata=((TENANT_METADATA, "other"),))
    await _first_chunk(other)
    m.a.release.set()
    for call in (first, other):
        await _rest(call)
    assert m.a.calls == 2
