"""`meshserve up` on the real vLLM engine, as a newcomer runs it, exercised through Envoy.

One mesh for the module (vLLM starts once): gRPC and HTTP/JSON streaming, greedy equality
with the engine called directly, response caching, cancellation, bad input, and a clean stop.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import jsonschema
import openai
import psutil
import pytest
import redis

from meshserve.loadgen import shapes
from meshserve.router.server import start_router
from meshserve.services.cache_keys import exact_key
from meshserve.services.config import DEFAULT_MODEL, CacheConfig, RouterConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.mesh_tls import MeshTls, operator_dir
from meshserve.services.server import insecure_channel, mesh_channel
from tests.conftest import free_port
from tests.integration.helpers import (
    exact_entries,
    generate,
    index_blocks,
    invalid_argument,
    metric_sum,
    prefix_view_ready,
    scrape,
    text,
    token_ids,
    until,
    wait_until,
    worker_generate,
)
from meshserve.worker.tiny_model import ensure_model
from meshserve.worker.weights import fingerprint

pytestmark = [pytest.mark.integration, pytest.mark.engine]


@dataclass
class UpMesh:
    proc: subprocess.Popen[str]
    envoy: str
    worker: str
    run_dir: Path
    output: list[str]
    redis_url: str

    @property
    def tls(self) -> MeshTls:
        """The operator's certificate: `meshserve up` runs mutual TLS inside by default."""
        return MeshTls.load(operator_dir(self.run_dir))

    def metrics_url(self, name: str) -> str:
        port = (self.run_dir / f"{name}.ready").read_text().split()[1]
        return f"http://127.0.0.1:{port}/metrics"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[UpMesh]:
    run_dir = tmp_path_factory.mktemp("up")
    ports = {name: free_port() for name in ("port", "admin", "gw", "http", "router", "cache", "worker", "redis", "trace")}
    argv = [
        sys.executable, "-m", "meshserve.commands.cli", "up", "--engine", "vllm", "--workers", "1",
        "--port", str(ports["port"]), "--admin-port", str(ports["admin"]),
        "--gateway-port", str(ports["gw"]), "--gateway-http-port", str(ports["http"]), "--router-port", str(ports["router"]),
        "--cache-port", str(ports["cache"]), "--worker-port", str(ports["worker"]),
        "--redis-port", str(ports["redis"]), "--trace-port", str(ports["trace"]), "--run-dir", str(run_dir), "--enforce-eager",
        "--routing", "kv-aware", "--tool-call-parser", "pythonic",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ})
    lines: queue.Queue[str | None] = queue.Queue()
    output: list[str] = []

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            output.append(line)
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + 600
    try:
        while True:  # wait for the launcher's own "up" announcement
            line = lines.get(timeout=max(1.0, deadline - time.monotonic()))
            assert line is not None, "meshserve up exited:\n" + "".join(output)
            if line.startswith("meshserve is up"):
                break
        children = psutil.Process(proc.pid).children(recursive=True)
        assert len(children) >= 6, [c.name() for c in children]  # valkey, cache, worker, router, gateway, envoy
        # The embedded Valkey's password is in its config file, which only this user reads.
        password = (run_dir / "valkey.conf").read_text().split("requirepass ", 1)[1].split()[0]
        yield UpMesh(proc, f"127.0.0.1:{ports['port']}", f"127.0.0.1:{ports['worker']}", run_dir, output,
                     f"redis://:{password}@127.0.0.1:{ports['redis']}/0")
    finally:
        children = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
        proc.send_signal(signal.SIGINT)  # what Ctrl-C does
        code = proc.wait(120)
    # Stopping leaves nothing behind.
    assert code == 0, "".join(output)
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, f"left running after Ctrl-C: {[(p.pid, p.name()) for p in alive]}"
    # vLLM's processes went when asked: none had to be killed (the worker waits 10 s for one first).
    assert "outlived its shutdown" not in (run_dir / "worker-0.log").read_text()


async def test_grpc_stream_from_vllm_through_envoy(mesh: UpMesh) -> None:
    chunks = await generate(mesh.envoy, prompt="The quick brown fox", max_tokens=16, temperature=0, skip_cache=True)
    assert len(chunks) >= 2  # streamed, not one blob
    assert sum(len(c.token_ids) for c in chunks) == 16
    assert chunks[-1].finish_reason in {"length", "stop"}
    assert chunks[-1].usage.completion_tokens == 16 and chunks[-1].usage.prompt_tokens > 0
    assert chunks[0].worker == "worker-0" and not chunks[0].cached


