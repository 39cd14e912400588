"""A worker loads and unloads LoRA adapters while it serves (the sim engine; vLLM's checks and
messages): the adapter is served at once, its load stream says so, and a load it refuses leaves
it serving what it served."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from meshserve.services.config import WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import Running, insecure_channel
from meshserve.worker.server import WorkerServicer, start_worker

TIMEOUT = 30.0


def adapter(folder: Path, rank: int = 8) -> str:
    """A folder the sim takes as an adapter: its PEFT config (the sim reads no weights)."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": rank, "lora_alpha": 2 * rank, "peft_type": "LORA"}))
    return str(folder)


@pytest.fixture
async def worker() -> AsyncIterator[tuple[Running, WorkerServicer]]:
    """A fresh worker per test (each changes its adapters); ``stub`` (conftest) calls it."""
    cfg = WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="sim", model="base", grace_seconds=5.0,
                       sim_itl_base_ms=1.0, enable_lora=True, max_loras=2, max_lora_rank=8,
                       lora_modules=["support=/adapters/support"])
    running, servicer = await start_worker(cfg)
    try:
        yield running, servicer
    finally:
        await running.shutdown()


async def text(stub: pb_grpc.WorkerStub, model: str) -> str:
    request = pb.GenerateRequest(prompt="Where is my parcel?", max_tokens=8, temperature=0, model=model)
    return "".join([c.text async for c in stub.Generate(request, timeout=TIMEOUT)])


async def adapters(stub: pb_grpc.WorkerStub) -> list[str]:
    return [a.name for a in (await stub.Info(pb.InfoRequest(), timeout=TIMEOUT)).lora.adapters]


async def refusal(call) -> grpc.aio.AioRpcError:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await call
    return refused.value


async def test_a_loaded_adapter_is_served_and_reported_on_the_load_stream(stub: pb_grpc.WorkerStub,
                                                                          tmp_path: Path) -> None:
    reports = stub.WatchLoad(pb.WatchLoadRequest(), timeout=TIMEOUT)
    first = await reports.read()
    assert [a.name for a in first.lora.adapters] == ["support"]  # the first report says what it serves
    assert (await refusal(text(stub, "legal"))).code() == grpc.StatusCode.NOT_FOUND

    answer = await stub.LoadLoraAdapter(pb.LoadLoraAdapterRequest(lora_name="legal", lora_path=adapter(tmp_path / "l")),
                                        timeout=TIMEOUT)
    assert answer.message == "Success: LoRA adapter 'legal' added successfully."
    assert await adapters(stub) == ["support", "legal"]
    legal = await text(stub, "legal")
    assert legal and legal not in (await text(stub, ""), await text(stub, "support"))
    report = await reports.read()
    while not report.HasField("lora"):  # load-only reports in between carry no adapters
        report = await reports.read()
    assert [a.name for a in report.lora.adapters] == ["support", "legal"]
    assert report.lora.adapters[1].path == str(tmp_path / "l")
    reports.cancel()


async def test_unloading_stops_serving_it_and_an_unknown_one_is_not_found(stub: pb_grpc.WorkerStub) -> None:
    answer = await stub.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="support"), timeout=TIMEOUT)
    assert answer.message == "Success: LoRA adapter 'support' removed successfully."
    assert await adapters(stub) == []
    assert (await refusal(text(stub, "support"))).code() == grpc.StatusCode.NOT_FOUND
    again = await refusal(stub.UnloadLoraAdapter(pb.UnloadLoraAdapterRequest(lora_name="support"), timeout=TIMEOUT))
    assert again.code() == grpc.StatusCode.NOT_FOUND
    assert again.details() == "The lora adapter 'support' cannot be found."


async def test_refused_loads_say_vllms_reason_and_change_nothing(stub: pb_grpc.WorkerStub, tmp_path: Path) -> None:
    missing = await refusal(stub.LoadLoraAdapter(
        pb.LoadLoraAdapterRequest(lora_name="gone", lora_path=str(tmp_path / "nothing")), timeout=TIMEOUT))
    assert missing.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert missing.details() == f"Loading lora gone failed: No adapter found for {tmp_path / 'nothing'}"

    too_big = await refusal(stub.LoadLoraAdapter(
        pb.LoadLoraAdapterRequest(lora_name="big", lora_path=adapter(tmp_path / "big", rank=64)), timeout=TIMEOUT))
    assert too_big.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert too_big.details() == "LoRA rank 64 is greater than max_lora_rank 8."

    twice = await refusal(stub.LoadLoraAdapter(
        pb.LoadLoraAdapterRequest(lora_name="support", lora_path=adapter(tmp_path / "s")), timeout=TIMEOUT))
    assert twice.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "The lora adapter 'support' has already been loaded." in (twice.details() or "")

    base = await refusal(stub.LoadLoraAdapter(
        pb.LoadLoraAdapterRequest(lora_name="base", lora_path=adapter(tmp_path / "b")), timeout=TIMEOUT))
    assert base.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert await adapters(stub) == ["support"]
    assert await text(stub, "support")


async def test_a_worker_without_lora_refuses_adapter_changes(tmp_path: Path) -> None:
    running, _ = await start_worker(WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="sim",
                                                 grace_seconds=5.0))
    try:
        async with insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.WorkerStub(channel)
            refused = await refusal(stub.LoadLoraAdapter(
                pb.LoadLoraAdapterRequest(lora_name="legal", lora_path=adapter(tmp_path / "l")), timeout=TIMEOUT))
            assert refused.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert "--enable-lora" in (refused.details() or "")
            first = await stub.WatchLoad(pb.WatchLoadRequest(), timeout=TIMEOUT).read()
            assert not first.HasField("lora")
    finally:
        await running.shutdown()
