"""GET /health through Envoy, as a load balancer or a Kubernetes probe asks it: 200 while a
worker can serve, 503 (with a reason) once none can, and 200 again when one is back."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import httpx
import pytest

from meshserve.commands.launcher import Mesh
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from tests.integration.helpers import mesh_spec, wait_until

pytestmark = pytest.mark.integration

TIMEOUT_S = 30.0


@pytest.fixture
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with Mesh(mesh_spec(tmp_path_factory.mktemp("health"), "sim", workers=1)) as m:
        yield m


async def router_healthy(mesh: Mesh) -> int:
    async with insecure_channel(mesh.router_address) as channel:
        listed = await pb_grpc.RouterStub(channel).ListWorkers(pb.ListWorkersRequest(), timeout=5)
    return sum(w.healthy for w in listed.workers)


async def test_health_is_200_with_a_worker_and_503_without(mesh: Mesh) -> None:
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}", timeout=TIMEOUT_S) as http:
        ok = await http.get("/health")
        assert ok.status_code == 200, ok.text
        assert ok.json() == {"status": "ok", "workers": 1}

        worker = next(p for p in mesh.procs if p.name == "worker-0")
        os.killpg(worker.popen.pid, signal.SIGKILL)
        async with asyncio.timeout(TIMEOUT_S):  # the router's own view: the worker's load stream broke
            while await router_healthy(mesh):
                pass
        down = await http.get("/health")
        assert down.status_code == 503, down.text
        error = down.json()  # our JSON API's error shape (not under /v1/, so not OpenAI's)
        assert error["code"] == 14 and error["message"].startswith("no worker can serve"), error

        restarted = mesh.restart("worker-0")
        assert restarted is not None
        mesh.wait_ready(restarted)
        await wait_until(lambda: httpx.get(f"http://{mesh.envoy_address}/health").status_code == 200,
                         TIMEOUT_S, "/health to answer 200 again")
