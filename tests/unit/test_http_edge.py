"""The gateway's HTTP edge prints every chunk as the transcoder would: its fast path for plain
text chunks gives the same JSON as the reflection path, and it leaves every other chunk to it;
errors before the first chunk get the transcoder's HTTP status and OpenAI's error body."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import grpc
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshserve.gateway import http_edge
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.validation import PARAM_METADATA

HEAD = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1796339102, "model": "m",
        "system_fingerprint": "meshserve-0.1.0"}
texts = st.text(max_size=12)


@st.composite
def chat_chunks(draw: st.DrawFn) -> pb.ChatCompletionChunk:
    chunk = pb.ChatCompletionChunk(**HEAD)
    for index in range(draw(st.integers(0, 3))):
        choice = chunk.choices.add(index=index)
        if draw(st.booleans()):
            choice.delta.role = "assistant"
        if draw(st.booleans()):
            choice.delta.content = draw(texts)
        if draw(st.booleans()):
            choice.finish_reason = draw(st.sampled_from(["stop", "length"]))
    return chunk


@st.composite
def completion_chunks(draw: st.DrawFn) -> pb.Completion:
    chunk = pb.Completion(**{**HEAD, "id": "cmpl-1", "object": "text_completion"})
    for index in range(draw(st.integers(0, 3))):
        choice = chunk.choices.add(index=index, text=draw(texts))
        if draw(st.booleans()):
            choice.finish_reason = "length"
    return chunk


@given(chat_chunks())
def test_a_plain_chat_chunk_prints_as_the_reflection_path_prints_it(chunk: pb.ChatCompletionChunk) -> None:
    fast = http_edge._plain_chat(chunk)
    assert fast is not None
    assert orjson.loads(fast) == orjson.loads(http_edge.to_json(chunk))


@given(completion_chunks())
def test_a_plain_completion_chunk_prints_as_the_reflection_path_prints_it(chunk: pb.Completion) -> None:
    fast = http_edge._plain_completion(chunk)
    assert fast is not None
    assert orjson.loads(fast) == orjson.loads(http_edge.to_json(chunk))


def test_the_reflection_path_prints_as_the_transcoder_does() -> None:
    """Envoy's print options: proto field names, fields without presence printed when empty
    (``tool_calls: []``), optional fields only when set (the role of later chunks)."""
    chunk = pb.ChatCompletionChunk(**HEAD)
    chunk.choices.add(index=0).delta.content = " like"
    assert json.loads(http_edge.chunk_json(chunk)) == {
        **HEAD, "choices": [{"index": 0, "delta": {"content": " like", "tool_calls": []}}]}


def with_logprobs() -> pb.ChatCompletionChunk:
    chunk = pb.ChatCompletionChunk(**HEAD)
    chunk.choices.add(index=0).logprobs.content.add(token="a", logprob=-0.5)
    return chunk


def with_tool_call() -> pb.ChatCompletionChunk:
    chunk = pb.ChatCompletionChunk(**HEAD)
    chunk.choices.add(index=0).delta.tool_calls.add(index=0, id="call-1")
    return chunk


def with_reasoning() -> pb.ChatCompletionChunk:
    chunk = pb.ChatCompletionChunk(**HEAD)
    chunk.choices.add(index=0).delta.reasoning = "thinking"
    return chunk


@pytest.mark.parametrize("chunk", [
    pb.ChatCompletionChunk(**HEAD, usage=pb.CompletionUsage(prompt_tokens=3, completion_tokens=2, total_tokens=5)),
    pb.ChatCompletionChunk(**HEAD, error=pb.OpenAIError(message="lost", type="server_error")),
    pb.ChatCompletionChunk(**HEAD, cache=pb.CacheInfo(kind="exact")),
    with_logprobs(),
    with_tool_call(),
    with_reasoning(),
], ids=["usage", "error", "cache", "logprobs", "tool-call", "reasoning"])
def test_any_other_chat_chunk_takes_the_reflection_path(chunk: pb.ChatCompletionChunk) -> None:
    assert http_edge._plain_chat(chunk) is None
    assert orjson.loads(http_edge.chunk_json(chunk)) == orjson.loads(http_edge.to_json(chunk))


def test_a_completion_chunk_with_logprobs_takes_the_reflection_path() -> None:
    chunk = pb.Completion(**HEAD)
    chunk.choices.add(index=0, text="a").logprobs.tokens.append("a")
    assert http_edge._plain_completion(chunk) is None
    assert json.loads(http_edge.chunk_json(chunk))["choices"][0]["logprobs"]["tokens"] == ["a"]


@pytest.mark.parametrize(("code", "status"), [
    (grpc.StatusCode.INVALID_ARGUMENT, 400), (grpc.StatusCode.RESOURCE_EXHAUSTED, 429),
    (grpc.StatusCode.UNAVAILABLE, 503), (grpc.StatusCode.DEADLINE_EXCEEDED, 504),
    (grpc.StatusCode.NOT_FOUND, 404), (grpc.StatusCode.INTERNAL, 500),
])
def test_an_error_before_the_first_chunk_is_the_transcoder_s_status_with_an_openai_body(
    code: grpc.StatusCode, status: int
) -> None:
    reply = http_edge.error_response(code, 'bad "value"', ((PARAM_METADATA, "temperature"), ("x-trace-id", "ab")))
    assert reply.status == status
    assert reply.headers["x-trace-id"] == "ab"
    assert PARAM_METADATA not in reply.headers
    assert reply.body is not None
    error = json.loads(reply.body)["error"]  # type: ignore[arg-type]
    assert error == {"message": 'bad "value"', "type": error["type"], "param": "temperature",
                     "code": code.name.lower()}
    assert ("retry-after" in reply.headers) == (code == grpc.StatusCode.RESOURCE_EXHAUSTED)


async def test_a_burst_of_connections_is_queued_by_the_kernel_while_the_loop_is_busy() -> None:
    """Envoy opens an HTTP/1.1 connection per stream to the edge: 300 users arriving together are
    300 connects, made while the gateway's loop is busy. Here the loop does not run at all while
    they are made: each must still complete (queued for accept), not wait out a dropped SYN."""
    # The kernel caps any backlog at net.core.somaxconn (4096 on current kernels, 128 before 5.4).
    burst = min(300, int(Path("/proc/sys/net/core/somaxconn").read_text()))
    edge = http_edge.HttpEdge(None, "127.0.0.1", 0, 1.0)  # type: ignore[arg-type]  # no request is sent
    await edge.start()
    sockets: list[socket.socket] = []
    try:
        for _ in range(burst):
            sockets.append(socket.create_connection(("127.0.0.1", edge.port), timeout=0.5))
    finally:
        for s in sockets:
            s.close()
        await edge.close()
    assert len(sockets) == burst
