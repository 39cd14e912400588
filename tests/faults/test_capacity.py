"""Past capacity, every client is told why: 2,000 streams at once through Envoy against a small sim
fleet (two workers running 32 sequences each; the gateway queueing at most 100 for a place on
it), over gRPC and over the OpenAI edge. Each stream completes or is refused with
RESOURCE_EXHAUSTED (HTTP 429) and a retry hint; none ends CANCELLED, UNKNOWN or with a 5xx; a
client that honours the retry hint gets every answer."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import AsyncIterator, Iterator

import aiohttp
import grpc
import pytest

from meshserve.commands.launcher import Mesh
from meshserve.loadgen import runner
from meshserve.services.config import DEFAULT_MODEL, GatewayConfig, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from tests.integration.helpers import mesh_spec

pytestmark = pytest.mark.integration

STREAMS = 2000
TIMEOUT_S = 240.0
REFUSED = grpc.StatusCode.RESOURCE_EXHAUSTED


@pytest.fixture(scope="module")
def small_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    spec = mesh_spec(tmp_path_factory.mktemp("faults-capacity"), "sim", workers=2,
                     worker=WorkerConfig(max_num_seqs=32, max_queue=64), gateway=GatewayConfig(flow_max_queued=100))
    with Mesh(spec) as mesh:
        yield mesh


def request(i: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt=f"user {i} asks about the weather", max_tokens=16, temperature=0, cache="off")


async def grpc_stream(channel: grpc.aio.Channel, i: int) -> tuple[grpc.StatusCode, dict[str, str]]:
    """The stream's status and, when it failed, its trailing metadata."""
    try:
        chunks = [c async for c in pb_grpc.InferenceStub(channel).Generate(request(i), timeout=TIMEOUT_S)]
    except grpc.aio.AioRpcError as e:
        return e.code(), dict(e.trailing_metadata() or ())
    assert chunks[-1].finish_reason == "length"
    return grpc.StatusCode.OK, {}


async def test_2000_grpc_streams_complete_or_are_refused_with_a_retry_hint(small_fleet: Mesh) -> None:
    channels = runner.open_channels(small_fleet.envoy_address, STREAMS // runner.STREAMS_PER_CHANNEL)
    try:
        outcomes = await asyncio.gather(*(grpc_stream(channels[i % len(channels)], i) for i in range(STREAMS)))
    finally:
        await asyncio.gather(*(c.close() for c in channels))
    codes = Counter(code for code, _ in outcomes)
    print(f"{STREAMS} gRPC streams: {dict(codes)}")
    assert set(codes) <= {grpc.StatusCode.OK, REFUSED}, codes  # no CANCELLED, UNKNOWN, UNAVAILABLE
    assert codes[grpc.StatusCode.OK] > 0 and codes[REFUSED] > 0  # the fleet took some, refused the rest
    assert all(trailers.get("retry-after") for code, trailers in outcomes if code == REFUSED)


async def http_stream(session: aiohttp.ClientSession, i: int) -> tuple[int, str | None, bool]:
    """The status, the retry-after header, and whether a 200's stream ended with its finish."""
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": f"user {i} asks"}], "max_tokens": 16,
            "temperature": 0, "stream": True}
    async with session.post("/v1/chat/completions", json=body) as response:
        finished = False
        if response.status == 200:
            async for line in response.content:
                if line.startswith(b"data: {"):
                    chunk = json.loads(line.removeprefix(b"data: "))
                    assert "error" not in chunk, chunk
                    finished |= any(c.get("finish_reason") for c in chunk.get("choices", []))
        else:
            await response.read()
        return response.status, response.headers.get("retry-after"), finished


@pytest.fixture
async def http_session(small_fleet: Mesh) -> AsyncIterator[aiohttp.ClientSession]:
    # A connection per stream (HTTP/1.1, as most SDKs speak it): the 2,000 are open at once.
    async with aiohttp.ClientSession(f"http://{small_fleet.envoy_address}", connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session:
        yield session


async def test_2000_openai_streams_complete_or_are_refused_with_429(http_session: aiohttp.ClientSession) -> None:
    outcomes = await asyncio.gather(*(http_stream(http_session, i) for i in range(STREAMS)))
    statuses = Counter(status for status, _, _ in outcomes)
    print(f"{STREAMS} OpenAI streams: {dict(statuses)}")
    assert set(statuses) <= {200, 429}, statuses
    assert statuses[200] > 0 and statuses[429] > 0
    assert all(finished for status, _, finished in outcomes if status == 200)
    assert all(retry_after for status, retry_after, _ in outcomes if status == 429)


async def test_a_client_honouring_the_retry_hint_gets_every_answer(small_fleet: Mesh) -> None:
    channels = runner.open_channels(small_fleet.envoy_address, 10)

    def opener(i: int) -> runner.OpenStream:
        return lambda: pb_grpc.InferenceStub(channels[i % len(channels)]).Generate(request(i), timeout=TIMEOUT_S)

    try:
        results, _ = await runner.run_requests([(opener(i), 8) for i in range(1000)], [0.0] * 1000, 1000,
                                               honor_retry_after=True)
    finally:
        await asyncio.gather(*(c.close() for c in channels))
    assert all(r.success for r in results), Counter(r.error_code for r in results if not r.success)
    assert sum(r.retries for r in results) > 0  # refused first, with a hint, and served when they came back
