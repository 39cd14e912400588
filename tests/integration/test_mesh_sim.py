"""A simulated fleet started by the launcher as real processes (Valkey, cache, two sim workers,
a gateway with the router embedded (`meshserve up --router embedded`), Envoy): failover when a
worker dies before answering, and a bench smoke run. The router as its own process is what the
other meshes of this folder run."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import grpc
import pytest
import redis

from meshserve.commands import bench
from meshserve.commands.launcher import Mesh
from meshserve.services.config import EMBEDDED_ROUTER, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from tests.integration.helpers import generate, mesh_spec, text
from meshserve.trace_service import server as traces

pytestmark = pytest.mark.integration

# Slow prefill (20 ms per prompt token) so a request is visibly in flight before its first token.
SLOW_PREFILL_MS = 20.0
LONG_PROMPT = " ".join(f"w{i}" for i in range(200))


@pytest.fixture(scope="module")
def sim_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    spec = mesh_spec(tmp_path_factory.mktemp("sim-mesh"), "sim", workers=2,
                     worker=WorkerConfig(sim_prefill_ms_per_token=SLOW_PREFILL_MS), router_mode=EMBEDDED_ROUTER,
                     tracing=True)
    with Mesh(spec) as mesh:
        assert {p.name for p in mesh.procs}.isdisjoint({"router"})  # the gateway picks
        yield mesh


async def _worker_with_request(router: str) -> str:
    """The worker id the router sees holding a request (from the workers' own load reports)."""
    async with insecure_channel(router) as channel:
        stub = pb_grpc.RouterStub(channel)
        while True:
            workers = (await stub.ListWorkers(pb.ListWorkersRequest())).workers
            busy = [w.worker_id for w in workers if w.load.num_in_flight + w.load.num_running + w.load.num_waiting > 0]
            if busy:
                return busy[0]
            await asyncio.sleep(0.02)  # polling the router's view; bounded by the caller's timeout


async def test_killed_worker_before_first_token_fails_over(sim_mesh: Mesh) -> None:
    stream = asyncio.create_task(
        generate(sim_mesh.envoy_address, prompt=LONG_PROMPT, max_tokens=8, temperature=0, skip_cache=True)
    )
    victim = await asyncio.wait_for(_worker_with_request(sim_mesh.router_address), 30)
    assert not stream.done()  # still in prefill: no token sent yet
    proc = next(p for p in sim_mesh.procs if p.name == victim)
    os.killpg(proc.popen.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    # The router sees the worker's streams break and stops picking it within a second.
    async with insecure_channel(sim_mesh.router_address) as channel:
        stub = pb_grpc.RouterStub(channel)
        while any(w.healthy for w in (await stub.ListWorkers(pb.ListWorkersRequest())).workers
                  if w.worker_id == victim):
            assert time.monotonic() - killed_at < 1.0, "the router still counts the killed worker as healthy"
            await asyncio.sleep(0.02)  # polling the router's view, bounded by the assertion above
    chunks = await asyncio.wait_for(stream, 60)
    assert chunks[-1].finish_reason == "length"
    assert chunks[0].worker != victim and chunks[0].worker.startswith("worker-")

    # The mesh keeps serving on the survivor.
    again = await generate(sim_mesh.envoy_address, prompt="after the failure", max_tokens=4, skip_cache=True)
    assert again[0].worker == chunks[0].worker


async def test_bench_against_the_mesh_has_no_failures(sim_mesh: Mesh, tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "result.json"
    args = parser.parse_args([
        "--target", sim_mesh.envoy_address, "--num-prompts", "40", "--max-concurrency", "20",
        "--random-input-len", "4", "--random-output-len", "8", "--disable-tqdm", "--save-result", str(out),
    ])
    assert await asyncio.to_thread(bench.main, args) == 0
    result = json.loads(out.read_text())
    assert result["completed"] == 40 and result["failed"] == 0
    assert result["mean_ttft_ms"] > 0 and result["output_throughput"] > 0


async def test_grpc_status_of_an_empty_prompt_through_the_mesh(sim_mesh: Mesh) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await generate(sim_mesh.envoy_address, prompt="   ")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    ok = await generate(sim_mesh.envoy_address, prompt="fine", max_tokens=3, temperature=0)
    assert text(ok)


async def test_the_embedded_router_s_choice_is_on_the_gateway_s_own_pick_span(sim_mesh: Mesh) -> None:
    async with insecure_channel(sim_mesh.envoy_address) as channel:
        call = pb_grpc.InferenceStub(channel).Generate(pb.GenerateRequest(prompt="trace my pick", max_tokens=2,
                                                                          cache="off"))
        chunks = [c async for c in call]
        trace_id = dict(await call.initial_metadata())["x-trace-id"]

    async def whole_trace() -> list[traces.Span]:
        while True:
            try:
                spans = await traces.fetch_trace(sim_mesh.traces_address, trace_id)
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                spans = []
            if ("gateway", "Inference/Generate") in {(s.service, s.name) for s in spans}:  # ended last
                return spans
            await asyncio.sleep(0.2)  # the exporters flush about every second

    spans = await asyncio.wait_for(whole_trace(), 30)
    picks = [s for s in spans if s.name in ("router pick", "Router/Pick")]
    # One span for the pick, the gateway's: no router process, no second span in the gateway.
    assert [(s.service, s.name) for s in picks] == [("gateway", "router pick")]
    assert picks[0].attributes["meshserve.router.policy"] == "kv-aware"
    assert picks[0].attributes["meshserve.worker"] == chunks[0].worker


def test_the_embedded_valkey_wants_a_password_that_no_command_line_shows(sim_mesh: Mesh) -> None:
    """Another local user can neither read nor write the cached answers: the embedded Valkey asks
    for a password (NOAUTH without it), and no process of the mesh has it on its command line
    (the services get the URL in their environment) nor does the start-up table show it."""
    url = urlsplit(sim_mesh.redis_url)
    assert url.password
    with redis.Redis(host=url.hostname, port=url.port) as anonymous, pytest.raises(redis.AuthenticationError):
        anonymous.ping()
    with redis.Redis.from_url(sim_mesh.redis_url) as client:
        assert client.ping()
    for proc in sim_mesh.procs:
        cmdline = Path(f"/proc/{proc.popen.pid}/cmdline").read_bytes()
        assert url.password.encode() not in cmdline, proc.name
    assert url.password not in sim_mesh.describe()
