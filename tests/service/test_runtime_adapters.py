"""LoRA adapters loaded and unloaded across a fleet while it serves (the gateway's Adapters
service): real sim workers of the default model, two with LoRA enabled (ranks up to 16 and up to 8)
and one without, and one of a second base model with LoRA enabled, behind gateways with the router
embedded. The workers' own Info is what each test reads back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import grpc
import pytest

from meshserve.commands.gateway_service import start as start_gateway
from meshserve.services.config import DEFAULT_MODEL, EMBEDDED_ROUTER, SIM_MODEL, GatewayConfig, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from meshserve.worker.server import WorkerServicer, start_worker
from tests.integration.helpers import until

TIMEOUT = 10.0
TENANT = "x-meshserve-tenant"
OTHER_MODEL = "sim-b"
NONE_HELD = {"w0": [], "w1": [], "w2": [], "w3": []}


def adapter(folder: Path, rank: int = 8) -> str:
    """A folder the sim takes as an adapter: its PEFT config (the sim reads no weights)."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 2 * rank, "peft_type": "LORA"}))
    return str(folder)


@pytest.fixture(scope="module")
def servicers() -> dict[str, WorkerServicer]:
    """The workers' servicers by id (their engines)."""
    return {}


@pytest.fixture(scope="module")
async def workers(servicers: dict[str, WorkerServicer]) -> AsyncIterator[dict[str, str]]:
    """w0 (LoRA, rank <= 16), w1 (LoRA, rank <= 8), w2 (no LoRA), w3 (OTHER_MODEL, LoRA): id -> address."""
    async with AsyncExitStack() as stack:
        addresses = {}
        for i, lora in enumerate([dict(enable_lora=True, max_lora_rank=16), dict(enable_lora=True, max_lora_rank=8), {},
                                  dict(model=OTHER_MODEL, enable_lora=True, max_lora_rank=16)]):
            running, servicer = await start_worker(WorkerConfig(
                host="127.0.0.1", port=0, metrics_port=-1, engine="sim", worker_id=f"w{i}", grace_seconds=1.0,
                sim_itl_base_ms=1.0, **lora))
            stack.push_async_callback(running.shutdown)
            addresses[f"w{i}"] = f"127.0.0.1:{running.port}"
            servicers[f"w{i}"] = servicer
        yield addresses


Gateway = Callable[..., Awaitable[grpc.aio.Channel]]


@pytest.fixture
async def gateway(workers: dict[str, str]) -> AsyncIterator[Gateway]:
    """Starts a gateway on ``of`` (worker ids; all by default) once it sees them all healthy."""
    async with AsyncExitStack() as stack:

        async def start(of: tuple[str, ...] = ("w0", "w1", "w2"), **cfg: Any) -> grpc.aio.Channel:
            running = await start_gateway(GatewayConfig(
                port=0, metrics_port=-1, grace_seconds=1, router=EMBEDDED_ROUTER, cache="", routing="round-robin",
                workers=[workers[w] for w in of], **{"allow_runtime_lora_updating": True, **cfg}))
            stack.push_async_callback(running.shutdown)
            channel = insecure_channel(f"127.0.0.1:{running.port}")
            stack.push_async_callback(channel.close)
            router = pb_grpc.RouterStub(channel)

            async def all_serve() -> bool:
                listed = (await router.ListWorkers(pb.ListWorkersRequest(), timeout=TIMEOUT)).workers
                return len(listed) == len(of) and all(w.healthy for w in listed)

            await until(all_serve, "the gateway's router to hear from its workers")
            return channel

        yield start


async def held(workers: dict[str, str]) -> dict[str, list[str]]:
    """Each worker's adapters, as the worker itself says."""
    out = {}
    for worker, address in workers.items():
        async with insecure_channel(address) as channel:
            info = await pb_grpc.WorkerStub(channel).Info(pb.InfoRequest(), timeout=TIMEOUT)
            out[worker] = [a.name for a in info.lora.adapters]
    return out


async def ask(channel: grpc.aio.Channel, model: str, prompt: str = "Where is my parcel?") -> pb.GenerateResponse:
    req = pb.GenerateRequest(prompt=prompt, max_tokens=4, temperature=0, model=model, cache="off")
    return [c async for c in pb_grpc.InferenceStub(channel).Generate(req, timeout=TIMEOUT)][-1]


