"""Tensor parallelism through the mesh on this CPU machine: a worker with tensor_parallel_size 2
(vLLM's multiprocess executor, one rank per CPU) behind Envoy gives the same greedy tokens as one
rank. The model is the tiny model's "decisive" variant: with flat random logits the two sides
part at an argmax flip after ~10-50 tokens (the all-reduce sums in another order), which says
nothing about tensor parallelism being right. Both sides run in float32: `dtype auto` takes
bfloat16 on CPUs with AVX512-BF16/AMX, whose rounding parts the two sides the same way."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from meshserve.commands.launcher import Mesh
from meshserve.services.config import WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from tests.integration.helpers import mesh_spec, token_ids, worker_generate
from meshserve.worker.server import start_worker
from meshserve.worker.tiny_model import ensure_model

pytestmark = [pytest.mark.integration, pytest.mark.engine]

PROMPTS = ["Hello world", "In the beginning there was", "The quick brown fox", "Once upon a time"]
TOKENS = 48
KV_BYTES = 64 * 2**20


@pytest.fixture(scope="module")
def decisive_model() -> Path:
    return ensure_model(decisive=True)


@pytest.fixture(scope="module")
def tp2_mesh(tmp_path_factory: pytest.TempPathFactory, decisive_model: Path) -> Iterator[Mesh]:
    worker = WorkerConfig(model=str(decisive_model), tensor_parallel_size=2, enforce_eager=True,
                          kv_cache_memory_bytes=KV_BYTES, dtype="float32")
    spec = mesh_spec(tmp_path_factory.mktemp("tp2-mesh"), "vllm", worker=worker, ready_timeout_s=300)
    with Mesh(spec) as mesh:
        yield mesh


async def test_tensor_parallel_2_through_envoy_equals_one_rank(tp2_mesh: Mesh, decisive_model: Path) -> None:
    through_mesh = []
    # wait_for_ready: with two vLLM ranks busy on two cores, Envoy's first HTTP/2 handshake can
    # miss gRPC's connect deadline (CI saw it once); the call waits for the connection instead.
    async with insecure_channel(tp2_mesh.envoy_address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        for prompt in PROMPTS:
            request = pb.GenerateRequest(prompt=prompt, max_tokens=TOKENS, temperature=0, ignore_eos=True,
                                         skip_cache=True)
            chunks = [c async for c in stub.Generate(request, wait_for_ready=True, timeout=300)]
            assert chunks[-1].usage.completion_tokens == TOKENS
            through_mesh.append(token_ids(chunks))
    # Two model ranks really ran: vLLM's worker processes under the mesh's worker.
    (worker,) = [p for p in tp2_mesh.procs if p.name == "worker-0"]
    ranks = [p.name() for p in psutil.Process(worker.popen.pid).children(recursive=True)]
    assert sum("Worker" in name for name in ranks) == 2, ranks

    one_rank, _ = await start_worker(WorkerConfig(
        host="127.0.0.1", port=0, metrics_port=-1, engine="vllm", model=str(decisive_model),
        tensor_parallel_size=1, enforce_eager=True, kv_cache_memory_bytes=KV_BYTES, grace_seconds=2,
        dtype="float32"))
    try:
        direct = []
        for prompt in PROMPTS:
            chunks = await worker_generate(f"127.0.0.1:{one_rank.port}", prompt=prompt, max_tokens=TOKENS,
                                           temperature=0, ignore_eos=True)
            direct.append(token_ids(chunks))
    finally:
        await one_rank.shutdown()
    assert through_mesh == direct
