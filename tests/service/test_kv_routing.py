"""KV-aware routing against real sim workers: the router's view of each worker's prefix cache
comes from the workers' KV-event streams, agrees with what the engine then reports, follows a
worker that goes away, and is rebuilt by a router that restarts."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import grpc
import pytest

from meshserve.router import prefix
from meshserve.router.server import start_router
from meshserve.services.config import RouterConfig, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.offload import OFFLOAD_CHARS
from meshserve.services.prompts import SimEncoder
from meshserve.services.server import Running, insecure_channel
from tests.integration.helpers import index_blocks, prefix_view_ready, until
from meshserve.worker.server import WorkerServicer, start_worker

PREFIX = " ".join(f"w{i:03d}" for i in range(200))  # 200 sim tokens: 12 full blocks of 16


async def pick(router: pb_grpc.RouterStub, prompt: str) -> pb.PickResponse:
    return await router.Pick(pb.PickRequest(request_id="probe", prompt=prompt), timeout=5)



async def indexed(blocks: int = 12) -> bool:
    """Whether the router's index holds ``blocks`` blocks (PREFIX's 12, by default)."""
    return (index_blocks() or 0) >= blocks


async def compute_prefix(router: pb_grpc.RouterStub, address: str, what: str, blocks: int = 12) -> None:
    """PREFIX computed on the worker at ``address`` (directly, not through the router), then
    awaited in the router's index (``blocks`` in all), reported by that worker's events, and the
    router's view of that worker idle again (the engine caches a prompt's blocks when it
    schedules them, so the events can come before the report that the request finished)."""
    await generate(address, PREFIX + " first question")
    await until(lambda: indexed(blocks), what)

    async def idle() -> bool:
        listed = await router.ListWorkers(pb.ListWorkersRequest(), timeout=5)
        load = next(w.load for w in listed.workers if w.address == address)
        return load.num_running + load.num_waiting == 0

    await until(idle, f"the router to see {address} idle")


async def generate(address: str, prompt: str) -> list[pb.GenerateResponse]:
    async with insecure_channel(address) as channel:
        stub = pb_grpc.WorkerStub(channel)
        req = pb.GenerateRequest(request_id=prompt[-8:], prompt=prompt, max_tokens=2, temperature=0, ignore_eos=True)
        return [c async for c in stub.Generate(req, timeout=10)]


async def start_sim_workers(n: int) -> list[tuple[Running, str]]:
    """``n`` sim workers, kv0 onwards, and their addresses."""
    started = []
    for i in range(n):
        cfg = WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="sim", worker_id=f"kv{i}",
                           grace_seconds=1.0, sim_itl_base_ms=1.0)
        running, _ = await start_worker(cfg)
        started.append((running, f"127.0.0.1:{running.port}"))
    return started


@pytest.fixture
async def workers() -> AsyncIterator[list[tuple[Running, str]]]:
    started = await start_sim_workers(2)
    yield started
    for running, _ in started:
        await running.shutdown()


async def router_on(addresses: list[str]) -> tuple[Running, pb_grpc.RouterStub, object]:
    running = await start_router(RouterConfig(port=0, metrics_port=-1, grace_seconds=0.5, routing="kv-aware",
                                              workers=addresses))
    channel = insecure_channel(f"127.0.0.1:{running.port}")
    return running, pb_grpc.RouterStub(channel), channel


async def test_router_predicts_the_engines_cached_tokens_and_follows_its_workers(
    workers: list[tuple[Running, str]],
) -> None:
    addresses = [a for _, a in workers]
    router, stub, channel = await router_on(addresses)
    try:
        # The prefix is computed on kv1 only. Picks are not probed until the index is filled: a
        # pick is also remembered as pending on its worker, and the test is about what the
        # workers' events say.
        await compute_prefix(stub, addresses[1], "the router to index kv1's blocks")
        choice = await pick(stub, PREFIX + " second question")
        assert choice.worker_id == "kv1"
        answer = await generate(choice.address, PREFIX + " second question")
        # What the engine found cached is what the router predicted, to the token here.
        assert answer[-1].usage.cached_prompt_tokens == choice.predicted_cached_tokens == 12 * 16

        # A restarted router rebuilds its view from the workers' streams.
        await router.shutdown()
        await channel.close()
        router, stub, channel = await router_on(addresses)
        await until(indexed, "a new router to learn kv1's cache from its stream")
        again = await pick(stub, PREFIX + " third question")
        assert (again.worker_id, again.predicted_cached_tokens) == ("kv1", 12 * 16)

        # kv1 goes away: its blocks leave the index with its stream.
        await workers[1][0].shutdown()

        async def forgotten() -> bool:
            try:
                p = await pick(stub, PREFIX + " second question")
            except grpc.aio.AioRpcError:
                return False
            return p.worker_id == "kv0" and p.predicted_cached_tokens == 0

        await until(forgotten, "the router to drop kv1's blocks")
    finally:
        await router.shutdown()
        await channel.close()


async def test_a_pick_with_one_worker_to_choose_from_does_not_work_out_the_prompt(
    workers: list[tuple[Running, str]],
) -> None:
    """With one worker left to choose from (the others excluded, or the only one), the prompt's
    blocks would change nothing: the router does not work them out, so it predicts no cached
    tokens and records no pending blocks, even on a worker that holds the prefix."""
    addresses = [a for _, a in workers]
    router, stub, channel = await router_on(addresses)
    try:
        await compute_prefix(stub, addresses[0], "the router to index kv0's blocks")
        alone = await stub.Pick(pb.PickRequest(request_id="alone", prompt=PREFIX + " second question",
                                               exclude=["kv1"]), timeout=5)
        assert (alone.worker_id, alone.predicted_cached_tokens) == ("kv0", 0)
        assert index_blocks("pending") == 0
        choosing = await pick(stub, PREFIX + " second question")
        assert (choosing.worker_id, choosing.predicted_cached_tokens) == ("kv0", 12 * 16)
        assert (index_blocks("pending") or 0) >= 12
    finally:
        await router.shutdown()
        await channel.close()


async def test_a_long_prompt_is_hashed_off_the_loop_while_the_other_picks_are_answered(
    workers: list[tuple[Running, str]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A pick whose prompt is long is answered once its blocks are hashed in the router's thread,
    in a message of its own; the short picks of its batch are answered meanwhile, and its
    prediction is what it would have been on the loop."""
    hashing = threading.Event()
    release = threading.Event()
    encode = SimEncoder.encode

    def held_off_the_loop(self: SimEncoder, text: str, add_special_tokens: bool) -> object:
        if threading.current_thread() is not threading.main_thread() and len(text) >= OFFLOAD_CHARS:
            hashing.set()
            release.wait(30)
        return encode(self, text, add_special_tokens)

    monkeypatch.setattr(SimEncoder, "encode", held_off_the_loop)
    addresses = [a for _, a in workers]
    router, stub, channel = await router_on(addresses)
    try:
        await compute_prefix(stub, addresses[1], "the router to index kv1's blocks")
        long_prompt = PREFIX + " and then" * (OFFLOAD_CHARS // 9)
        call = stub.PickBatches()
        # The short pick goes to kv0: on kv1 it would add to kv1's load, which could outweigh the
        # long prompt's cached blocks there.
        short = pb.PickRequest(request_id="short", prompt="hello", pick_id=2, exclude=["kv1"])
        await call.write(pb.PickBatch(picks=[pb.PickRequest(request_id="long", prompt=long_prompt, pick_id=1), short]))
        async with asyncio.timeout(5):
            first = await call.read()
        assert [a.pick_id for a in first.answers] == [2] and hashing.is_set()
        release.set()
        async with asyncio.timeout(5):
            second = await call.read()
        (answer,) = second.answers
        assert (answer.pick_id, answer.worker_id, answer.predicted_cached_tokens) == (1, "kv1", 12 * 16)
        await call.done_writing()
        assert await call.code() == grpc.StatusCode.OK
    finally:
        release.set()
        await router.shutdown()
        await channel.close()


async def test_picks_go_by_load_while_the_workers_tokenizer_loads(
    workers: list[tuple[Running, str]], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Hugging Face tokenizer takes seconds to load: the router loads it in a thread, the workers'
    reports and KV events flow meanwhile and picks predict nothing; once it is loaded, they do."""
    loaded = threading.Event()

    def slow_load(name: str) -> SimEncoder:
        loaded.wait(30)
        return SimEncoder()

    monkeypatch.setattr(prefix, "load_encoder", slow_load)
    monkeypatch.setattr(prefix, "SIM_TOKENIZER", "")  # the sim's tokenizer loads as any other would
    addresses = [a for _, a in workers]
    router, stub, channel = await router_on(addresses)
    try:
        await compute_prefix(stub, addresses[1], "the router to index kv1's blocks while its tokenizer loads")
        waiting = await pick(stub, PREFIX + " second question")
        assert waiting.predicted_cached_tokens == 0
        assert prefix_view_ready() == 0
        loaded.set()

        async def ready() -> bool:
            return prefix_view_ready() == 1

        await until(ready, "the tokenizer to load")
        choice = await pick(stub, PREFIX + " third question")
        assert (choice.worker_id, choice.predicted_cached_tokens) == ("kv1", 12 * 16)
    finally:
        loaded.set()
        await router.shutdown()
        await channel.close()


async def test_each_models_repeated_prompt_goes_to_the_worker_holding_its_blocks() -> None:
    """A mesh serving two base models whose engines hash prompts differently (blocks of 16 tokens
    and of 32), two workers each: the router hashes each model's prompts as that model's engines
    do, so a repeated prompt of either goes to the worker holding its blocks."""
    started = []
    for i, (model, block_size) in enumerate([("small", 16), ("small", 16), ("large", 32), ("large", 32)]):
        running, _ = await start_worker(WorkerConfig(
            host="127.0.0.1", port=0, metrics_port=-1, engine="sim", worker_id=f"kv{i}", grace_seconds=1.0,
            sim_itl_base_ms=1.0, served_model_name=model, block_size=block_size))
        started.append((running, f"127.0.0.1:{running.port}"))
    addresses = [a for _, a in started]
    router, stub, channel = await router_on(addresses)
    try:
        await compute_prefix(stub, addresses[1], "the router to index kv1's blocks of 16")
        await compute_prefix(stub, addresses[3], "the router to index kv3's blocks of 32", blocks=12 + 6)
        for model, holder, cached in [("small", "kv1", 12 * 16), ("large", "kv3", 6 * 32)]:
            choice = await stub.Pick(pb.PickRequest(request_id=model, prompt=PREFIX + " second question",
                                                    model=model), timeout=5)
            assert (choice.worker_id, choice.predicted_cached_tokens) == (holder, cached), model
    finally:
        await router.shutdown()
        await channel.close()  # type: ignore[attr-defined]
        for running, _ in started:
            await running.shutdown()


async def test_a_busy_worker_merges_its_load_and_kv_changes_into_one_report_per_interval() -> None:
    cfg = WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="sim", worker_id="busy",
                       grace_seconds=1.0, sim_itl_base_ms=5.0, load_report_min_interval_s=0.2,
                       load_report_interval_s=5.0)
    running, servicer = await start_worker(cfg)
    pool = servicer.engine._pool  # the sim engine's own block pool: the hashes it caches
    address = f"127.0.0.1:{running.port}"
    loop = asyncio.get_running_loop()
    try:
        async with insecure_channel(address) as channel:
            stub = pb_grpc.WorkerStub(channel)
            opened = loop.time()
            call = stub.WatchLoad(pb.WatchLoadRequest(kv_events=True))
            reports = [await call.read()]
            assert reports[0].kv.reset  # the first report says the whole cache
            held = set(reports[0].kv.stored)

            async def one(i: int) -> None:
                req = pb.GenerateRequest(request_id=f"busy{i}", prompt=f"{PREFIX} question {i}", max_tokens=200,
                                         temperature=0, ignore_eos=True)
                async for _ in stub.Generate(req, timeout=10):
                    pass

            # Eight requests at once: the engine's load and its cache change at every step.
            generating = asyncio.gather(*(one(i) for i in range(8)))
            while not generating.done() or held != set(pool._cached):
                report = await asyncio.wait_for(call.read(), 6)
                reports.append(report)
                assert not report.kv.reset
                held |= set(report.kv.stored)
                held -= set(report.kv.removed)
            await generating
            elapsed = loop.time() - opened
            call.cancel()
    finally:
        await running.shutdown()
    # What the reports said the engine holds is what it holds; its blocks and its load changed at
    # every one of its steps, yet no two reports came closer than the minimum interval.
    assert len(held) > 12 and reports[-1].requests_received == 8
    assert 3 <= len(reports) <= elapsed / 0.2 + 1, (len(reports), elapsed)


async def test_an_older_worker_s_kv_events_are_read_from_their_own_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers from before KV events rode on WatchLoad send their reports without them: the router
    reads their WatchKvEvents streams instead and knows their caches all the same (two of them:
    with one, the router has no choice to make and predicts nothing)."""
    real = WorkerServicer.WatchLoad

    def older(self: WorkerServicer, request: pb.WatchLoadRequest, context: grpc.aio.ServicerContext):  # noqa: ANN202
        return real(self, pb.WatchLoadRequest(), context)  # the kv_events field unknown to it

    monkeypatch.setattr(WorkerServicer, "WatchLoad", older)  # before the workers' servers start
    workers = await start_sim_workers(2)
    addresses = [a for _, a in workers]
    router, stub, channel = await router_on(addresses)
    try:
        await compute_prefix(stub, addresses[1], "the router to index the older workers' blocks")
        choice = await pick(stub, PREFIX + " second question")
        assert (choice.worker_id, choice.predicted_cached_tokens) == ("kv1", 12 * 16)
    finally:
        await router.shutdown()
        await channel.close()
        for running, _ in workers:
            await running.shutdown()


async def test_an_adapters_cached_tokens_are_predicted_on_its_own_chain() -> None:
    """A prompt computed on a LoRA adapter is cached on the adapter's chain: the router predicts
    for the next request on that adapter the tokens the engine then finds cached, and none for
    the same prompt on the base model (whose blocks those are not)."""
    started = []
    for i in range(2):
        running, _ = await start_worker(WorkerConfig(
            host="127.0.0.1", port=0, metrics_port=-1, engine="sim", worker_id=f"kv{i}", grace_seconds=1.0,
            sim_itl_base_ms=1.0, enable_lora=True, lora_modules=["alpha=/adapters/alpha"]))
        started.append((running, f"127.0.0.1:{running.port}"))
    addresses = [a for _, a in started]
    router, stub, channel = await router_on(addresses)
    try:
        async with insecure_channel(addresses[1]) as worker:
            first = pb.GenerateRequest(prompt=PREFIX + " first question", max_tokens=2, temperature=0, model="alpha")
            [c async for c in pb_grpc.WorkerStub(worker).Generate(first, timeout=10)]
        await until(indexed, "the router to index kv1's blocks of the adapter")
        second = PREFIX + " second question"
        base = await stub.Pick(pb.PickRequest(request_id="base", prompt=second), timeout=5)
        assert base.predicted_cached_tokens == 0
        choice = await stub.Pick(pb.PickRequest(request_id="alpha", prompt=second, adapter="alpha"), timeout=5)
        assert choice.worker_id == "kv1"
        async with insecure_channel(choice.address) as worker:
            request = pb.GenerateRequest(prompt=second, max_tokens=2, temperature=0, model="alpha")
            answer = [c async for c in pb_grpc.WorkerStub(worker).Generate(request, timeout=10)]
        assert answer[-1].usage.cached_prompt_tokens == choice.predicted_cached_tokens == 12 * 16
    finally:
        await channel.close()  # type: ignore[attr-defined]
        await router.shutdown()
        for running, _ in started:
            await running.shutdown()
