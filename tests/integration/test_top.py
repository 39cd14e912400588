"""``meshserve top --once`` against a sim fleet under load: the frame names every worker with the
requests it is running, and the gateway's in-flight streams and request rate.

Everything here runs in processes of its own (the mesh, the load from `meshserve bench`, `top`),
and the test only reads: no gRPC calls of its own on the test session's event loop."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from meshserve.commands.launcher import Mesh
from meshserve.services.config import WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from tests.integration.helpers import mesh_spec, metric_sum, scrape

pytestmark = pytest.mark.integration

USERS = 20         # streams in flight at once, 20-380 tokens at 20 ms each: some end every second
TIMEOUT_S = 60.0


def _row(frame: str, first: str) -> list[str]:
    """The cells of the frame's table row that starts with ``first`` (not its header)."""
    rows = [line.split() for line in frame.splitlines() if line.split()[:1] == [first] and "in-flight" not in line]
    assert len(rows) == 1, frame
    return rows[0]


def top_once(run_dir: Path) -> tuple[int, str, str]:
    """The real command, as a script runs it (stdout is a pipe: 80 columns): exit code, stdout, stderr."""
    done = subprocess.run(
        [sys.executable, "-m", "meshserve.commands.cli", "top", "--once", "--interval", "2", "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=TIMEOUT_S, check=False,
    )
    return done.returncode, done.stdout, done.stderr


def until(condition, what: str) -> None:  # noqa: ANN001
    """Polls an observable condition of the running mesh until it holds (or fails the test)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_top_once_shows_every_worker_running_and_the_gateway_rates(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    spec = mesh_spec(tmp_path_factory.mktemp("top"), "sim", workers=2, worker=WorkerConfig(sim_itl_base_ms=20.0))
    with Mesh(spec) as mesh:
        load = subprocess.Popen(
            [sys.executable, "-m", "meshserve.commands.cli", "bench", "--target", mesh.envoy_address, "--num-prompts", "2000",
             "--max-concurrency", str(USERS), "--random-input-len", "8", "--random-output-len", "200",
             "--random-range-ratio", "0.9", "--ignore-eos", "--cache", "off", "--disable-tqdm"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            with grpc.insecure_channel(mesh.router_address) as channel:
                router = pb_grpc.RouterStub(channel)

                def both_running() -> bool:
                    workers = router.ListWorkers(pb.ListWorkersRequest(), timeout=5).workers
                    return len(workers) == 2 and all(w.load.num_running > 0 for w in workers)

                until(both_running, "both workers to run requests")
            until(lambda: metric_sum(scrape(mesh.metrics["gateway"]), "meshserve_gateway_requests_total") > 0,
                  "the gateway to finish requests")
            # A part that takes over a second to answer (a loaded CI machine) is named, and the
            # frame exits 1: ask again, a few times, for a frame from every part.
            for _ in range(3):
                code, frame, err = top_once(mesh.run_dir)
                if code == 0:
                    break
            assert load.poll() is None, "the load ended (or failed) before the frame was taken"
        finally:
            load.kill()
            load.wait()
    print(frame)
    assert code == 0, err
    assert max(len(line) for line in frame.splitlines()) <= 80
    for worker in ("worker-0", "worker-1"):
        _, state, running, _, _, _, tokens_per_s, _ = _row(frame, worker)
        assert state == "ok" and int(running) > 0, frame
        assert float(tokens_per_s.removesuffix("k")) > 0, frame  # the worker's vllm:generation_tokens
    _, in_flight, requests_per_s, errors_per_s, *_ = _row(frame, "gateway")
    assert int(in_flight) > 0 and float(requests_per_s) > 0 and float(errors_per_s) == 0, frame
    assert re.search(r"^router\s+picks: kv-aware [\d.]+/s", frame, re.MULTILINE), frame
    assert re.search(r"^envoy\s+[\d.]+ req/s", frame, re.MULTILINE), frame

    # The mesh stopped, its files left in the run dir: a clear error, no frame, no traceback.
    code, frame, err = top_once(mesh.run_dir)
    assert (code, frame) == (1, ""), err
    assert err.startswith("meshserve top: cannot reach the mesh") and "Traceback" not in err, err


def test_top_once_without_a_mesh_says_so_and_exits_1(tmp_path_factory: pytest.TempPathFactory) -> None:
    empty = tmp_path_factory.mktemp("no-mesh")
    done = subprocess.run([sys.executable, "-m", "meshserve.commands.cli", "top", "--once", "--run-dir", str(empty)],
                          check=False, capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith("meshserve top: no mesh in") and "Traceback" not in done.stderr
