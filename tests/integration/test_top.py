"""``meshserve top --once`` against a sim fleet under load: the frame names every worker with the
requests it is running, and the gateway's in-flight streams and request rate."""

from __future__ import annotations

import asyncio
import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from services.config import WorkerConfig
from services.gen import meshserve_pb2 as pb
from services.gen import meshserve_pb2_grpc as pb_grpc
from services.launcher import Mesh
from services.server import insecure_channel
from tests.integration.helpers import mesh_spec, metric_sum, scrape, wait_until

pytestmark = pytest.mark.integration

LONG_STREAMS = 16
SHORT_USERS = 4    # short requests one after another: the gateway finishes some every second
TIMEOUT_S = 60.0


async def _long_stream(stub: pb_grpc.InferenceStub, i: int) -> None:
    request = pb.GenerateRequest(prompt=f"long stream {i}", max_tokens=2000, ignore_eos=True, cache="off")
    async for _ in stub.Generate(request, timeout=TIMEOUT_S):
        pass


async def _short_requests(stub: pb_grpc.InferenceStub, user: int) -> None:
    for i in itertools.count():
        request = pb.GenerateRequest(prompt=f"user {user} asks {i}", max_tokens=4, cache="off")
        async for _ in stub.Generate(request, timeout=TIMEOUT_S):
            pass


async def _running(router: str) -> dict[str, int]:
    async with insecure_channel(router) as channel:
        listed = await pb_grpc.RouterStub(channel).ListWorkers(pb.ListWorkersRequest(), timeout=5)
    return {w.worker_id: w.load.num_running for w in listed.workers}


def _row(frame: str, first: str) -> list[str]:
    """The cells of the frame's table row that starts with ``first`` (not its header)."""
    rows = [line.split() for line in frame.splitlines() if line.split()[:1] == [first] and "in-flight" not in line]
    assert len(rows) == 1, frame
    return rows[0]


async def top_once(run_dir: Path) -> tuple[int, str, str]:
    """The real command, as a script runs it (stdout is a pipe: 80 columns): exit code, stdout, stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "services.cli", "top", "--once", "--interval", "1", "--run-dir", str(run_dir),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), TIMEOUT_S)
    finally:
        if proc.returncode is None:  # timed out: no process outlives the test
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_top_once_shows_every_worker_running_and_the_gateway_rates(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # 20 ms per token: a 2000-token stream outlasts the test.
    spec = mesh_spec(tmp_path_factory.mktemp("top"), "sim", workers=2, worker=WorkerConfig(sim_itl_base_ms=20.0))
    with Mesh(spec) as mesh:
        async with insecure_channel(mesh.envoy_address) as channel:
            stub = pb_grpc.InferenceStub(channel)
            load = [asyncio.create_task(_long_stream(stub, i)) for i in range(LONG_STREAMS)]
            load += [asyncio.create_task(_short_requests(stub, u)) for u in range(SHORT_USERS)]
            try:
                async with asyncio.timeout(TIMEOUT_S):  # "both workers to run requests"
                    while len(r := await _running(mesh.router_address)) < 2 or min(r.values()) == 0:
                        await asyncio.sleep(0.05)
                await wait_until(lambda: metric_sum(scrape(mesh.metrics["gateway"]),
                                                    "meshserve_gateway_requests_total") > 0,
                                 TIMEOUT_S, "the gateway to finish requests")
                # A part that takes over a second to answer (a loaded CI machine) is named, and
                # the frame exits 1: ask again, a few times, for a frame from every part.
                for _ in range(3):
                    code, frame, err = await top_once(mesh.run_dir)
                    if code == 0:
                        break
                assert not any(t.done() for t in load), "the load ended (or failed) before the frame was taken"
            finally:
                for task in load:
                    task.cancel()
                await asyncio.gather(*load, return_exceptions=True)
    print(frame)
    assert code == 0, err
    assert max(len(line) for line in frame.splitlines()) <= 80
    for worker in ("worker-0", "worker-1"):
        _, state, running, _, _, _, tokens_per_s, _ = _row(frame, worker)
        assert state == "ok" and int(running) > 0, frame
        assert float(tokens_per_s.removesuffix("k")) > 0, frame  # the worker's vllm:generation_tokens
    _, in_flight, requests_per_s, errors_per_s, *_ = _row(frame, "gateway")
    assert int(in_flight) >= LONG_STREAMS and float(requests_per_s) > 0 and float(errors_per_s) == 0, frame
    assert re.search(r"^router\s+picks: kv-aware [\d.]+/s", frame, re.MULTILINE), frame
    assert re.search(r"^envoy\s+[\d.]+ req/s", frame, re.MULTILINE), frame

    # The mesh stopped, its files left in the run dir: a clear error, no frame, no traceback.
    code, frame, err = await top_once(mesh.run_dir)
    assert (code, frame) == (1, ""), err
    assert err.startswith("meshserve top: cannot reach the mesh") and "Traceback" not in err, err


def test_top_once_without_a_mesh_says_so_and_exits_1(tmp_path_factory: pytest.TempPathFactory) -> None:
    empty = tmp_path_factory.mktemp("no-mesh")
    done = subprocess.run([sys.executable, "-m", "services.cli", "top", "--once", "--run-dir", str(empty)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("meshserve top: no mesh in") and "Traceback" not in done.stderr