async def refusal(call: Awaitable[Any]) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    return refused.value


async def models(channel: grpc.aio.Channel) -> dict[str, pb.Model]:
    return {m.id: m for m in (await pb_grpc.OpenAIStub(channel).ListModels(pb.ListModelsRequest(), timeout=TIMEOUT)).data}


async def test_a_loaded_adapter_is_routed_and_listed_at_once_and_unloading_ends_it(
    gateway: Gateway, workers: dict[str, str], tmp_path: Path
) -> None:
    channel = await gateway()
    admin = pb_grpc.AdaptersStub(channel)
    path = adapter(tmp_path / "legal")
    loaded = await admin.LoadLoraAdapter(pb.LoadLoraAdapterRequest(lora_name="legal", lora_path=path), timeout=TIMEOUT)
    assert loaded.message == "Success: LoRA adapter 'legal' added successfully."
    assert sorted(loaded.workers) == ["w0", "w1"]
    assert await held(workers) == {"w0": ["legal"], "w1": ["legal"], "w2": [], "w3": []}
    # No wait: the call returned once this gateway's view showed it.
    card = (await models(channel))["legal"]
    assert (card.root, card.parent) == (path, DEFAULT_MODEL)
    assert {(await ask(channel, "legal", f"question {i}")).worker for i in range(4)} == {"w0", "w1"}

    again = await refusal(admin.LoadLoraAdapter(pb.LoadLoraAdapterRequest(lora_name="legal", lora_path=path),
                                                timeout=TIMEOUT))
    assert again.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert again.details() == "The lora adapter 'legal' has already been loaded."

    unloaded = await admin.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="legal"), timeout=TIMEOUT)
    assert unloaded.message == "Success: LoRA adapter 'legal' removed successfully."
    assert await held(workers) == NONE_HELD
    assert "legal" not in await models(channel)
    assert (await refusal(ask(channel, "legal"))).code() == grpc.StatusCode.NOT_FOUND
    unknown = await refusal(admin.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="legal"), timeout=TIMEOUT))
    assert unknown.code() == grpc.StatusCode.NOT_FOUND
    assert unknown.details() == "The lora adapter 'legal' cannot be found."


async def test_a_load_one_worker_refuses_is_undone_on_the_others(
    gateway: Gateway, workers: dict[str, str], tmp_path: Path
) -> None:
    channel = await gateway()
    admin = pb_grpc.AdaptersStub(channel)
    # Rank 16: w0's slots hold it, w1's (rank <= 8) do not.
    refused = await refusal(admin.LoadLoraAdapter(
        pb.LoadLoraAdapterRequest(lora_name="wide", lora_path=adapter(tmp_path / "wide", rank=16)), timeout=TIMEOUT))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.details() == "LoRA rank 16 is greater than max_lora_rank 8."
    assert await held(workers) == NONE_HELD

    missing = await refusal(admin.LoadLoraAdapter(
        pb.LoadLoraAdapterRequest(lora_name="gone", lora_path=str(tmp_path / "nothing")), timeout=TIMEOUT))
    assert missing.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert missing.details() == f"Loading lora gone failed: No adapter found for {tmp_path / 'nothing'}"
    assert await held(workers) == NONE_HELD
    assert "gone" not in await models(channel)
    assert (await ask(channel, DEFAULT_MODEL)).finish_reason  # the fleet serves on

    for request in (pb.LoadLoraAdapterRequest(lora_name="x"), pb.LoadLoraAdapterRequest(lora_path=str(tmp_path)),
                    pb.LoadLoraAdapterRequest(lora_name=DEFAULT_MODEL, lora_path=adapter(tmp_path / "b"))):
        assert (await refusal(admin.LoadLoraAdapter(request, timeout=TIMEOUT))).code() == grpc.StatusCode.INVALID_ARGUMENT


