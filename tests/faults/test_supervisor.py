"""``meshserve up``'s supervisor on a real sim mesh (Valkey, cache, two workers, router, gateway,
Envoy): a killed worker is restarted while the other serves, a crash loop is given up on, and a
stop that arrives during a restart stops everything at once.

Each test starts its own mesh with ``MeshSpec.supervise`` set, as ``meshserve up`` does. Where
a test needs a process that fails or stays not-ready on restart, it replaces that process's
recorded launch (``Mesh.launches``), which is what the supervisor starts again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import psutil
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshserve.commands.launcher import Mesh, Proc
from meshserve.commands.supervisor import RestartPolicy
from meshserve.services.config import CacheConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from tests.integration.helpers import generate, mesh_spec, token_ids, wait_until, worker_generate

pytestmark = pytest.mark.integration

VICTIM = "worker-1"

# A stand-in for a restarted vLLM worker still loading its model (~40 s): it never becomes ready,
# ignores SIGTERM, and has a child of its own (as vLLM's engine processes are).
STILL_LOADING = (
    "import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', sys.argv[1]]); time.sleep(600)"
)


@pytest.fixture
def start_mesh(tmp_path: Path) -> Iterator[Callable[[RestartPolicy], Mesh]]:
    meshes: list[Mesh] = []

    def start(policy: RestartPolicy) -> Mesh:
        # No semantic cache: these tests are about processes, and the embedding model is slow to load.
        spec = mesh_spec(tmp_path / f"mesh-{len(meshes)}", "sim", workers=2, cache=CacheConfig(semantic=False),
                         supervise=policy)
        mesh = Mesh(spec)
        meshes.append(mesh)
        return mesh.start()

    yield start
    for mesh in meshes:
        mesh.stop()


@pytest.fixture
def supervisor_log(caplog: pytest.LogCaptureFixture) -> Callable[[], list[logging.LogRecord]]:
    caplog.set_level(logging.INFO, logger="meshserve.commands.supervisor")
    return lambda: [r for r in caplog.records if r.name == "meshserve.commands.supervisor"]


def proc(mesh: Mesh, name: str) -> Proc:
    return next(p for p in mesh.procs if p.name == name)


def serving(address: str) -> bool:
    with grpc.insecure_channel(address) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING


def router_lists_healthy(router: str, worker_id: str) -> bool:
    with grpc.insecure_channel(router) as channel:
        workers = pb_grpc.RouterStub(channel).ListWorkers(pb.ListWorkersRequest(), timeout=2).workers
    return any(w.worker_id == worker_id and w.healthy for w in workers)


async def answered_by(mesh: Mesh, prompt: str) -> str:
    """Sends one request through Envoy; returns the worker that answered it in full."""
    chunks = await asyncio.wait_for(
        generate(mesh.envoy_address, prompt=prompt, max_tokens=4, temperature=0, skip_cache=True), 30
    )
    assert chunks[-1].finish_reason == "length" and len(token_ids(chunks)) == 4
    return chunks[0].worker


def logged(records: list[logging.LogRecord], text: str) -> bool:
    return any(text in r.getMessage() for r in records)


async def test_a_killed_worker_is_restarted_while_the_other_serves(
    start_mesh: Callable[[RestartPolicy], Mesh], supervisor_log: Callable[[], list[logging.LogRecord]],
) -> None:
    # A 3 s first backoff (0.5 s by default): time for requests to be answered while worker-1 is
    # down, even the first one, which may first try worker-1 and fail over.
    mesh = start_mesh(RestartPolicy(first_delay_s=3.0))
    address = mesh.worker_addresses[1]
    old_pid = proc(mesh, VICTIM).popen.pid
    os.killpg(old_pid, signal.SIGKILL)

    # Until the supervisor starts it again, worker-0 answers.
    answered_while_down = 0
    async with asyncio.timeout(60):
        while proc(mesh, VICTIM).popen.pid == old_pid:
            worker = await answered_by(mesh, f"while worker-1 is down, request {answered_while_down}")
            if proc(mesh, VICTIM).popen.pid == old_pid:  # worker-1 was down for all of this request
                assert worker == "worker-0"
                answered_while_down += 1
    assert answered_while_down > 0
    assert logged(supervisor_log(), f"{VICTIM} (pid {old_pid}) killed by SIGKILL; restarting it in 3s")

    # Back: a new process, SERVING at the same address, healthy in the router's view, answering.
    new = proc(mesh, VICTIM)
    assert new.popen.pid != old_pid and mesh.worker_addresses[1] == address
    await wait_until(lambda: serving(address), 60, f"{VICTIM} to answer SERVING at {address} again")
    await wait_until(lambda: router_lists_healthy(mesh.router_address, VICTIM), 30,
                     f"the router to list {VICTIM} healthy again")
    await wait_until(lambda: logged(supervisor_log(), f"{VICTIM} is back (pid {new.popen.pid})"), 30,
                     "the supervisor to report it back")
    assert new.popen.poll() is None and proc(mesh, VICTIM) is new
    chunks = await asyncio.wait_for(worker_generate(address, prompt="back again", max_tokens=3, temperature=0), 30)
    assert len(token_ids(chunks)) == 3
    assert all(p.popen.poll() is None for p in mesh.procs)


async def test_a_crash_loop_is_given_up_on_and_the_rest_keeps_serving(
    start_mesh: Callable[[RestartPolicy], Mesh], supervisor_log: Callable[[], list[logging.LogRecord]],
) -> None:
    # The real crash-loop rule (more than 5 restarts within 60 s) with short backoffs, so the loop
    # takes a few seconds rather than 16 s of backoff alone.
    mesh = start_mesh(RestartPolicy(first_delay_s=0.05, max_delay_s=0.2))
    # From now on worker-1 exits as soon as it starts, as a worker whose engine cannot load would.
    launch = mesh.launches[VICTIM]
    mesh.launches[VICTIM] = dataclasses.replace(launch, argv=[sys.executable, "-c", "raise SystemExit(3)"])
    os.killpg(proc(mesh, VICTIM).popen.pid, signal.SIGKILL)

    assert mesh.supervisor is not None
    await wait_until(lambda: VICTIM in mesh.supervisor.down, 60, f"the supervisor to give up on {VICTIM}")
    records = [r for r in supervisor_log() if r.getMessage().startswith(f"{VICTIM} ")]
    restarts = [r.getMessage() for r in records if "restarting it in" in r.getMessage()]
    assert len(restarts) == 5, restarts
    assert "killed by SIGKILL" in restarts[0] and all("exited with code 3" in m for m in restarts[1:]), restarts
    (loop,) = [r for r in records if r.levelno == logging.ERROR]
    assert "exited with code 3: a crash loop (5 restarts within 60s); leaving it down" in loop.getMessage()
    assert not logged(records, "is back")

    # worker-1 stays down; everything else runs and serves.
    assert proc(mesh, VICTIM).popen.poll() == 3
    assert all(p.popen.poll() is None for p in mesh.procs if p.name != VICTIM)
    for i in range(5):
        assert await answered_by(mesh, f"after the crash loop, request {i}") == "worker-0"
    assert VICTIM in mesh.supervisor.down


def with_children(pids: set[int]) -> set[int]:
    out = set(pids)
    for pid in pids:
        try:
            out |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        except psutil.NoSuchProcess:  # the killed worker
            pass
    return out


def mesh_processes(run_dir: Path, pids: set[int]) -> list[psutil.Process]:
    """Processes of the mesh still alive: by pid, or by a command line that names its run dir."""
    return [
        p for p in psutil.process_iter(["pid", "cmdline", "status"])
        if p.info["pid"] != os.getpid() and p.info["status"] != psutil.STATUS_ZOMBIE
        and (p.info["pid"] in pids or str(run_dir) in " ".join(p.info["cmdline"] or ()))
    ]


@pytest.mark.parametrize("phase", ["backoff", "loading"])
async def test_a_stop_during_a_restart_is_prompt_and_leaves_nothing_running(
    start_mesh: Callable[[RestartPolicy], Mesh], supervisor_log: Callable[[], list[logging.LogRecord]], phase: str,
) -> None:
    if phase == "backoff":  # the stop arrives while the supervisor waits to restart worker-1
        mesh = start_mesh(RestartPolicy(first_delay_s=60.0, max_delay_s=60.0))
    else:  # ... or while the restarted worker-1 is still loading
        mesh = start_mesh(RestartPolicy())
        launch = mesh.launches[VICTIM]
        mesh.launches[VICTIM] = dataclasses.replace(
            launch, argv=[sys.executable, "-c", STILL_LOADING, str(mesh.run_dir)]
        )
    old_pid = proc(mesh, VICTIM).popen.pid
    os.killpg(old_pid, signal.SIGKILL)
    if phase == "backoff":
        await wait_until(lambda: logged(supervisor_log(), "restarting it in 60s"), 30, "the restart to be scheduled")
    else:
        await wait_until(lambda: proc(mesh, VICTIM).popen.pid != old_pid
                         and len(psutil.Process(proc(mesh, VICTIM).popen.pid).children()) == 1,
                         30, f"the restarted {VICTIM} to be loading")
        assert not proc(mesh, VICTIM).ready

    pids = with_children({p.popen.pid for p in mesh.procs})
    assert mesh_processes(mesh.run_dir, pids)  # the check below sees the mesh's processes
    started = time.monotonic()
    await asyncio.to_thread(mesh.stop)
    took = time.monotonic() - started

    try:
        await wait_until(lambda: not mesh_processes(mesh.run_dir, pids), 5, "every process of the mesh to be gone")
    finally:
        for left in mesh_processes(mesh.run_dir, pids):  # a failed test leaves nothing behind either
            left.kill()
    # This stop takes ~0.5 s; one that waited for the restart (its 60 s backoff, or the supervisor's
    # 10 s join) or SIGTERMed the loading worker and waited out its 30 s stop timeout fails here.
    assert took < 8, f"stopping took {took:.1f}s"
    assert not logged(supervisor_log(), "is back") and not mesh.procs
