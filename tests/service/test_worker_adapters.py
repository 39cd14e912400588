"""A worker with LoRA adapters (the sim engine, vLLM's flags): it says which it serves and its
slots, runs a request on the adapter its model names, and refuses a name it does not serve."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import pytest

from meshserve.services import validation
from meshserve.services.config import WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import Running
from meshserve.worker.server import WorkerServicer, start_worker

TIMEOUT = 30.0


@pytest.fixture(scope="module")
async def worker() -> AsyncIterator[tuple[Running, WorkerServicer]]:
    cfg = WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="sim", model="base", grace_seconds=5.0,
                       sim_itl_base_ms=1.0, enable_lora=True, max_loras=2, max_lora_rank=8,
                       lora_modules=["support=/adapters/support", "legal=/adapters/legal"])
    running, servicer = await start_worker(cfg)
    yield running, servicer
    await running.shutdown()


async def text(stub: pb_grpc.WorkerStub, model: str) -> str:
    request = pb.GenerateRequest(prompt="Where is my parcel?", max_tokens=8, temperature=0, model=model)
    return "".join([c.text async for c in stub.Generate(request, timeout=TIMEOUT)])


async def test_info_lists_the_adapters_and_slots(stub: pb_grpc.WorkerStub) -> None:
    info = await stub.Info(pb.InfoRequest(), timeout=TIMEOUT)
    assert info.model == "base"
    assert info.lora == pb.LoraConfig(
        adapters=[pb.LoraAdapter(name="support", path="/adapters/support"),
                  pb.LoraAdapter(name="legal", path="/adapters/legal")],
        max_loras=2, max_lora_rank=8, max_cpu_loras=2)


async def test_a_request_runs_on_the_adapter_its_model_names(stub: pb_grpc.WorkerStub) -> None:
    base, named_base, support, legal = [await text(stub, m) for m in ("", "base", "support", "legal")]
    assert named_base == base
    assert len({base, support, legal}) == 3
    assert await text(stub, "support") == support


async def test_a_model_the_worker_does_not_serve_is_not_found_naming_it(stub: pb_grpc.WorkerStub) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await text(stub, "billing")
    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    assert "'billing' does not exist" in (refused.value.details() or "")
    assert "'legal', 'support'" in (refused.value.details() or "")
    assert validation.param_of(refused.value.trailing_metadata()) == "model"


async def test_a_worker_without_lora_says_so_and_serves_no_adapter() -> None:
    from meshserve.services.server import insecure_channel

    running, _ = await start_worker(WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="sim",
                                                 grace_seconds=5.0))
    try:
        async with insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.WorkerStub(channel)
            assert not (await stub.Info(pb.InfoRequest(), timeout=TIMEOUT)).HasField("lora")
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await text(stub, "support")
            assert refused.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        await running.shutdown()


async def test_load_reports_name_the_adapter_in_the_slot_and_loads_are_counted() -> None:
    """One slot, two adapters: legal (loaded last at start) is in it; a request on support
    swaps support in, which the next load report says and the loads counter counts."""
    from prometheus_client import REGISTRY

    from meshserve.services.server import insecure_channel

    cfg = WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="sim", model="base", grace_seconds=5.0,
                       sim_itl_base_ms=1.0, enable_lora=True, max_loras=1, worker_id="one-slot",
                       lora_modules=["support=/adapters/support", "legal=/adapters/legal"])
    running, _ = await start_worker(cfg)
    loads = {"worker": "one-slot", "adapter": "support"}
    try:
        async with insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.WorkerStub(channel)
            reports = stub.WatchLoad(pb.WatchLoadRequest(), timeout=TIMEOUT)
            assert list((await reports.read()).active_adapters) == ["legal"]
            assert not REGISTRY.get_sample_value("meshserve_worker_adapter_loads_total", loads)
            await text(stub, "support")
            while list((report := await reports.read()).active_adapters) == ["legal"]:
                pass
            assert list(report.active_adapters) == ["support"]
            assert REGISTRY.get_sample_value("meshserve_worker_adapter_loads_total", loads) == 1
            reports.cancel()
    finally:
        await running.shutdown()