async def test_http_json_stream_from_vllm_through_envoy(mesh: UpMesh) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "skip_cache": True}
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy}", timeout=60) as client:
        async with client.stream("POST", "/v1/generate/stream", json=body) as r:
            assert r.status_code == 200
            events = [json.loads(line[6:]) async for line in r.aiter_lines() if line.startswith("data: ")]
        unary = await client.post("/v1/generate", json=body)
    assert len(events) >= 2
    assert events[-1]["usage"]["completion_tokens"] == 12
    streamed = "".join(e["text"] for e in events)
    assert unary.status_code == 200 and unary.json()["text"] == streamed


async def test_stream_interval_over_http_json_groups_tokens_end_to_end(mesh: UpMesh) -> None:
    body = {"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "ignore_eos": True,
            "skip_cache": True}
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy}", timeout=60) as client:
        streams = []
        for extra in ({}, {"stream_interval": 5}):
            async with client.stream("POST", "/v1/generate/stream", json=body | extra) as r:
                assert r.status_code == 200
                streams.append([json.loads(line[6:]) async for line in r.aiter_lines() if line.startswith("data: ")])
    one, grouped = streams
    # vLLM sends the first token alone, then groups of 5 (the last holds what is left): messages
    # end after tokens 1, 6, 11 and 12. A gateway whose client side was busy writing hands two
    # queued groups over as one message (gateway/relay.py), so a message may end on a later
    # group's end, never inside a group.
    ends = list(itertools.accumulate(len(e["token_ids"]) for e in grouped))
    assert ends[0] == 1 and ends[-1] == 12
    assert set(ends) <= {1, 6, 11, 12}, ends
    assert "".join(e["text"] for e in grouped) == "".join(e["text"] for e in one)


async def test_greedy_through_mesh_equals_engine_direct(mesh: UpMesh) -> None:
    for prompt in ["Hello world", "In the beginning there was"]:
        req = dict(prompt=prompt, max_tokens=24, temperature=0, ignore_eos=True, skip_cache=True)
        via_mesh = await generate(mesh.envoy, **req)
        direct = await worker_generate(mesh.worker, mesh.tls, **req)
        assert token_ids(via_mesh) == token_ids(direct)
        assert text(via_mesh) == text(direct)


PREFIX = ("You are a careful assistant for a shipping company. Answer in short sentences, cite the "
          "order number, never invent tracking data, and ask for the postcode when it is missing. ") * 4


@pytest.mark.parametrize("kind", ["prompt", "chat"])
async def test_router_predicts_the_prefix_vllm_finds_cached(mesh: UpMesh, kind: str) -> None:
    """The router's view comes from vLLM's own KV-cache events: after a request with a long
    prefix, the router predicts for the next one exactly the cached tokens vLLM reports."""
    def request(question: str) -> dict:
        if kind == "chat":
            return {"messages": [pb.ChatMessage(role="system", content=PREFIX),
                                 pb.ChatMessage(role="user", content=question)]}
        return {"prompt": PREFIX + question}

    # A router of its own (in this process) over the mesh's worker and a second one that is down:
    # with one worker to choose from, a router has no choice to make and predicts nothing.
    router = await start_router(RouterConfig(port=0, metrics_port=-1, grace_seconds=0.5, routing="kv-aware",
                                             workers=[mesh.worker, f"127.0.0.1:{free_port()}"],
                                             mesh_tls_dir=str(mesh.tls.directory)))
    channel = mesh_channel(f"127.0.0.1:{router.port}", mesh.tls)
    stub = pb_grpc.RouterStub(channel)

    async def ready() -> bool:  # the first report brings what the engine holds already
        listing = await stub.ListWorkers(pb.ListWorkersRequest(), timeout=5)
        return prefix_view_ready() == 1 and any(w.healthy for w in listing.workers)

    try:
        await until(ready, "the router to hear from the worker and load its tokenizer", timeout=30)
        before = index_blocks() or 0
        # Straight to the worker: the router hears of it only through vLLM's events.
        first = await worker_generate(mesh.worker, mesh.tls, **request(f"Where is order {kind} 1?"), max_tokens=2,
                                      temperature=0)
        prompt_tokens = first[-1].usage.prompt_tokens
        assert prompt_tokens > 4 * 32  # several blocks of 32 tokens (vLLM's block on CPU)
        await wait_until(lambda: (index_blocks() or 0) >= before + 4, 10, "the router to index the worker's new blocks")
        second = request(f"And order {kind} 2?")
        pick = await stub.Pick(pb.PickRequest(request_id=f"kv-{kind}", **second), timeout=10)
    finally:
        await channel.close()
        await router.shutdown()
    answer = await worker_generate(pick.address, mesh.tls, **second, max_tokens=2, temperature=0)
    cached = answer[-1].usage.cached_prompt_tokens
    assert cached >= 4 * 32, "vLLM found the prefix cached"
    assert pick.predicted_cached_tokens == cached


