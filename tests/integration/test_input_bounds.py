"""What one request may hold, end to end through Envoy on a sim mesh: each bound refused with a
400 naming the field before any worker (or the router) sees the request, and a flood of refused
1 MiB prompts leaves a small request's time to first token within twice its idle figure."""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections.abc import Iterator

import grpc
import httpx
import pytest

from meshserve.commands.launcher import Mesh
from meshserve.services.config import DEFAULT_MODEL, RequestLimits
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from meshserve.services.validation import PARAM_METADATA
from tests.integration.helpers import mesh_spec, metric_sum, scrape

pytestmark = pytest.mark.integration

LIMITS = RequestLimits()
MIB = 2**20


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with Mesh(mesh_spec(tmp_path_factory.mktemp("bounds-mesh"), "sim", workers=2, grace_seconds=1)) as m:
        yield m


def seen_by_workers(mesh: Mesh) -> float:
    """Requests the workers and the router have seen: picks made, and requests the workers ended
    (refused ones too)."""
    router = metric_sum(scrape(mesh.metrics["router"]), "meshserve_router_picks_total")
    workers = sum(metric_sum(scrape(mesh.metrics[f"worker-{i}"]), "meshserve_worker_requests_total")
                  for i in range(2))
    return router + workers


def chat(**fields: object) -> dict:
    return {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}


def tool(i: int, parameters: object | None = None) -> dict:
    return {"type": "function", "function": {"name": f"f{i}", "parameters": parameters or {"type": "object"}}}


def nested(depth: int) -> list:
    """JSON arrays nested ``depth`` deep (a protobuf Struct holds arrays deeper than objects)."""
    value: list = []
    for _ in range(depth - 1):
        value = [value]
    return value


HTTP_CASES = [
    ("messages", chat(messages=[{"role": "user", "content": "x"}] * (LIMITS.max_messages + 1))),
    ("stop", chat(stop=[f"s{i}" for i in range(LIMITS.max_stop + 1)])),
    ("logit_bias", chat(logit_bias={str(i): 1 for i in range(LIMITS.max_logit_bias + 1)})),
    ("tools", chat(tools=[tool(i) for i in range(LIMITS.max_tools + 1)], tool_choice="none")),
    ("structured_outputs.json", chat(structured_outputs={"json": {"type": "array", "x": nested(LIMITS.max_json_depth)}})),
    ("response_format", chat(response_format={"type": "json_schema", "json_schema": {
        "name": "big", "schema": {"type": "object", "description": "d" * LIMITS.max_schema_bytes}}})),
    ("chat_template_kwargs", chat(chat_template_kwargs={"enable_thinking": nested(LIMITS.max_json_depth)})),
    (None, chat(structured_outputs={"json": {"type": "array", "x": nested(60)}})),  # past what protobuf reads
]


@pytest.mark.parametrize(("param", "body"), HTTP_CASES, ids=[c[0] or "undecodable" for c in HTTP_CASES])
async def test_an_openai_request_past_a_bound_is_a_400_naming_the_field_no_worker_sees(
    mesh: Mesh, param: str | None, body: dict
) -> None:
    before = seen_by_workers(mesh)
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}", timeout=30) as http:
        reply = await http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error", error
    assert seen_by_workers(mesh) == before


GRPC_CASES = [
    ("prompt", pb.GenerateRequest(prompt="p" * (LIMITS.max_prompt_bytes + 1), max_tokens=2)),
    ("stop", pb.GenerateRequest(prompt="p", stop=["a"] * (LIMITS.max_stop + 1))),
    ("tools", pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="x")],
                                 tools=json.dumps([tool(i) for i in range(LIMITS.max_tools + 1)]))),
    ("structured_outputs.regex", pb.GenerateRequest(
        prompt="p", structured_outputs=pb.StructuredOutputs(regex="a" * (LIMITS.max_schema_bytes + 1)))),
    ("request_id", pb.GenerateRequest(prompt="p", request_id="r" * (LIMITS.max_request_id_chars + 1))),
]


@pytest.mark.parametrize(("param", "request_"), GRPC_CASES, ids=[c[0] for c in GRPC_CASES])
async def test_a_grpc_request_past_a_bound_is_invalid_argument_naming_the_field_no_worker_sees(
    mesh: Mesh, param: str, request_: pb.GenerateRequest
) -> None:
    before = seen_by_workers(mesh)
    async with insecure_channel(mesh.envoy_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [c async for c in pb_grpc.InferenceStub(channel).Generate(request_, timeout=30)]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    assert dict(err.value.trailing_metadata() or ())[PARAM_METADATA] == param
    assert seen_by_workers(mesh) == before


async def test_a_grpc_message_past_the_gateways_receive_bound_is_refused_unread(mesh: Mesh) -> None:
    before = seen_by_workers(mesh)
    async with insecure_channel(mesh.envoy_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            request = pb.GenerateRequest(prompt="p", stop=["s" * (LIMITS.max_message_bytes + 1)])
            _ = [c async for c in pb_grpc.InferenceStub(channel).Generate(request, timeout=30)]
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, err.value.details()
    assert seen_by_workers(mesh) == before


# -- a flood of refused prompts ------------------------------------------------------------------

SAMPLES = 15
FLOOD = 20


async def ttft(stub: pb_grpc.InferenceStub, i: int) -> float:
    started = time.perf_counter()
    call = stub.Generate(pb.GenerateRequest(prompt=f"small request {i}", max_tokens=2, skip_cache=True), timeout=30)
    await call.read()
    elapsed = time.perf_counter() - started
    while await call.read() is not grpc.aio.EOF:
        pass
    return elapsed


async def test_refused_one_mib_prompts_leave_a_small_requests_ttft_within_twice_idle(mesh: Mesh) -> None:
    """20 senders each send a 1 MiB prompt again as soon as it is refused, through Envoy to the
    gateway (gRPC, unbuffered: the gateway's receive bound refuses it from its length prefix, before
    reading it); meanwhile a small request's time to first token is measured, and the medians of
    the two phases are compared."""
    big = pb.GenerateRequest(prompt="word " * (MIB // 5), max_tokens=2).SerializeToString()
    refused = 0
    async with insecure_channel(mesh.envoy_address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        for i in range(3):  # warm: connections, the workers' first steps
            await ttft(stub, i)
        idle = [await ttft(stub, i) for i in range(SAMPLES)]
        stop = asyncio.Event()

        async def flood() -> None:
            nonlocal refused
            async with insecure_channel(mesh.envoy_address) as own:
                send = own.unary_stream("/meshserve.v1.Inference/Generate", request_serializer=None,
                                        response_deserializer=pb.GenerateResponse.FromString)
                while not stop.is_set():
                    try:
                        _ = [c async for c in send(big, timeout=30)]
                    except grpc.aio.AioRpcError as e:
                        assert e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.details()
                        refused += 1

        floods = [asyncio.create_task(flood()) for _ in range(FLOOD)]
        try:
            while refused < FLOOD:  # every sender has had one refused: the flood is on
                await asyncio.sleep(0.01)
            loaded = [await ttft(stub, i) for i in range(SAMPLES)]
        finally:
            stop.set()
            await asyncio.gather(*floods)
    idle_ms, loaded_ms = statistics.median(idle) * 1000, statistics.median(loaded) * 1000
    print(f"small request TTFT: idle {idle_ms:.1f} ms, while {FLOOD} senders' 1 MiB prompts were refused "
          f"{loaded_ms:.1f} ms ({refused} refused)")
    assert refused > 2 * FLOOD
    assert loaded_ms <= 2 * idle_ms, (idle_ms, loaded_ms)
