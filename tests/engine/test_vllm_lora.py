"""LoRA adapters on the real vLLM engine: a worker started with two adapters made by `meshserve
make-adapter` answers a request naming one as vLLM's own offline ``LLM`` does with that adapter's
``LoRARequest`` (greedy, token for token), and not as the base model does; an adapter loaded at run
time through a gateway (/v1/load_lora_adapter's service) answers so too, and one vLLM refuses is
refused with vLLM's reason while the worker serves on."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from meshserve.commands.gateway_service import start as start_gateway
from meshserve.router.server import start_router
from meshserve.services.config import EMBEDDED_ROUTER, GatewayConfig, RouterConfig, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.prompts import block_hashes, chain_root
from meshserve.services.server import Running, insecure_channel
from meshserve.worker.engine import Request
from meshserve.worker.server import WorkerServicer, start_worker
from tests.conftest import free_port
from tests.integration.helpers import index_blocks, prefix_view_ready, until

pytestmark = pytest.mark.engine

TIMEOUT = 120.0
MAX_TOKENS = 24
PROMPTS = ["The capital of France is", "Once upon a time there was a grey cat"]
ENGINE = dict(dtype="float32", max_model_len=512, kv_cache_memory_bytes=64 * 2**20, enforce_eager=True)

# vLLM's offline engine, in a process of its own (its engine core in that process): each prompt's
# greedy token ids on the base model and on each adapter.
OFFLINE = """
import json, sys
from vllm import LLM, SamplingParams
from vllm.lora.request import LoRARequest
model, adapters, prompts, max_tokens, engine = json.loads(sys.argv[1])
llm = LLM(model=model, enable_lora=True, max_loras=len(adapters), max_lora_rank=8, **engine)
params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
out = {}
for i, name in enumerate(["", *adapters], start=0):
    lora = LoRARequest(name, i, adapters[name]) if name else None
    out[name] = [o.outputs[0].token_ids for o in llm.generate(prompts, params, lora_request=lora, use_tqdm=False)]
