"""What one request may hold (the gateway's RequestLimits): each bound refused naming the field,
just past it, and taken at it; sizes and counts before anything is parsed; JSON nested past any
parser's recursion refused as the client's fault, never a RecursionError."""

from __future__ import annotations

import dataclasses
import json

import pytest
from google.protobuf import json_format

from meshserve.gateway import openai_convert as convert
from meshserve.services import validation
from meshserve.services.config import RequestLimits
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.validation import InvalidRequest

LIMITS = RequestLimits(max_prompt_bytes=100, max_messages=3, max_stop=2, max_logit_bias=2, max_tools=2,
                       max_schema_bytes=200, max_json_depth=4, max_request_id_chars=8)


def nested(depth: int) -> object:
    """A JSON value that nests ``depth`` objects and arrays."""
    value: object = "x"
    for i in range(depth):
        value = {"a": value} if i % 2 else [value]
    return value


def nested_schema(levels: int) -> dict:
    """A JSON schema of ``levels`` objects, each the one property of the one around it."""
    schema: dict = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def tool(name: str, parameters: object | None = None) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters or {"type": "object"}}}


def chat(**fields: object) -> pb.GenerateRequest:
    return pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="hi")], **fields)


# One request at each bound (taken) and one past it (refused naming the field).
CASES = [
    ("request_id", pb.GenerateRequest(prompt="p", request_id="r" * 8), pb.GenerateRequest(prompt="p", request_id="r" * 9)),
    ("prompt", pb.GenerateRequest(prompt="p" * 100), pb.GenerateRequest(prompt="p" * 101)),
    ("prompt", pb.GenerateRequest(prompt="é" * 50), pb.GenerateRequest(prompt="é" * 50 + "p")),  # UTF-8 bytes
    ("messages", chat(), pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="x")] * 4)),
    ("messages", pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="m" * 50)] * 2),
     pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="m" * 50),
                                  pb.ChatMessage(role="assistant", content="", tool_calls=[
                                      pb.ToolCall(id="c", name="f", arguments="a" * 49)])])),
    ("stop", pb.GenerateRequest(prompt="p", stop=["a", "b"]), pb.GenerateRequest(prompt="p", stop=["a", "b", "c"])),
    ("logit_bias", pb.GenerateRequest(prompt="p", logit_bias={1: 1, 2: 1}),
     pb.GenerateRequest(prompt="p", logit_bias={1: 1, 2: 1, 3: 1})),
    ("tools", chat(tools=json.dumps([tool("a"), tool("b")])), chat(tools=json.dumps([tool("a"), tool("b"), tool("c")]))),
    ("tools", chat(tools=json.dumps([tool("a")])), chat(tools=json.dumps([tool("a", {"description": "d" * 200})]))),
    ("tools", chat(tools=json.dumps([tool("a", nested(1))])), chat(tools=json.dumps([tool("a", nested(2))]))),
    ("structured_outputs.json", pb.GenerateRequest(prompt="p", structured_outputs=pb.StructuredOutputs(
        json=json.dumps({"type": "object", "properties": {"a": {"type": "array"}}}))),
     pb.GenerateRequest(prompt="p", structured_outputs=pb.StructuredOutputs(
         json=json.dumps({"type": "object", "properties": {"a": {"type": "array", "items": {"items": {}}}}})))),
    ("structured_outputs.json", pb.GenerateRequest(prompt="p", structured_outputs=pb.StructuredOutputs(json="{}")),
     pb.GenerateRequest(prompt="p", structured_outputs=pb.StructuredOutputs(
         json=json.dumps({"description": "d" * 200})))),
    ("structured_outputs.regex", pb.GenerateRequest(prompt="p", structured_outputs=pb.StructuredOutputs(regex="a" * 200)),
     pb.GenerateRequest(prompt="p", structured_outputs=pb.StructuredOutputs(regex="a" * 201))),
    ("structured_outputs.grammar", pb.GenerateRequest(prompt="p", structured_outputs=pb.StructuredOutputs(grammar="g" * 200)),
     pb.GenerateRequest(prompt="p", structured_outputs=pb.StructuredOutputs(grammar="g" * 201))),
    ("structured_outputs.choice", pb.GenerateRequest(prompt="p", structured_outputs=pb.StructuredOutputs(
        choice=pb.StringList(values=["c" * 100] * 2))),
     pb.GenerateRequest(prompt="p", structured_outputs=pb.StructuredOutputs(choice=pb.StringList(values=["c" * 67] * 3)))),
    ("chat_template_kwargs", chat(chat_template_kwargs=json.dumps({"a": nested(3)})),
     chat(chat_template_kwargs=json.dumps({"a": nested(4)}))),
    ("chat_template_kwargs", chat(chat_template_kwargs=json.dumps({"a": "k" * 190})),
     chat(chat_template_kwargs=json.dumps({"a": "k" * 200}))),
]


