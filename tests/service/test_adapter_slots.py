"""An adapter that no worker's slots hold gets one while the others keep being asked: real sim
workers of one adapter slot each (their engines skip a request whose adapter has no slot, as
vLLM's scheduler does, for as long as the running adapter has requests), behind a gateway with
the router embedded on its default policy. Requests on ``x`` and ``y`` never stop arriving, so
each worker's slot is always running one of them; a request on ``z`` must still be answered
while they arrive, not after."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from meshserve.commands.gateway_service import start as start_gateway
from meshserve.services.config import EMBEDDED_ROUTER, GatewayConfig, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from meshserve.worker.server import start_worker
from tests.integration.helpers import until_router_hears

TIMEOUT = 30.0
ADAPTERS = ("x", "y", "z")
STREAMS_PER_ADAPTER = 6
# Requests on x and y the feeders make at most: far more than a slot takes to drain, far fewer
# than a request waiting for as long as its worker's running adapter has requests would see.
FEED = 400
PROMPT = "Where is my parcel? It was sent last week and the tracking page has not changed since. " * 8


@pytest.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    workers = [await start_worker(WorkerConfig(
        host="127.0.0.1", port=0, metrics_port=-1, engine="sim", worker_id=f"w{i}", grace_seconds=1.0,
        sim_itl_base_ms=1.0, enable_lora=True, max_loras=1, lora_modules=[f"{a}=/adapters/{a}" for a in ADAPTERS]))
        for i in range(2)]
    gateway = await start_gateway(GatewayConfig(
        port=0, metrics_port=-1, grace_seconds=1, router=EMBEDDED_ROUTER, cache="",
        workers=[f"127.0.0.1:{running.port}" for running, _ in workers]))
    try:
        async with insecure_channel(f"127.0.0.1:{gateway.port}") as ch:
            await until_router_hears(ch, 2)
            yield ch
    finally:
        await gateway.shutdown()
        for running, _ in workers:
            await running.shutdown()


async def ask(channel: grpc.aio.Channel, adapter: str, max_tokens: int) -> pb.GenerateResponse:
    # One long prompt per adapter: its worker's prefix cache holds it, which draws the adapter's
    # requests there as much as its slot does.
    req = pb.GenerateRequest(prompt=PROMPT, max_tokens=max_tokens, temperature=0, model=adapter, cache="off")
    return [c async for c in pb_grpc.InferenceStub(channel).Generate(req, timeout=TIMEOUT)][-1]


async def test_an_adapter_in_no_slot_starts_while_the_running_adapters_keep_being_asked(
    channel: grpc.aio.Channel,
) -> None:
    fed: list[str] = []
    both_answered = asyncio.Event()

    async def feed(adapter: str, max_tokens: int) -> None:
        while len(fed) < FEED:
            await ask(channel, adapter, max_tokens)
            fed.append(adapter)
            if {"x", "y"} <= set(fed):
                both_answered.set()

    # Streams of different lengths, so that they end apart and a slot never empties by chance.
    feeders = [asyncio.create_task(feed(a, 24 + 7 * i)) for a in ("x", "y") for i in range(STREAMS_PER_ADAPTER)]
    try:
        # Both slots run (x and y each answered at least once) before z asks.
        await asyncio.wait_for(both_answered.wait(), TIMEOUT)
        answer = await ask(channel, "z", max_tokens=4)
        answered_after = len(fed)
    finally:
        await asyncio.gather(*feeders)
    assert answer.finish_reason == "length"
    assert answered_after < FEED, "z waited until the requests on x and y stopped"
