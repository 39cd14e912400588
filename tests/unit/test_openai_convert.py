"""OpenAI request/response conversion: what is accepted, what is refused (by field name), and
the shapes of replies and stream chunks."""

from __future__ import annotations

import pytest
from google.protobuf import json_format

from gateway import openai_convert as convert
from services.gen import meshserve_pb2 as pb
from services.validation import InvalidRequest


def chat(**body: object) -> pb.ChatCompletionRequest:
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return json_format.ParseDict(body, pb.ChatCompletionRequest())


def completion(**body: object) -> pb.CompletionRequest:
    body.setdefault("prompt", "hi")
    return json_format.ParseDict(body, pb.CompletionRequest())


def test_chat_request_maps_fields() -> None:
    req = convert.chat_request(chat(
        model="m", max_tokens=5, temperature=0, top_p=0.5, seed=7, stop="END", user="u", n=1,
        presence_penalty=0, messages=[{"role": "system", "content": "s"},
                                      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                                      {"role": "assistant", "content": None}],
    ))
    assert [(m.role, m.content) for m in req.messages] == [("system", "s"), ("user", "ab"), ("assistant", "")]
    assert (req.model, req.max_tokens, req.temperature, req.top_p, req.seed) == ("m", 5, 0, 0.5, 7)
    assert req.user == "u"  # the session key of session-affinity routing
    assert list(req.stop) == ["END"] and req.HasField("temperature")
    assert not req.HasField("stream_interval")


def test_vllm_stream_interval_extension_is_carried() -> None:
    assert convert.chat_request(chat(stream_interval=8)).stream_interval == 8
    assert convert.completion_request(completion(stream_interval=4)).stream_interval == 4


def test_max_completion_tokens_wins_and_unset_fields_stay_unset() -> None:
    assert convert.chat_request(chat(max_tokens=5, max_completion_tokens=9)).max_tokens == 9
    req = convert.chat_request(chat())
    assert not req.HasField("max_tokens") and not req.HasField("temperature") and not req.stop


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"n": 2}, "'n'"),
        ({"presence_penalty": 0.5}, "'presence_penalty'"),
        ({"frequency_penalty": -1}, "'frequency_penalty'"),
        ({"logprobs": True}, "'logprobs'"),
        ({"stop": [1, 2]}, "'stop'"),
        ({"messages": []}, "'messages'"),
        ({"messages": [{"role": "user", "content": 5}]}, "'messages[0].content'"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "'messages[0].content[0]'"),
    ],
)
def test_chat_refuses_what_it_cannot_honour(body: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        convert.chat_request(chat(**body))
    assert str(err.value).startswith(field)


def test_completion_request() -> None:
    req = convert.completion_request(completion(prompt=["one"], stop=["a", "b"]))
    assert req.prompt == "one" and list(req.stop) == ["a", "b"]
    assert req.max_tokens == convert.COMPLETIONS_DEFAULT_MAX_TOKENS


@pytest.mark.parametrize(
    ("body", "field"),
    [({"prompt": ["a", "b"]}, "'prompt'"), ({"prompt": [1, 2]}, "'prompt'"), ({"prompt": None}, "'prompt'"),
     ({"echo": True}, "'echo'"), ({"best_of": 3}, "'best_of'"), ({"logprobs": 2}, "'logprobs'")],
)
def test_completion_refuses_what_it_cannot_honour(body: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        convert.completion_request(completion(**body))
    assert str(err.value).startswith(field)


def test_chat_chunks_carry_role_first_then_finish_then_usage() -> None:
    first = list(convert.chat_chunks(pb.GenerateResponse(request_id="r", text="a"), True, "m", 1, True))
    last = list(convert.chat_chunks(
        pb.GenerateResponse(request_id="r", text="", finish_reason="stop", usage=pb.Usage(prompt_tokens=3, completion_tokens=2)),
        False, "m", 1, True,
    ))
    assert len(first) == 1 and first[0].choices[0].delta.role == "assistant"
    assert not first[0].choices[0].HasField("finish_reason") and not first[0].HasField("usage")
    finish, usage = last
    assert finish.choices[0].finish_reason == "stop" and not finish.choices[0].delta.HasField("role")
    assert list(usage.choices) == [] and usage.usage.total_tokens == 5
    assert {c.id for c in first + last} == {"chatcmpl-r"}


def test_no_usage_chunk_unless_asked() -> None:
    out = list(convert.completion_chunks(pb.GenerateResponse(request_id="r", finish_reason="length"), "m", 1, False))
    assert len(out) == 1 and out[0].choices[0].finish_reason == "length"