@pytest.mark.parametrize(("field", "at", "past"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_bound_is_taken_at_it_and_refused_past_it_naming_the_field(
    field: str, at: pb.GenerateRequest, past: pb.GenerateRequest
) -> None:
    validation.validate(at, limits=LIMITS)
    with pytest.raises(InvalidRequest) as refused:
        validation.validate(past, limits=LIMITS)
    assert refused.value.param == field, str(refused.value)


def test_a_bound_names_the_gateways_setting() -> None:
    with pytest.raises(InvalidRequest) as refused:
        validation.validate(pb.GenerateRequest(prompt="p" * 101), limits=LIMITS)
    assert "'prompt' is 101 bytes; at most 100 (the gateway's --max-prompt-bytes)" in str(refused.value)


def test_sizes_and_counts_come_before_anything_is_parsed() -> None:
    """Two stop strings too many and a schema that is not JSON: the count is what is refused."""
    with pytest.raises(InvalidRequest) as refused:
        validation.validate(pb.GenerateRequest(prompt="p", stop=["a", "b", "c"],
                                               structured_outputs=pb.StructuredOutputs(json="{not json")),
                            limits=LIMITS)
    assert refused.value.param == "stop"


def test_the_defaults_are_the_documented_ones() -> None:
    limits = RequestLimits()
    assert (limits.max_messages, limits.max_stop, limits.max_logit_bias, limits.max_tools) == (2048, 4, 300, 128)
    assert limits.max_prompt_bytes == 512 * 2**10 and limits.max_message_bytes == 2**20
    assert limits.max_prompt_bytes + 3 * limits.max_schema_bytes < limits.max_message_bytes  # a request at every bound fits


DEEP = 5000  # past what Python's JSON parser, jsonschema and re recurse through


@pytest.mark.parametrize(("request_fields", "field"), [
    ({"prompt": "p", "structured_outputs": pb.StructuredOutputs(json="[" * DEEP + "]" * DEEP)}, "structured_outputs.json"),
    ({"prompt": "p", "structured_outputs": pb.StructuredOutputs(json=json.dumps(nested_schema(400)))},
     "structured_outputs.json"),
    ({"prompt": "p", "structured_outputs": pb.StructuredOutputs(regex="(" * DEEP + ")" * DEEP)}, "structured_outputs.regex"),
    ({"messages": [pb.ChatMessage(role="user", content="x")], "tools": "[" * DEEP + "]" * DEEP}, "tools"),
    ({"messages": [pb.ChatMessage(role="user", content="x")], "chat_template_kwargs": '{"a":' + "[" * DEEP + "]" * DEEP + "}"},
     "chat_template_kwargs"),
])
def test_json_and_regexes_nested_past_any_parser_are_the_clients_fault_without_bounds(
    request_fields: dict, field: str
) -> None:
    """Without the gateway's bounds (a worker validates with none): still a 400 naming the field."""
    with pytest.raises(InvalidRequest) as refused:
        validation.validate(pb.GenerateRequest(**request_fields))
    assert refused.value.param == field


@pytest.mark.parametrize("tools", ["{x", '{"type": "function"}', "[1, 2]"])
def test_tools_that_are_not_a_json_array_of_objects_are_refused(tools: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        validation.validate(chat(tools=tools))
    assert refused.value.param == "tools"


# -- the OpenAI conversion: counted before it converts -------------------------------------------


def openai_chat(**body: object) -> pb.ChatCompletionRequest:
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return json_format.ParseDict(body, pb.ChatCompletionRequest())


def openai_completion(**body: object) -> pb.CompletionRequest:
    body.setdefault("prompt", "hi")
    return json_format.ParseDict(body, pb.CompletionRequest())


@pytest.mark.parametrize(("body", "field"), [
    (openai_chat(messages=[{"role": "user", "content": "x"}] * 4), "messages"),
    (openai_chat(messages=[{"role": "user", "content": "x" * 101}]), "messages"),
    (openai_chat(tools=[tool(f"f{i}") for i in range(3)]), "tools"),
    (openai_chat(tools=[tool("f", {"description": "d" * 300})]), "tools"),
    (openai_chat(stop=["a", "b", "c"]), "stop"),
    (openai_chat(logit_bias={"1": 1, "2": 1, "3": 1}), "logit_bias"),
    (openai_chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {"d": "d" * 300}}}),
     "response_format"),
    (openai_chat(response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": {"a": nested(4)}}}),
     "response_format.json_schema.schema"),
    (openai_chat(structured_outputs={"json": {"a": nested(4)}}), "structured_outputs.json"),
    (openai_chat(structured_outputs={"json": json.dumps({"a": nested(4)})}), "structured_outputs.json"),
    (openai_chat(tools=[tool("f", {"a": nested(4)})]), "tools[0].function.parameters"),
    (openai_completion(prompt="p" * 101), "prompt"),
    (openai_completion(stop=["a", "b", "c"]), "stop"),
    (openai_completion(structured_outputs={"regex": "r" * 300}), "structured_outputs"),
])
def test_an_openai_request_past_a_bound_is_refused_naming_the_field(
    body: pb.ChatCompletionRequest | pb.CompletionRequest, field: str
) -> None:
    fn = convert.chat_request if isinstance(body, pb.ChatCompletionRequest) else convert.completion_request
    fn(body)  # no bounds given: converted
    with pytest.raises(InvalidRequest) as refused:
        fn(body, LIMITS)
    assert refused.value.param == field, str(refused.value)


def test_tokenize_requests_are_bounded_as_their_chats_and_prompts() -> None:
    for body, field in (({"prompt": "p" * 101}, "prompt"),
                        ({"messages": [{"role": "user", "content": "x"}] * 4}, "messages")):
        with pytest.raises(InvalidRequest) as refused:
            convert.tokenize_request(json_format.ParseDict(body, pb.TokenizeRequest()), LIMITS)
        assert refused.value.param == field


def test_the_gateway_config_carries_the_limits() -> None:
    from meshserve.services.config import GatewayConfig

    cfg = GatewayConfig(max_stop=1)
    assert isinstance(cfg, RequestLimits) and dataclasses.replace(cfg).max_stop == 1
