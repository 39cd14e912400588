"""--reasoning-parser: vLLM's own combined parser (qwen3's here, which finds its markers in the
text) over an output streamed token by token, with the tiny model's tokenizer: the thinking comes
apart from the content, a chat_template_kwargs switch turns it off, and what the engine's
structured output needs is worked out as vLLM's server works it out."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from meshserve.services.config import WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from meshserve.worker.engine import Request
from meshserve.worker.vllm_tools import ParsedStream, reasoning_parsers

pytestmark = pytest.mark.engine

TIMEOUT = 60.0
ANSWER = "I should count: two and two</think>Four."


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model)


def stream(tokenizer: Any, text: str, **fields: Any) -> tuple[str, str, ParsedStream]:
    request = Request(request_id="r", messages=[{"role": "user", "content": "2+2?"}], **fields)
    parsed = ParsedStream(reasoning_parsers("qwen3", "", tokenizer)[False], tokenizer, request, [5, 6, 7])
    ids = tokenizer.encode(text, add_special_tokens=False)
    thinking, content = "", ""
    for i, token_id in enumerate(ids):
        reasoning, piece, calls = parsed.feed(tokenizer.decode([token_id]), [token_id], finished=i == len(ids) - 1)
        assert calls == []
        thinking, content = thinking + reasoning, content + piece
    return thinking, content, parsed


def test_the_thinking_comes_apart_from_the_answer(tokenizer: Any) -> None:
    thinking, content, parsed = stream(tokenizer, ANSWER)
    assert (thinking, content) == ("I should count: two and two", "Four.")
    assert 0 < parsed.reasoning_tokens() < len(tokenizer.encode(ANSWER, add_special_tokens=False))
    assert parsed.reasoning_ended is False  # a structured output waits for the thinking to end


def test_thinking_switched_off_in_the_template_is_all_answer(tokenizer: Any) -> None:
    thinking, content, parsed = stream(tokenizer, "Four.", chat_template_kwargs={"enable_thinking": False})
    assert (thinking, content) == ("", "Four.")
    assert parsed.reasoning_ended is True  # constrained from the first token


def test_include_reasoning_false_drops_the_thinking(tokenizer: Any) -> None:
    thinking, content, parsed = stream(tokenizer, ANSWER, include_reasoning=False)
    assert (thinking, content) == ("", "Four.")
    assert parsed.reasoning_ended is True  # vLLM: a structured output then constrains everything


def test_tool_calls_are_found_in_what_follows_the_thinking(tokenizer: Any) -> None:
    """With a tool-call parser too (pythonic), as vllm serve runs both: the thinking first, then the
    calls in the answer; a call-shaped text inside the thinking is thinking."""
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]
    request = Request(request_id="r", messages=[{"role": "user", "content": "order 12?"}], tools=tools,
                      parse_tool_calls=True)
    parsed = ParsedStream(reasoning_parsers("qwen3", "pythonic", tokenizer)[True], tokenizer, request, [5, 6, 7])
    ids = tokenizer.encode("maybe [lookup(order=1)]? no</think>[lookup(order=12)]", add_special_tokens=False)
    thinking, content, calls = "", "", []
    for i, token_id in enumerate(ids):
        reasoning, piece, found = parsed.feed(tokenizer.decode([token_id]), [token_id], finished=i == len(ids) - 1)
        thinking, content, calls = thinking + reasoning, content + piece, [*calls, *found]
    assert thinking == "maybe [lookup(order=1)]? no" and content == ""
    assert parsed.called and {c.name for c in calls} == {"lookup"}
    assert json.loads("".join(c.arguments for c in calls)) == {"order": 12}


def test_a_parser_the_tokenizer_cannot_serve_or_vllm_does_not_have_is_refused(tokenizer: Any) -> None:
    with pytest.raises(ValueError, match="--reasoning-parser deepseek_r1 cannot be used") as err:
        reasoning_parsers("deepseek_r1", "", tokenizer)  # its think tokens are not in this vocabulary
    assert "think start/end tokens" in str(err.value)
    with pytest.raises(ValueError, match="not one of vLLM's reasoning parsers: .*qwen3"):
        reasoning_parsers("deep_thought", "", tokenizer)


# -- a vLLM worker started with --reasoning-parser, over gRPC ------------------------------------


@pytest.fixture(scope="module")
async def worker(tiny_model: Path) -> AsyncIterator[pb_grpc.WorkerStub]:
    from meshserve.worker.server import start_worker

    cfg = WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="vllm", model=str(tiny_model),
                       dtype="float32", max_model_len=512, kv_cache_memory_bytes=64 * 2**20, max_num_seqs=8,
                       enforce_eager=True, reasoning_parser="qwen3")
    running, _ = await start_worker(cfg)
    try:
        async with insecure_channel(f"127.0.0.1:{running.port}") as channel:
            yield pb_grpc.WorkerStub(channel)
    finally:
        await running.shutdown()


async def chat(stub: pb_grpc.WorkerStub, **fields: Any) -> list[pb.GenerateResponse]:
    fields.setdefault("ignore_eos", True)
    request = pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="What is two plus two?")],
                                 max_tokens=6, temperature=0, **fields)
    return [c async for c in stub.Generate(request, timeout=TIMEOUT)]


async def test_a_worker_with_a_reasoning_parser_streams_the_thinking_apart(worker: pb_grpc.WorkerStub) -> None:
    info = await worker.Info(pb.InfoRequest(), timeout=TIMEOUT)
    assert info.reasoning_parser == "qwen3"
    thinking = await chat(worker)  # a random model never ends its thinking: all of it is
    assert "".join(c.reasoning for c in thinking) and not "".join(c.text for c in thinking)
    assert thinking[-1].usage.reasoning_tokens == thinking[-1].usage.completion_tokens == 6
    off = await chat(worker, chat_template_kwargs='{"enable_thinking": false}')
    assert "".join(c.text for c in off) and not "".join(c.reasoning for c in off)
    assert off[-1].usage.reasoning_tokens == 0
    hidden = await chat(worker, include_reasoning=False)
    assert not "".join(c.reasoning for c in hidden) and not "".join(c.text for c in hidden)


async def test_structured_output_constrains_what_follows_the_thinking(worker: pb_grpc.WorkerStub,
                                                                     tokenizer: Any) -> None:
    """With the thinking switched off, or not wanted, the engine's grammar holds from the first
    token, as vllm serve's does. Off, the answer is content; not wanted (include_reasoning false,
    thinking on), vLLM's parser still counts what the model says as thinking, and drops it."""
    regex = pb.StructuredOutputs(regex="(yes|no)")
    off = await chat(worker, structured_outputs=regex, ignore_eos=False, chat_template_kwargs='{"enable_thinking": false}')
    assert "".join(c.text for c in off) in ("yes", "no")
    hidden = await chat(worker, structured_outputs=regex, ignore_eos=False, include_reasoning=False)
    assert tokenizer.decode([t for c in hidden for t in c.token_ids], skip_special_tokens=True) in ("yes", "no")
    assert not "".join(c.text + c.reasoning for c in hidden)