async def test_second_identical_greedy_request_is_served_from_cache(mesh: UpMesh) -> None:
    worker_metrics = mesh.metrics_url("worker-0")
    req = dict(prompt=f"Cache me {time.time_ns()}", max_tokens=10, temperature=0)
    first = await generate(mesh.envoy, **req)
    assert not first[0].cached

    def stored() -> bool:  # the gateway stores after the stream ends, off the request path
        return exact_entries(mesh.redis_url) >= 1

    await wait_until(stored, 10, "the completion to be stored")
    served_before = metric_sum(scrape(worker_metrics), "meshserve_worker_requests_total")
    second = await generate(mesh.envoy, **req)
    assert all(c.cached for c in second) and second[0].worker == ""
    assert text(second) == text(first) and token_ids(second) == token_ids(first)
    assert metric_sum(scrape(worker_metrics), "meshserve_worker_requests_total") == served_before
    # Keyed by the weights the worker loaded (a fingerprint of the model's files), not the name alone.
    async with mesh_channel(mesh.worker, mesh.tls) as channel:
        info = await pb_grpc.WorkerStub(channel).Info(pb.InfoRequest(), timeout=5)
    assert info.weights_id == fingerprint(str(ensure_model()))
    scoped = pb.GenerateRequest(**req, model=f"{DEFAULT_MODEL}@{info.weights_id}")
    with redis.Redis.from_url(mesh.redis_url) as client:
        assert client.exists(exact_key(scoped, "", CacheConfig.key_prefix))


async def test_a_burst_of_identical_requests_is_one_engine_generation(mesh: UpMesh) -> None:
    worker_metrics = mesh.metrics_url("worker-0")

    def engine_finished() -> float:  # vLLM's own counter of finished requests
        return metric_sum(scrape(worker_metrics), "vllm:request_success_total")

    before = engine_finished()
    req = dict(prompt=f"One for all {time.time_ns()}", max_tokens=24, temperature=0)
    async with insecure_channel(mesh.envoy) as channel:
        stub = pb_grpc.InferenceStub(channel)

        async def one(i: int) -> list[pb.GenerateResponse]:
            return [c async for c in stub.Generate(pb.GenerateRequest(request_id=f"burst-{i}", **req))]

        answers = await asyncio.gather(*(one(i) for i in range(300)))

    # vLLM counts a request when its stat logger runs, just after the last output went out.
    await wait_until(lambda: engine_finished() > before, 10, "vLLM to count the request")
    assert engine_finished() == before + 1
    expected = (text(answers[0]), token_ids(answers[0]))
    assert len(expected[1]) == 24
    for i, chunks in enumerate(answers):
        assert (text(chunks), token_ids(chunks)) == expected
        assert {c.request_id for c in chunks} == {f"burst-{i}"} and chunks[-1].usage.completion_tokens == 24
    kinds = [chunks[-1].cache_kind for chunks in answers]
    # The rest streamed the one generation or, arriving after it was stored, hit the cache: the
    # exact entry, or (when that read gave up under a loaded machine's 0.3 s budget) the same
    # answer by meaning, which beat the generation it then cancelled (the engine's count above).
    assert kinds.count("") == 1 and set(kinds) <= {"", "coalesced", "exact", "semantic"}


