"""Requests routed by the model they name: real sim workers, one serving two LoRA adapters and one
serving none, behind a gateway with the router embedded (its picks and its fleet view are the
router's code). A request naming an adapter goes only to a worker that serves it; an unknown name
is NOT_FOUND naming it; the OpenAI model list shows each adapter with its parent."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from meshserve.commands.gateway_service import start as start_gateway
from meshserve.services import validation
from meshserve.services.config import DEFAULT_MODEL, EMBEDDED_ROUTER, GatewayConfig, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import Running, insecure_channel
from meshserve.worker.server import WorkerServicer, start_worker
from tests.integration.helpers import until_router_hears

TIMEOUT = 10.0
ADAPTERS = {"support": "/adapters/support", "legal": "/adapters/legal"}


@pytest.fixture(scope="module")
def servicers() -> dict[str, WorkerServicer]:
    """The workers' servicers by id (their own counts of the requests they received)."""
    return {}


@pytest.fixture(scope="module")
async def channel(servicers: dict[str, WorkerServicer]) -> AsyncIterator[grpc.aio.Channel]:
    lora = dict(enable_lora=True, max_loras=2, lora_modules=[f"{n}={p}" for n, p in ADAPTERS.items()])
    workers = [await start_worker(WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="sim",
                                               worker_id=f"w{i}", grace_seconds=1.0, sim_itl_base_ms=1.0,
                                               **(lora if i == 0 else {})))
               for i in range(2)]
    servicers.update({servicer.worker_id: servicer for _, servicer in workers})
    # Round robin: a base-model request goes to each worker in turn, an adapter's to its holder only.
    gateway = await start_gateway(GatewayConfig(
        port=0, metrics_port=-1, grace_seconds=1, router=EMBEDDED_ROUTER, cache="", routing="round-robin",
        workers=[f"127.0.0.1:{running.port}" for running, _ in workers]))
    async with insecure_channel(f"127.0.0.1:{gateway.port}") as ch:
        await until_router_hears(ch, 2)
        yield ch
    await gateway.shutdown()
    for running, _ in workers:
        await running.shutdown()


async def ask(channel: grpc.aio.Channel, model: str, prompt: str = "Where is my parcel?") -> pb.GenerateResponse:
    req = pb.GenerateRequest(prompt=prompt, max_tokens=4, temperature=0, model=model, cache="off")
    return [c async for c in pb_grpc.InferenceStub(channel).Generate(req, timeout=TIMEOUT)][-1]


async def test_a_request_naming_an_adapter_goes_only_to_a_worker_that_serves_it(
    channel: grpc.aio.Channel, servicers: dict[str, WorkerServicer]
) -> None:
    base = {(await ask(channel, DEFAULT_MODEL, f"question {i}")).worker for i in range(4)}
    assert base == {"w0", "w1"}  # round robin over both
    before = servicers["w1"].requests_received
    for model in ("support", "legal", "support", "legal"):
        assert (await ask(channel, model)).worker == "w0"
    assert servicers["w1"].requests_received == before  # not even tried there


async def test_the_fleet_view_shows_each_workers_model_and_adapters(channel: grpc.aio.Channel) -> None:
    listed = {w.worker_id: w for w in
              (await pb_grpc.RouterStub(channel).ListWorkers(pb.ListWorkersRequest(), timeout=TIMEOUT)).workers}
    assert listed["w0"].model == listed["w1"].model == "meshserve-sim"
    assert {a.name: a.path for a in listed["w0"].lora.adapters} == ADAPTERS
    assert listed["w0"].lora.max_loras == 2
    assert not listed["w1"].HasField("lora")


async def test_an_unknown_model_is_not_found_naming_it(channel: grpc.aio.Channel) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await ask(channel, "billing")
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    details = refused.value.details() or ""
    assert "the model 'billing' does not exist" in details and "'legal', 'support'" in details
    assert validation.param_of(refused.value.trailing_metadata()) == "model"


async def test_the_model_list_has_each_adapter_with_its_parent(channel: grpc.aio.Channel) -> None:
    openai = pb_grpc.OpenAIStub(channel)
    cards = {m.id: m for m in (await openai.ListModels(pb.ListModelsRequest(), timeout=TIMEOUT)).data}
    assert list(cards) == [DEFAULT_MODEL, "support", "legal"]
    assert not cards[DEFAULT_MODEL].HasField("parent")
    for name, path in ADAPTERS.items():
        assert (cards[name].root, cards[name].parent, cards[name].object) == (path, DEFAULT_MODEL, "model")
    assert await openai.RetrieveModel(pb.RetrieveModelRequest(model="legal"), timeout=TIMEOUT) == cards["legal"]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await openai.RetrieveModel(pb.RetrieveModelRequest(model="billing"), timeout=TIMEOUT)
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND


async def test_an_answer_names_the_adapter_that_gave_it(channel: grpc.aio.Channel) -> None:
    openai = pb_grpc.OpenAIStub(channel)
    ask_for = {"prompt": {"string_value": "Hi"}, "max_tokens": 2, "temperature": 0}
    for model in ("support", DEFAULT_MODEL, ""):
        answer = await openai.Completions(pb.CompletionRequest(model=model, **ask_for), timeout=TIMEOUT)
        assert answer.model == (model or DEFAULT_MODEL)