async def test_a_fleet_with_no_lora_worker_refuses_clearly(gateway: Gateway, tmp_path: Path) -> None:
    channel = await gateway(of=("w2",))
    refused = await refusal(pb_grpc.AdaptersStub(channel).LoadLoraAdapter(
        pb.LoadLoraAdapterRequest(lora_name="legal", lora_path=adapter(tmp_path / "legal")), timeout=TIMEOUT))
    assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "no serving worker has LoRA enabled" in (refused.details() or "")


async def test_with_several_lora_base_models_a_change_names_one_and_acts_on_its_workers_only(
    gateway: Gateway, workers: dict[str, str], tmp_path: Path
) -> None:
    channel = await gateway(of=("w0", "w1", "w2", "w3"))
    admin = pb_grpc.AdaptersStub(channel)
    legal, billing = adapter(tmp_path / "legal"), adapter(tmp_path / "billing")
    unnamed = await refusal(admin.LoadLoraAdapter(pb.LoadLoraAdapterRequest(lora_name="legal", lora_path=legal),
                                                  timeout=TIMEOUT))
    assert unnamed.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert unnamed.details() == (f"the workers of several base models have LoRA enabled ('{SIM_MODEL}', "
                                 f"'{OTHER_MODEL}'): name one in 'base_model_name'")
    unserved = await refusal(admin.LoadLoraAdapter(
        pb.LoadLoraAdapterRequest(lora_name="legal", lora_path=legal, base_model_name="sim-c"), timeout=TIMEOUT))
    assert unserved.code() == grpc.StatusCode.NOT_FOUND
    assert unserved.details() == (f"no worker with LoRA enabled serves the base model 'sim-c'; those with LoRA "
                                  f"enabled serve '{SIM_MODEL}', '{OTHER_MODEL}'")
    assert await held(workers) == NONE_HELD

    loaded = await admin.LoadLoraAdapter(
        pb.LoadLoraAdapterRequest(lora_name="legal", lora_path=legal, base_model_name=OTHER_MODEL), timeout=TIMEOUT)
    assert list(loaded.workers) == ["w3"]
    await admin.LoadLoraAdapter(
        pb.LoadLoraAdapterRequest(lora_name="billing", lora_path=billing, base_model_name=DEFAULT_MODEL), timeout=TIMEOUT)
    assert await held(workers) == {"w0": ["billing"], "w1": ["billing"], "w2": [], "w3": ["legal"]}
    cards = await models(channel)
    assert (cards["legal"].parent, cards["billing"].parent) == (OTHER_MODEL, SIM_MODEL)
    assert (await ask(channel, "legal")).worker == "w3"

    elsewhere = await refusal(admin.UnloadLoraAdapter(
        pb.UnloadLoraAdapterRequest(lora_name="legal", base_model_name=DEFAULT_MODEL), timeout=TIMEOUT))
    assert elsewhere.code() == grpc.StatusCode.NOT_FOUND
    assert await held(workers) == {"w0": ["billing"], "w1": ["billing"], "w2": [], "w3": ["legal"]}
    # Named with its base model, or not: an adapter's name is its base model's alone.
    for name, model, holders in (("legal", "", ["w3"]), ("billing", SIM_MODEL, ["w0", "w1"])):
        unloaded = await admin.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name=name, base_model_name=model),
                                                 timeout=TIMEOUT)
        assert sorted(unloaded.workers) == holders
    assert await held(workers) == NONE_HELD


async def test_a_change_naming_no_base_model_acts_on_the_only_one_with_lora(
    gateway: Gateway, workers: dict[str, str], tmp_path: Path
) -> None:
    channel = await gateway(of=("w2", "w3"))  # w2's model has LoRA off
    admin = pb_grpc.AdaptersStub(channel)
    load = pb.LoadLoraAdapterRequest(lora_name="legal", lora_path=adapter(tmp_path / "legal"))
    assert list((await admin.LoadLoraAdapter(load, timeout=TIMEOUT)).workers) == ["w3"]
    assert await held(workers) == {"w0": [], "w1": [], "w2": [], "w3": ["legal"]}
    unserved = await refusal(admin.UnloadLoraAdapter(
        pb.UnloadLoraAdapterRequest(lora_name="legal", base_model_name=DEFAULT_MODEL), timeout=TIMEOUT))
    assert unserved.code() == grpc.StatusCode.NOT_FOUND
    assert f"those with LoRA enabled serve '{OTHER_MODEL}'" in (unserved.details() or "")
    unloaded = await admin.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="legal"), timeout=TIMEOUT)
    assert list(unloaded.workers) == ["w3"]
    assert await held(workers) == NONE_HELD