async def test_client_cancel_aborts_the_engine_request(mesh: UpMesh) -> None:
    worker_metrics = mesh.metrics_url("worker-0")

    def count(reason: str) -> float:
        return metric_sum(scrape(worker_metrics), "meshserve_worker_requests_total", finish_reason=reason)

    aborted_before, finished_before = count("abort"), count("length")
    async with insecure_channel(mesh.envoy) as channel, mesh_channel(mesh.worker, mesh.tls) as wch:
        call = pb_grpc.InferenceStub(channel).Generate(
            pb.GenerateRequest(prompt="Tell a long story", max_tokens=1900, ignore_eos=True, temperature=0, skip_cache=True)
        )
        first = await asyncio.wait_for(call.read(), 60)  # the engine is generating
        assert first.token_ids
        call.cancel()
        await wait_until(lambda: count("abort") > aborted_before, 30, "the worker to count the abort")
        # The engine let the request go: nothing runs, and it never ran to its 1900 tokens.
        reports: list[tuple[int, int]] = []

        async def idle() -> None:
            async for r in pb_grpc.WorkerStub(wch).WatchLoad(pb.WatchLoadRequest()):
                reports.append((r.num_running, r.num_in_flight))
                if r.num_running == 0 and r.num_in_flight == 0:
                    return

        try:
            await asyncio.wait_for(idle(), 30)
        except TimeoutError:
            raise AssertionError(f"the worker still reports load (running, in flight): {reports[-5:]}") from None
    assert count("length") == finished_before


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"prompt": ""}, "'prompt'"),
        ({"prompt": "x", "max_tokens": 0}, "'max_tokens'"),
        ({"prompt": "x", "max_tokens": 100000}, "max_tokens"),
        ({"prompt": "x", "temperature": -1}, "'temperature'"),
        ({"prompt": "x", "top_p": 0}, "'top_p'"),
        ({"prompt": "x", "top_p": 1.5}, "'top_p'"),
        ({"prompt": "x", "stream_interval": -2}, "'stream_interval'"),
        ({"prompt": "word " * 3000, "max_tokens": 8}, "prompt"),
    ],
)
async def test_bad_input_is_invalid_argument_and_mesh_keeps_serving(mesh: UpMesh, fields: dict, named: str) -> None:
    message = await invalid_argument(mesh.envoy, **fields)
    assert named in message
    ok = await generate(mesh.envoy, prompt="still here", max_tokens=2, skip_cache=True)
    assert ok[-1].finish_reason


async def test_an_unknown_model_is_not_found_and_mesh_keeps_serving(mesh: UpMesh) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await generate(mesh.envoy, prompt="x", model="gpt-17", max_tokens=2)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and "'gpt-17' does not exist" in (err.value.details() or "")
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy}", timeout=60) as client:
        r = await client.post("/v1/generate", json={"prompt": "x", "model": "gpt-17", "max_tokens": 2})
    assert r.status_code == 404 and "'gpt-17' does not exist" in r.json()["message"]
    ok = await generate(mesh.envoy, prompt="still here", max_tokens=2, skip_cache=True)
    assert ok[-1].finish_reason


async def test_bad_input_over_http_is_400(mesh: UpMesh) -> None:
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy}", timeout=60) as client:
        r = await client.post("/v1/generate", json={"prompt": "x", "max_tokens": -3})
        assert r.status_code == 400 and "'max_tokens'" in r.json()["message"]
        r = await client.post("/v1/generate", json={"prompt": "x", "maxtokens": 3})
        assert r.status_code == 400 and "maxtokens" in r.json()["message"]


# -- OpenAI sampling parity: the official client, unchanged, against real vLLM through Envoy ------


def openai_client(mesh: UpMesh) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://{mesh.envoy}/v1", api_key="unused", max_retries=0, timeout=120)


def check_top_logprobs(token: Any, k: int) -> None:
    """k alternatives, most likely first, whose probabilities sum to at most 1."""
    values = [t.logprob for t in token.top_logprobs]
    assert len(values) == k and values == sorted(values, reverse=True)
    assert sum(math.exp(v) for v in values) <= 1 + 1e-6
    assert token.bytes == list(token.token.encode("utf-8", errors="replace"))


