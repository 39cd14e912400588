"""Two gateways behind Envoy (`meshserve up --gateways 2`): one killed under load loses only the
streams it held, each ending with a clear error, and new requests keep flowing; one drained
(SIGTERM) loses nothing."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator

import grpc
import pytest

from meshserve.commands.launcher import Mesh
from meshserve.services.config import WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from tests.integration.helpers import mesh_spec, metric_sum, scrape, wait_until

pytestmark = pytest.mark.integration

USERS = 32
TIMEOUT_S = 60.0


@pytest.fixture
def two_gateways(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    spec = mesh_spec(tmp_path_factory.mktemp("faults-gateways"), "sim", workers=2, gateways=2,
                     worker=WorkerConfig(sim_itl_base_ms=8.0))
    with Mesh(spec) as mesh:
        yield mesh


async def stream(channel: grpc.aio.Channel, i: int, max_tokens: int) -> grpc.StatusCode:
    request = pb.GenerateRequest(prompt=f"user {i} asks", max_tokens=max_tokens, temperature=0, cache="off")
    try:
        chunks = [c async for c in pb_grpc.InferenceStub(channel).Generate(request, timeout=TIMEOUT_S)]
    except grpc.aio.AioRpcError as e:
        return e.code()
    assert chunks[-1].finish_reason == "length" and sum(len(c.token_ids) for c in chunks) == max_tokens
    return grpc.StatusCode.OK


def in_flight(mesh: Mesh, name: str) -> float:
    return metric_sum(scrape(mesh.metrics[name]), "meshserve_gateway_in_flight")


def streaming(mesh: Mesh, name: str) -> bool:
    """The gateway holds streams, and has sent some client its first token (its response
    headers: past them Envoy cannot retry a stream elsewhere)."""
    metrics = scrape(mesh.metrics[name])
    return (metric_sum(metrics, "meshserve_gateway_in_flight") > 0
            and metric_sum(metrics, "meshserve_gateway_time_to_first_token_seconds_count") > 0)


async def load_then(mesh: Mesh, sig: signal.Signals, max_tokens: int) -> tuple[list[grpc.StatusCode], float]:
    """USERS streams through Envoy; once both gateways hold some, ``sig`` to gateway-1. Returns
    each stream's status and how many gateway-1 held just before the signal."""
    victim = next(p for p in mesh.procs if p.name == "gateway-1")
    async with insecure_channel(mesh.envoy_address) as channel:
        tasks = [asyncio.create_task(stream(channel, i, max_tokens)) for i in range(USERS)]
        await wait_until(lambda: streaming(mesh, "gateway") and streaming(mesh, "gateway-1"),
                         TIMEOUT_S, "both gateways to stream tokens")
        held = in_flight(mesh, "gateway-1")
        os.killpg(victim.popen.pid, sig)
        codes = list(await asyncio.gather(*tasks))
        # New requests flow through the other gateway (Envoy retries a refused connection there).
        after = await asyncio.gather(*(stream(channel, 1000 + i, 8) for i in range(16)))
    assert [c for c in after if c != grpc.StatusCode.OK] == []
    return codes, held


async def test_a_killed_gateway_loses_only_its_own_streams(two_gateways: Mesh) -> None:
    codes, held = await load_then(two_gateways, signal.SIGKILL, max_tokens=400)
    failed = [c for c in codes if c != grpc.StatusCode.OK]
    print(f"gateway-1 held {held:.0f} of {USERS} streams; {len(failed)} failed: {set(failed)}")
    assert 0 < len(failed) <= held  # its own streams at most; none of the other gateway's
    # Each with a clear status: Envoy resets the streams of a gateway that vanished.
    assert set(failed) <= {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL}


async def test_a_drained_gateway_loses_nothing(two_gateways: Mesh) -> None:
    # Streams shorter than the gateway's grace period (2 s in mesh_spec) finish on it.
    codes, held = await load_then(two_gateways, signal.SIGTERM, max_tokens=60)
    assert held > 0
    assert all(code == grpc.StatusCode.OK for code in codes), codes
    victim = next(p for p in two_gateways.procs if p.name == "gateway-1")
    await wait_until(lambda: victim.popen.poll() is not None, 10, "the drained gateway to exit")
    assert victim.popen.returncode == 0
