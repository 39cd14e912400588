"""A gateway with the router embedded (``--router embedded``): it picks in its own process from
its own watch of real sim workers, with the router's policies, KV view and refusals, and serves
the router's ListWorkers itself."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from meshserve.commands.gateway_service import start as start_gateway
from meshserve.services.config import EMBEDDED_ROUTER, GatewayConfig, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import Running, insecure_channel
from tests.integration.helpers import index_blocks, until
from meshserve.worker.server import start_worker

PREFIX = " ".join(f"e{i:03d}" for i in range(200))  # 200 sim tokens: 12 full blocks of 16


@pytest.fixture
async def workers() -> AsyncIterator[list[str]]:
    started: list[Running] = []
    for i in range(2):
        cfg = WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="sim", worker_id=f"e{i}",
                           grace_seconds=1.0, sim_itl_base_ms=1.0)
        running, _ = await start_worker(cfg)
        started.append(running)
    yield [f"127.0.0.1:{r.port}" for r in started]
    for running in started:
        await running.shutdown()


async def gateway_on(addresses: list[str], routing: str) -> tuple[Running, grpc.aio.Channel]:
    cfg = GatewayConfig(port=0, metrics_port=-1, grace_seconds=1, router=EMBEDDED_ROUTER, cache="",
                        workers=addresses, routing=routing)
    running = await start_gateway(cfg)
    return running, insecure_channel(f"127.0.0.1:{running.port}")


async def ask(channel: grpc.aio.Channel, prompt: str) -> pb.GenerateResponse:
    stub = pb_grpc.InferenceStub(channel)
    req = pb.GenerateRequest(prompt=prompt, max_tokens=2, temperature=0, ignore_eos=True, cache="off")
    chunks = [c async for c in stub.Generate(req, timeout=10)]
    return chunks[-1]



async def straight(address: str, prompt: str) -> None:
    async with insecure_channel(address) as channel:
        req = pb.GenerateRequest(request_id=prompt[:8], prompt=prompt, max_tokens=2, temperature=0, ignore_eos=True)
        [c async for c in pb_grpc.WorkerStub(channel).Generate(req, timeout=10)]


def watchers_left() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("watch ")]


async def test_the_gateway_picks_itself_from_the_workers_kv_events_and_lists_them(workers: list[str]) -> None:
    running, channel = await gateway_on(workers, "kv-aware")
    try:
        router = pb_grpc.RouterStub(channel)  # the router's view, asked at the gateway's address

        async def both_reported() -> bool:
            listed = (await router.ListWorkers(pb.ListWorkersRequest(), timeout=5)).workers
            return len(listed) == 2 and all(w.healthy and w.HasField("load") for w in listed)

        async def settled() -> bool:  # the workers' reports account for every pick (no load bound at play)
            listed = (await router.ListWorkers(pb.ListWorkersRequest(), timeout=5)).workers
            return all(w.assigned_unreported == 0 and w.load.num_running + w.load.num_waiting == 0 for w in listed)

        await until(both_reported, "the gateway's router to hear from both workers")
        # Four prefixes computed straight on the workers, not through the gateway: prefix k on
        # worker k % 2. Only the engines' KV events can tell the gateway where each one is.
        prefixes = [f"{k} " + PREFIX for k in range(4)]
        for k, prefix in enumerate(prefixes):
            await straight(workers[k % 2], prefix + " first question")

        async def indexed() -> bool:
            return (index_blocks() or 0) >= 4 * 12

        await until(indexed, "the gateway's router to index the four prefixes")
        for k, prefix in enumerate(prefixes):
            await until(settled, "the workers to report the last request done")
            answer = await ask(channel, prefix + " second question")
            assert answer.worker == f"e{k % 2}"
            assert answer.usage.cached_prompt_tokens >= 12 * 16
    finally:
        await channel.close()
        await running.shutdown()
    assert not watchers_left(), "the gateway's watch of the workers outlived it"


async def test_round_robin_in_the_gateway_alternates_between_the_workers(workers: list[str]) -> None:
    running, channel = await gateway_on(workers, "round-robin")
    try:
        router = pb_grpc.RouterStub(channel)

        async def both_reported() -> bool:
            listed = (await router.ListWorkers(pb.ListWorkersRequest(), timeout=5)).workers
            return sum(w.healthy for w in listed) == 2

        await until(both_reported, "the gateway's router to hear from both workers")
        served = [(await ask(channel, f"round {i}")).worker for i in range(4)]
        assert sorted(served) == ["e0", "e0", "e1", "e1"]
        assert served[0] != served[1] and served[2] != served[3]
    finally:
        await channel.close()
        await running.shutdown()


async def test_with_no_worker_a_request_is_refused_at_once_with_a_reason() -> None:
    running, channel = await gateway_on([], "kv-aware")
    try:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await ask(channel, "anyone there?")
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "worker" in (refused.value.details() or "")
    finally:
        await channel.close()
        await running.shutdown()