async def test_openai_n_logprobs_and_penalties_from_vllm(mesh: UpMesh) -> None:
    client = openai_client(mesh)
    ask = dict(model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Name three colours"}], max_tokens=6,
               n=3, temperature=1.0, seed=11, logprobs=True, top_logprobs=3, presence_penalty=0.5,
               frequency_penalty=0.25, extra_body={"repetition_penalty": 1.1, "top_k": 50, "min_p": 0.01,
                                                   "ignore_eos": True})
    resp = await client.chat.completions.create(**ask)
    assert [c.index for c in resp.choices] == [0, 1, 2]
    for choice in resp.choices:
        assert choice.finish_reason == "length" and len(choice.logprobs.content) == 6
        for token in choice.logprobs.content:
            check_top_logprobs(token, 3)
    assert resp.usage.completion_tokens == 18  # every choice's tokens; the prompt once
    assert len({c.message.content for c in resp.choices}) > 1  # seed + i per choice, as vLLM
    # Seeded, so cacheable: the same request again is an exact hit, logprobs and all.
    again = await client.chat.completions.create(**ask)
    assert again.model_extra["cache"]["kind"] == "exact"
    assert [c.message.content for c in again.choices] == [c.message.content for c in resp.choices]
    assert [c.logprobs.content for c in again.choices] == [c.logprobs.content for c in resp.choices]


async def test_openai_streams_n_choices_by_index_with_logprobs(mesh: UpMesh) -> None:
    client = openai_client(mesh)
    ask = dict(model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Count to five"}], max_tokens=5, n=2,
               temperature=0.8, seed=3, logprobs=True, top_logprobs=2,
               extra_body={"ignore_eos": True, "skip_cache": True})
    stream = await client.chat.completions.create(**ask, stream=True, stream_options={"include_usage": True})
    texts: dict[int, str] = {}
    tokens: dict[int, list[Any]] = {}
    finished: dict[int, str] = {}
    usage = None
    async for chunk in stream:
        if not chunk.choices:
            usage = chunk.usage
            continue
        (choice,) = chunk.choices
        assert (choice.delta.role == "assistant") == (choice.index not in texts)  # the role comes first
        texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
        tokens.setdefault(choice.index, []).extend(choice.logprobs.content)
        if choice.finish_reason:
            finished[choice.index] = choice.finish_reason
    assert finished == {0: "length", 1: "length"} and usage is not None and usage.completion_tokens == 10
    for index in (0, 1):
        assert len(tokens[index]) == 5
        for token in tokens[index]:
            check_top_logprobs(token, 2)
    unary = await client.chat.completions.create(**ask)
    assert {c.index: c.message.content for c in unary.choices} == texts  # streamed = unary, choice by choice


async def test_openai_completions_logprobs_echo_and_vllm_fields(mesh: UpMesh) -> None:
    client = openai_client(mesh)
    greedy = dict(model=DEFAULT_MODEL, prompt="Once upon a time", max_tokens=5, temperature=0)
    resp = await client.completions.create(**greedy, logprobs=2, extra_body={"ignore_eos": True, "skip_cache": True})
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(5)]
    for token, value, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True):
        assert len(top) == 2 and top[token] == value == max(top.values())  # greedy: the likeliest
    echo = await client.completions.create(**greedy, echo=True, extra_body={"ignore_eos": True})
    assert echo.choices[0].text == "Once upon a time" + resp.choices[0].text
    # vLLM's own fields through the native API: the output changes as vLLM defines them.
    base = dict(prompt="Hello there", max_tokens=6, temperature=0, ignore_eos=True, skip_cache=True)
    full = token_ids(await generate(mesh.envoy, **base))
    banned = token_ids(await generate(mesh.envoy, **base, logit_bias={full[0]: -100.0}))
    assert banned[0] != full[0]
    stopped = await generate(mesh.envoy, **base, stop_token_ids=[full[2]])
    assert token_ids(stopped) == full[: full.index(full[2]) + 1] and stopped[-1].finish_reason == "stop"