print(json.dumps(out))
"""


def make_adapter(name: str, *flags: str) -> str:
    """The folder `meshserve make-adapter NAME` prints on its last line."""
    out = subprocess.run([sys.executable, "-m", "meshserve.commands.cli", "make-adapter", name, *flags],
                         capture_output=True, text=True, check=True, timeout=TIMEOUT)
    return out.stdout.splitlines()[-1]


@pytest.fixture(scope="module")
def adapters() -> dict[str, str]:
    return {name: make_adapter(name) for name in ("alpha", "beta")}


@pytest.fixture(scope="module")
def late() -> str:
    """An adapter the worker does not start with: loaded at run time."""
    return make_adapter("gamma")


@pytest.fixture(scope="module")
def offline(tiny_model: Path, adapters: dict[str, str], late: str) -> dict[str, list[list[int]]]:
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    args = json.dumps([str(tiny_model), {**adapters, "gamma": late}, PROMPTS, MAX_TOKENS, ENGINE])
    out = subprocess.run([sys.executable, "-c", OFFLINE, args], capture_output=True, text=True, env=env,
                         timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
async def worker(tiny_model: Path, adapters: dict[str, str]) -> AsyncIterator[tuple[Running, WorkerServicer]]:
    cfg = WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="vllm", model=str(tiny_model),
                       grace_seconds=5.0, enable_lora=True, max_loras=2, max_lora_rank=8,
                       lora_modules=[f"{name}={path}" for name, path in adapters.items()], **ENGINE)
    running, servicer = await start_worker(cfg)
    yield running, servicer
    await running.shutdown()


async def greedy(stub: pb_grpc.WorkerStub, prompt: str, model: str) -> list[int]:
    request = pb.GenerateRequest(prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, model=model)
    return [t async for c in stub.Generate(request, timeout=TIMEOUT) for t in c.token_ids]


async def test_each_adapter_answers_as_vllm_offline_does_with_it(
    stub: pb_grpc.WorkerStub, offline: dict[str, list[list[int]]]
) -> None:
    for i, prompt in enumerate(PROMPTS):
        ours = {name: await greedy(stub, prompt, name) for name in ("", "alpha", "beta")}
        assert ours == {name: offline[name][i] for name in ours}, prompt
        assert len({tuple(tokens) for tokens in ours.values()}) == 3, "an adapter answered as the base model"


async def test_the_worker_says_which_adapters_it_serves(stub: pb_grpc.WorkerStub, adapters: dict[str, str]) -> None:
    info = await stub.Info(pb.InfoRequest(), timeout=TIMEOUT)
    assert {a.name: a.path for a in info.lora.adapters} == adapters
    assert (info.lora.max_loras, info.lora.max_lora_rank, info.lora.max_cpu_loras) == (2, 8, 2)


async def test_an_adapter_it_does_not_serve_is_not_found(stub: pb_grpc.WorkerStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await greedy(stub, PROMPTS[0], "gamma")
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert "'gamma'" in (refused.value.details() or "")


async def test_an_adapters_blocks_are_reported_under_its_own_chain(
    stub: pb_grpc.WorkerStub, worker: tuple[Running, WorkerServicer]
) -> None:
    """vLLM's KV events name the adapter of a block: the worker reports an adapter's prompt
    blocks on the adapter's chain, never as the base model's blocks of the same tokens."""
    engine = worker[1].engine
    prompt = " ".join(f"adapter block {i}" for i in range(40))
    ids = engine.tokenize(Request(request_id="ids", prompt=prompt))
    own = block_hashes(ids, engine.info.block_size, parent=chain_root("alpha"))
    base = block_hashes(ids, engine.info.block_size)
    assert len(own) >= 2
    await greedy(stub, prompt, "alpha")
    view = engine.kv_cache
    assert view is not None
    await until(lambda: asyncio.sleep(0, all(h in view for h in own)), "the adapter's blocks in the KV events",
                TIMEOUT)
    assert not any(h in view for h in base)


# -- adapters at run time, through a gateway ---------------------------------------------------


@asynccontextmanager
async def serving_gateway(worker: tuple[Running, WorkerServicer], **settings: Any) -> AsyncIterator[grpc.aio.Channel]:
    """A gateway over the module's worker (its router embedded) that loads adapters at run time,
    once its router has heard from the worker (what adapters it holds, that it has LoRA on)."""
    running = await start_gateway(GatewayConfig(
        port=0, metrics_port=-1, grace_seconds=1, router=EMBEDDED_ROUTER, cache="",
        workers=[f"127.0.0.1:{worker[0].port}"], allow_runtime_lora_updating=True, **settings))
    channel = insecure_channel(f"127.0.0.1:{running.port}")
    router = pb_grpc.RouterStub(channel)

    async def serving() -> bool:
        return any(w.healthy for w in (await router.ListWorkers(pb.ListWorkersRequest(), timeout=TIMEOUT)).workers)

    try:
        await until(serving, "the gateway's router to hear from the worker", TIMEOUT)
        yield channel
    finally:
        await channel.close()
        await running.shutdown()


@pytest.fixture(scope="module")
async def gateway(worker: tuple[Running, WorkerServicer]) -> AsyncIterator[grpc.aio.Channel]:
    async with serving_gateway(worker) as channel:
        yield channel


async def via_mesh(channel: grpc.aio.Channel, prompt: str, model: str) -> list[int]:
    request = pb.GenerateRequest(prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True, model=model)
    return [t async for c in pb_grpc.InferenceStub(channel).Generate(request, timeout=TIMEOUT) for t in c.token_ids]


async def engine_loras(worker: tuple[Running, WorkerServicer]) -> set[int]:
    """The LoRA ids vLLM's engine holds loaded, as vLLM itself lists them."""
    return set(await worker[1].engine._llm.list_loras())  # type: ignore[attr-defined]


async def test_an_adapter_loaded_at_run_time_answers_as_vllm_offline_and_unloaded_is_gone(
    gateway: grpc.aio.Channel, worker: tuple[Running, WorkerServicer], late: str,
    offline: dict[str, list[list[int]]],
) -> None:
    admin = pb_grpc.AdaptersStub(gateway)
    before = await engine_loras(worker)
    await admin.LoadLoraAdapter(pb.LoadLoraAdapterRequest(lora_name="gamma", lora_path=late), timeout=TIMEOUT)
    [gamma_id] = await engine_loras(worker) - before
    for i, prompt in enumerate(PROMPTS):
        assert await via_mesh(gateway, prompt, "gamma") == offline["gamma"][i], prompt

    await admin.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="gamma"), timeout=TIMEOUT)
    assert gamma_id not in await engine_loras(worker)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await via_mesh(gateway, PROMPTS[0], "gamma")
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND


async def test_an_adapter_vllm_refuses_is_refused_with_its_reason_and_the_worker_serves_on(
    gateway: grpc.aio.Channel, stub: pb_grpc.WorkerStub, adapters: dict[str, str], tmp_path: Path,
    offline: dict[str, list[list[int]]],
) -> None:
    admin = pb_grpc.AdaptersStub(gateway)
    wide = make_adapter("wide", "--rank", "16")  # the worker's slots hold rank 8 at most
    cases = {"missing": (str(tmp_path / "nothing"), f"No adapter found for {tmp_path / 'nothing'}"),
             "wide": (wide, "LoRA rank 16 is greater than max_lora_rank 8")}
    for name, (path, reason) in cases.items():
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await admin.LoadLoraAdapter(pb.LoadLoraAdapterRequest(lora_name=name, lora_path=path), timeout=TIMEOUT)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert reason in (refused.value.details() or "")
    info = await stub.Info(pb.InfoRequest(), timeout=TIMEOUT)
    assert [a.name for a in info.lora.adapters] == list(adapters)
    assert await via_mesh(gateway, PROMPTS[0], "alpha") == offline["alpha"][0]


async def test_an_adapter_of_the_registry_is_loaded_once_for_requests_that_ask_at_once(
    worker: tuple[Running, WorkerServicer], late: str, offline: dict[str, list[list[int]]], tmp_path: Path,
) -> None:
    registry = tmp_path / "adapters.txt"
    registry.write_text(f"gamma={late}\n")
    async with serving_gateway(worker, lora_registry=str(registry)) as channel:
        before = await engine_loras(worker)
        answers = await asyncio.gather(*(via_mesh(channel, PROMPTS[1], "gamma") for _ in range(4)))
        assert answers == [offline["gamma"][1]] * 4
        assert len(await engine_loras(worker) - before) == 1  # one load, by vLLM's own list
        await pb_grpc.AdaptersStub(channel).UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="gamma"),
                                                              timeout=TIMEOUT)


LONG = " ".join(f"Parcel {i} left the depot at dawn and reached the hub by noon." for i in range(12))


async def test_the_router_predicts_the_tokens_vllm_finds_cached_for_an_adapter(
    worker: tuple[Running, WorkerServicer], stub: pb_grpc.WorkerStub,
) -> None:
    """vLLM hashes an adapter into its blocks; the router hashes the adapter's prompt on the
    adapter's own chain from vLLM's KV events, and predicts for the next request on it the cached
    tokens vLLM reports, within a block."""
    # A router of its own over the worker and one that is down: with one worker to choose from, a
    # router predicts nothing.
    router = await start_router(RouterConfig(port=0, metrics_port=-1, grace_seconds=0.5, routing="kv-aware",
                                             workers=[f"127.0.0.1:{worker[0].port}", f"127.0.0.1:{free_port()}"]))
    channel = insecure_channel(f"127.0.0.1:{router.port}")
    picks = pb_grpc.RouterStub(channel)

    async def ready() -> bool:
        listing = await picks.ListWorkers(pb.ListWorkersRequest(), timeout=5)
        return prefix_view_ready() == 1 and any(w.healthy for w in listing.workers)

    block = worker[1].engine.info.block_size
    try:
        await until(ready, "the router to hear from the worker and load its tokenizer", TIMEOUT)
        before = index_blocks() or 0
        first = pb.GenerateRequest(prompt=LONG + " First?", max_tokens=2, temperature=0, model="beta")
        prompt_tokens = [c async for c in stub.Generate(first, timeout=TIMEOUT)][-1].usage.prompt_tokens
        assert prompt_tokens > 4 * block

        async def indexed() -> bool:
            return (index_blocks() or 0) >= before + 4

        await until(indexed, "the router to index the adapter's new blocks", TIMEOUT)
        pick = await picks.Pick(pb.PickRequest(request_id="kv-beta", prompt=LONG + " Second?", adapter="beta"),
                                timeout=10)
        on_base = await picks.Pick(pb.PickRequest(request_id="kv-base", prompt=LONG + " Second?"), timeout=10)
    finally:
        await channel.close()
        await router.shutdown()
    second = pb.GenerateRequest(prompt=LONG + " Second?", max_tokens=2, temperature=0, model="beta")
    cached = [c async for c in stub.Generate(second, timeout=TIMEOUT)][-1].usage.cached_prompt_tokens
    assert cached >= 4 * block, "vLLM found the adapter's prefix cached"
    assert abs(pick.predicted_cached_tokens - cached) <= block
    assert on_base.predicted_cached_tokens == 0  # the base model's chain holds none of it


@pytest.fixture
async def stub(worker: tuple[Running, WorkerServicer]) -> AsyncIterator[pb_grpc.WorkerStub]:
    async with insecure_channel(f"127.0.0.1:{worker[0].port}") as channel:
        yield pb_grpc.WorkerStub(channel)
