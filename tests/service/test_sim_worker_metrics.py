"""A sim worker's Prometheus metrics follow its engine: preemptions under a full KV pool are
exported under vLLM's name, so a benchmark on a KV-bound sim fleet sees them as on vLLM."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from meshserve.services.config import WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from tests.unit.test_sim_engine import words
from meshserve.worker.server import start_worker

TIMEOUT = 30.0


async def test_preemptions_are_exported_as_vllm_num_preemptions() -> None:
    # 6 blocks of 4 tokens: two 8-token prompts decoding 12 tokens each cannot both keep theirs.
    cfg = WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="sim", worker_id="sim-preempts",
                       grace_seconds=5.0, block_size=4, sim_num_kv_blocks=6, sim_itl_base_ms=1.0)
    running, servicer = await start_worker(cfg)
    labels = {"worker": "sim-preempts"}
    try:
        async with insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.WorkerStub(channel)

            async def generate(tag: str) -> str:
                request = pb.GenerateRequest(prompt=words(tag, 8), max_tokens=12, temperature=0, ignore_eos=True)
                return "".join([r.text async for r in stub.Generate(request, timeout=TIMEOUT)])

            texts = await asyncio.gather(generate("a"), generate("b"))
        assert all(texts)
        preempted = servicer.engine.num_preemptions
        assert preempted > 0
        assert REGISTRY.get_sample_value("vllm:num_preemptions_total", labels) == preempted
    finally:
        await running.shutdown()