ANSWER = {"type": "object", "additionalProperties": False, "required": ["city", "rank"],
          "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]}, "rank": {"type": "integer", "minimum": 1, "maximum": 99}}}


async def test_openai_json_schema_answers_parse_and_validate(mesh: UpMesh) -> None:
    """The official client's response_format json_schema, on the random-weight tiny model:
    the answer parses and validates (streamed and not); a malformed schema is a 400."""
    client = openai_client(mesh)
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER, "strict": True}}
    ask = dict(model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Which city?"}], max_tokens=48,
               temperature=0, response_format=fmt)
    resp = await client.chat.completions.create(**ask)
    assert resp.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(resp.choices[0].message.content), ANSWER)
    streamed = "".join([c.choices[0].delta.content or "" async for c in
                        await client.chat.completions.create(**ask, stream=True, extra_body={"skip_cache": True})
                        if c.choices])
    assert streamed == resp.choices[0].message.content
    as_object = await client.chat.completions.create(**{**ask, "response_format": {"type": "json_object"},
                                                        "max_tokens": 200})
    assert as_object.choices[0].finish_reason == "length" or isinstance(json.loads(as_object.choices[0].message.content), dict)
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(**{**ask, "response_format": {
            "type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "object", "required": "city"}}}})
    assert err.value.body["param"] == "response_format.json_schema.schema"
    choice = await client.completions.create(model=DEFAULT_MODEL, prompt="Pick:", max_tokens=8, temperature=0,
                                             extra_body={"structured_outputs": {"choice": ["left", "right"]}})
    assert choice.choices[0].text in ("left", "right")


LOOKUP = {"type": "function", "function": {"name": "lookup", "description": "find an order", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["order", "urgent"],
    "properties": {"order": {"type": "integer", "minimum": 1, "maximum": 99999}, "urgent": {"type": "boolean"}}}}}
NOTE = {"type": "function", "function": {"name": "note", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["level"],
    "properties": {"level": {"enum": ["low", "high"]}}}}}


async def test_openai_tool_choice_yields_parseable_tool_calls(mesh: UpMesh) -> None:
    """tool_choice naming a function (or "required") on the random-weight tiny model: the call's
    arguments parse and match the function's parameters, streamed and not; the history may hold
    the calls and their results."""
    client = openai_client(mesh)
    messages = [{"role": "user", "content": "Where is my order?"}]
    ask = dict(model=DEFAULT_MODEL, messages=messages, max_tokens=40, temperature=0, tools=[LOOKUP, NOTE],
               tool_choice={"type": "function", "function": {"name": "lookup"}})
    resp = await client.chat.completions.create(**ask)
    (call,) = resp.choices[0].message.tool_calls
    assert call.type == "function" and call.function.name == "lookup"
    jsonschema.validate(json.loads(call.function.arguments), LOOKUP["function"]["parameters"])
    stream = await client.chat.completions.create(**ask, stream=True, extra_body={"skip_cache": True})
    pieces = [d for c in [c async for c in stream] if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert pieces[0].id and pieces[0].function.name == "lookup"
    assert "".join(p.function.arguments or "" for p in pieces) == call.function.arguments
    history = [*messages, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
               {"role": "tool", "tool_call_id": call.id, "content": '{"status": "shipped"}'}]
    required = await client.chat.completions.create(**{**ask, "messages": history, "tool_choice": "required",
                                                       "max_tokens": 120}, parallel_tool_calls=False)
    choice = required.choices[0]
    if choice.finish_reason == "tool_calls":  # a random model may run out of tokens first
        (made,) = choice.message.tool_calls
        tool = {"lookup": LOOKUP, "note": NOTE}[made.function.name]
        jsonschema.validate(json.loads(made.function.arguments), tool["function"]["parameters"])
    else:
        assert choice.finish_reason == "length" and not choice.message.tool_calls


# What a model served with vLLM's pythonic parser writes for a call (Llama 3.2's style); the random
# tiny model writes it when a regex makes it.
PYTHONIC_CALL = r"\[lookup\(order=[1-9][0-9]{0,3}, urgent=(True|False)\)\]"


async def test_openai_tool_choice_auto_finds_the_calls_with_vllms_parser(mesh: UpMesh) -> None:
    """tool_choice "auto" (the default with tools) on a worker started with --tool-call-parser
    pythonic: vLLM's own parser finds the call in the output and the answer carries it as
    tool_calls, streamed and not; output with no call stays content."""
    client = openai_client(mesh)
    ask = dict(model=DEFAULT_MODEL, messages=[{"role": "user", "content": "Where is order 12?"}], max_tokens=40,
               temperature=0, tools=[LOOKUP, NOTE])
    resp = await client.chat.completions.create(**ask, extra_body={"structured_outputs": {"regex": PYTHONIC_CALL}})
    choice = resp.choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and not choice.message.content
    assert call.type == "function" and call.function.name == "lookup" and call.id
    jsonschema.validate(json.loads(call.function.arguments), LOOKUP["function"]["parameters"])
    stream = await client.chat.completions.create(**ask, stream=True, extra_body={
        "structured_outputs": {"regex": PYTHONIC_CALL}, "skip_cache": True})
    chunks = [c async for c in stream]
    pieces = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert pieces[0].id and pieces[0].function.name == "lookup"
    assert json.loads("".join(p.function.arguments or "" for p in pieces)) == json.loads(call.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    plain = await client.chat.completions.create(**ask, tool_choice="auto",
                                                 extra_body={"structured_outputs": {"regex": "Order 12 is on its way"}})
    assert plain.choices[0].message.content == "Order 12 is on its way" and not plain.choices[0].message.tool_calls
    assert plain.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(("body", "param"), [
    ({"n": 0}, "n"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 25}, "top_logprobs"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"temperature": 2.5}, "temperature"),
    ({"logit_bias": {"99999999": 5}}, "logit_bias"),  # outside the vocabulary: vLLM's own check
    ({"stop_token_ids": [99999999]}, "stop_token_ids"),
])
async def test_openai_bad_sampling_is_400_naming_the_field(mesh: UpMesh, body: dict, param: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy}", timeout=60) as client:
        r = await client.post("/v1/chat/completions", json={
            "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.json()
        ok = await client.post("/v1/chat/completions", json={
            "model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "skip_cache": True})
        assert ok.status_code == 200


# Where meshserve's answers differ from `vllm serve`'s on purpose (path -> why).
SHAPE_EXTRAS = frozenset({
    "cache",                        # how an answer not generated for this request alone was served
    "choices[].message.tool_calls",  # [] when there are none, as OpenAI's (vLLM leaves the key out)
    "choices[].delta.tool_calls",
    "usage.prompt_tokens_details",  # cached prompt tokens, in stream usage too (vLLM: only with a flag)
})


async def test_response_shapes_match_vllm_serve(mesh: UpMesh) -> None:
    """The same requests as bench/record_vllm_shapes.py sent to `vllm serve` on the same model:
    every key vLLM answers with a value is in ours with the same JSON type."""
    recorded = json.loads(shapes.RECORDED.read_text())["shapes"]
    ours = await asyncio.to_thread(shapes.answer_shapes, f"http://{mesh.envoy}", DEFAULT_MODEL)
    assert set(ours) == set(recorded)
    diffs = {name: d for name in recorded
             if (d := shapes.differences(recorded[name], ours[name], extra_ok=SHAPE_EXTRAS))}
    assert not diffs, json.dumps(diffs, indent=1)


async def test_tokenize_and_detokenize_are_the_engines_own(mesh: UpMesh, tiny_model: Path) -> None:
    """vLLM's /tokenize and /detokenize through Envoy: the ids the engine gets (a chat through
    its template) and the text back; ids outside the vocabulary are a 400 naming 'tokens'."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    messages = [{"role": "user", "content": "Hello there"}]
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy}", timeout=60) as http:
        plain = (await http.post("/tokenize", json={"model": DEFAULT_MODEL, "prompt": "The quick brown fox"})).json()
        chat = (await http.post("/tokenize", json={"messages": messages})).json()
        back = await http.post("/detokenize", json={"tokens": plain["tokens"]})
        bad = await http.post("/detokenize", json={"tokens": [len(tokenizer) + 5]})
    assert plain["tokens"] == tokenizer.encode("The quick brown fox") and plain["count"] == len(plain["tokens"])
    assert plain["max_model_len"] == 2048
    rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert chat["tokens"] == tokenizer.encode(rendered, add_special_tokens=False)
    # The count is the prompt the engine saw: a chat completion of it reports as many prompt tokens.
    done = await openai_client(mesh).chat.completions.create(model=DEFAULT_MODEL, messages=messages, max_tokens=1,
                                                             extra_body={"skip_cache": True})
    assert done.usage.prompt_tokens == chat["count"]
    assert back.status_code == 200 and back.json()["prompt"] == tokenizer.decode(plain["tokens"])
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


def test_the_helm_charts_autoscaling_query_reads_metrics_a_vllm_worker_serves(mesh: UpMesh) -> None:
    """KEDA scales the chart's workers on a Prometheus query: every metric it names is one the
    running vLLM worker really exports."""
    from tests import chart

    served = {name.partition("{")[0] for name in scrape(mesh.metrics_url("worker-0"))}
    for profile in chart.PROFILES.values():
        wanted = chart.keda_metrics(chart.render(profile))
        assert wanted and wanted <= served, wanted - served