async def test_only_a_gateway_that_allows_it_and_only_for_an_admin_tenant(
    gateway: Gateway, workers: dict[str, str], tmp_path: Path
) -> None:
    load = pb.LoadLoraAdapterRequest(lora_name="legal", lora_path=adapter(tmp_path / "legal"))
    off = pb_grpc.AdaptersStub(await gateway(allow_runtime_lora_updating=False))
    refused = await refusal(off.LoadLoraAdapter(load, timeout=TIMEOUT))
    assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "--allow-runtime-lora-updating" in (refused.details() or "")

    keys = tmp_path / "keys"
    keys.write_text("sk-team-a-000000 team-a\nsk-ops-00000000 ops admin=1\n")
    admin = pb_grpc.AdaptersStub(await gateway(api_keys_file=str(keys)))
    for tenant in ("team-a", ""):
        refused = await refusal(admin.LoadLoraAdapter(load, metadata=((TENANT, tenant),), timeout=TIMEOUT))
        assert refused.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "admin=1" in (refused.details() or "")
    assert await held(workers) == NONE_HELD
    await admin.LoadLoraAdapter(load, metadata=((TENANT, "ops"),), timeout=TIMEOUT)
    assert await held(workers) == {"w0": ["legal"], "w1": ["legal"], "w2": [], "w3": []}
    await admin.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="legal"), metadata=((TENANT, "ops"),),
                                  timeout=TIMEOUT)


async def test_an_adapter_of_the_registry_is_loaded_on_demand_by_the_worker_picked(
    gateway: Gateway, workers: dict[str, str], servicers: dict[str, WorkerServicer], tmp_path: Path
) -> None:
    registry = tmp_path / "registry"
    adapter(registry / "faq")
    channel = await gateway(lora_registry=str(registry))
    assert "faq" not in await models(channel)  # listed once a worker holds it, as vLLM lists loaded ones
    versions = {w: servicers[w].engine.adapters_version for w in ("w0", "w1")}
    # At once: the requests that find no worker holding it all go to workers with LoRA enabled.
    answers = await asyncio.gather(*(ask(channel, "faq", f"question {i}") for i in range(6)))
    serving = {a.worker for a in answers}
    assert serving <= {"w0", "w1"}
    now = await held(workers)
    assert {w for w, names in now.items() if "faq" in names} == serving and now["w2"] == []
    for w in serving:  # each loaded it once, however many requests asked at once
        assert servicers[w].engine.adapters_version == versions[w] + 1

    async def listed() -> bool:
        return "faq" in await models(channel)

    await until(listed, "the model list to show the adapter a worker loaded")
    unknown = await refusal(ask(channel, "nowhere"))
    assert unknown.code() == grpc.StatusCode.NOT_FOUND
    sneaky = pb.GenerateRequest(prompt="hi", max_tokens=2, model="other", lora_path=str(registry / "faq"))
    refused = await refusal(pb_grpc.InferenceStub(channel).Complete(sneaky, timeout=TIMEOUT))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'lora_path' is set by the gateway" in (refused.details() or "")
    await pb_grpc.AdaptersStub(channel).UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="faq"), timeout=TIMEOUT)


async def test_an_adapter_of_the_registry_a_worker_cannot_load_is_refused_with_the_reason(
    gateway: Gateway, workers: dict[str, str], tmp_path: Path
) -> None:
    registry = tmp_path / "registry.txt"
    registry.write_text(f"broken={tmp_path / 'not-there'}\n")
    channel = await gateway(of=("w0", "w2"), lora_registry=str(registry))
    refused = await refusal(ask(channel, "broken"))
    assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"No adapter found for {tmp_path / 'not-there'}" in (refused.details() or "")
    assert await held(workers) == NONE_HELD
    assert (await ask(channel, DEFAULT_MODEL)).finish_reason  # the fleet serves on
