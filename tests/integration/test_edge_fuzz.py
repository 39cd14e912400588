"""A fuzz test of the edge on a running sim mesh: generated JSON bodies to the OpenAI routes
through the real Envoy, generated messages (and bytes that are no message) to the gateway's gRPC
services. Every answer is a success or a refusal that names what was wrong, never a server
error or a hang; every process is still up and a good request is served after. Seeded and
bounded in examples, so that a run is repeatable and short."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import grpc
import httpx
import pytest
from google.protobuf import json_format, struct_pb2
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from meshserve.commands.launcher import Mesh
from meshserve.deploy import envoy_config as envoy
from meshserve.services.config import DEFAULT_MODEL, GatewayConfig, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from tests.conftest import free_port
from tests.integration.helpers import mesh_spec

pytestmark = pytest.mark.integration

SEED = 20_251_207
EXAMPLES = 500
TIMEOUT_S = 30.0  # an answer not complete by then is a hang
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))

# What a refusal may be: the caller's fault (HTTP 4xx), with a message. Never INTERNAL, UNKNOWN,
# UNAVAILABLE or DEADLINE_EXCEEDED (a hang, past TIMEOUT_S).
REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.OUT_OF_RANGE, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.ALREADY_EXISTS,
}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    # As `meshserve up` serves by default: streaming OpenAI requests go to the gateway's HTTP edge,
    # the others are transcoded. A fast simulated engine: a generated request that asks for the
    # default 128 tokens is answered in well under a second.
    worker = WorkerConfig(sim_itl_base_ms=0.5)
    gateway = GatewayConfig(http_port=free_port())
    spec = mesh_spec(tmp_path_factory.mktemp("fuzz-mesh"), "sim", worker=worker, gateway=gateway, grace_seconds=1)
    with Mesh(spec) as m:
        yield m


def pids(mesh: Mesh) -> dict[str, int]:
    """Each process of the mesh (one the launcher restarted has another pid)."""
    return {p.name: p.popen.pid for p in mesh.procs if p.popen.poll() is None}


def alive_and_serving(mesh: Mesh, before: dict[str, int]) -> None:
    """The processes running before the fuzzing still run (none died, none was restarted), and a
    good request is served, through Envoy and on the gateway's gRPC port."""
    assert pids(mesh) == before
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    with httpx.Client(base_url=f"http://{mesh.envoy_address}", timeout=TIMEOUT_S) as http:
        reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"], reply.text
    with grpc.insecure_channel(mesh.gateway_address) as channel:
        generate = channel.unary_stream("/meshserve.v1.Inference/Generate",
                                        request_serializer=pb.GenerateRequest.SerializeToString,
                                        response_deserializer=pb.GenerateResponse.FromString)
        chunks = list(generate(pb.GenerateRequest(prompt="hi", max_tokens=3), timeout=TIMEOUT_S))
    assert chunks[-1].finish_reason == "length"


# -- JSON bodies through Envoy ---------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-(2**63), 2**64) | st.integers(-3, 40)
           | st.floats() | st.text(max_size=24))
json_values = st.recursive(
    scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=16,
)
roles = st.sampled_from(["user", "user", "system", "assistant", "tool", "developer", "", "robot"])
messages = st.lists(st.fixed_dictionaries({"role": roles, "content": st.text(max_size=40)}, optional={
    "name": json_values, "tool_calls": json_values, "tool_call_id": json_values,
}), min_size=1, max_size=4) | json_values
# JSON arrays nested n deep: around the gateway's and the edge's depth bounds, and (as text) far past them.
DEPTHS = [8, 31, 33, 60, 99, 101]
deep = st.sampled_from(DEPTHS).map(lambda n: json.loads("[" * n + "]" * n))
deep_text = st.sampled_from([*DEPTHS, 5_000]).map(lambda n: "[" * n + "]" * n)
schema = st.fixed_dictionaries({"type": st.sampled_from(["object", "string", "array", "integer", "nope"])},
                               optional={"properties": json_values, "items": json_values, "required": json_values})
tool = st.fixed_dictionaries({"type": st.sampled_from(["function", "other"]), "function": st.fixed_dictionaries(
    {"name": st.text(max_size=12)}, optional={"parameters": schema | deep | json_values, "description": json_values})})
small_ints = st.integers(-3, 40) | st.sampled_from([0, 2**31, 2**63])
# Values shaped like each field's (most of the time); any other field gets any JSON value.
FIELD_VALUES = {
    "model": st.sampled_from([DEFAULT_MODEL, "", "no-such-model"]), "messages": messages,
    "prompt": st.text(max_size=40) | json_values, "max_tokens": small_ints, "max_completion_tokens": small_ints,
    "n": small_ints, "best_of": small_ints, "min_tokens": small_ints, "top_logprobs": small_ints,
    "temperature": st.floats(-1, 3) | json_values, "top_p": st.floats(-1, 2) | json_values,
    "stream": st.booleans() | json_values, "stop": st.lists(st.text(max_size=6), max_size=6) | json_values,
    "logit_bias": st.dictionaries(st.text(max_size=6), st.integers(-200, 200), max_size=6) | json_values,
    "tools": st.lists(tool, max_size=3) | json_values,
    "tool_choice": st.sampled_from(["auto", "none", "required"]) | json_values,
    "response_format": st.fixed_dictionaries(
        {"type": st.sampled_from(["json_object", "json_schema", "text", "x"])},
        optional={"json_schema": st.fixed_dictionaries({"name": st.text(max_size=8), "schema": schema | deep})}),
    "structured_outputs": st.dictionaries(st.sampled_from(["json", "regex", "choice", "grammar", "x"]),
                                          json_values | deep, max_size=2),
    "chat_template_kwargs": st.dictionaries(st.sampled_from(["enable_thinking", "bos_token", "tools", "x"]),
                                            json_values | deep, max_size=3),
}
# Where a request carries JSON of the client's own (schemas, the template's arguments): a value
# nested deep is put there.
NESTED_IN = {
    "structured_outputs": lambda v: {"json": {"type": "array", "items": v}},
    "response_format": lambda v: {"type": "json_schema", "json_schema": {"name": "n", "schema": {"items": v}}},
    "chat_template_kwargs": lambda v: {"enable_thinking": v},
    "tools": lambda v: [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x": v}}}],
}
SCHEMAS = envoy.json_schemas()
BASES = {
    "/v1/chat/completions": {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "fuzz"}], "max_tokens": 4},
    "/v1/completions": {"model": DEFAULT_MODEL, "prompt": "fuzz", "max_tokens": 4},
}


def some_fields(names: list[str], values: Callable[[str], st.SearchStrategy]) -> st.SearchStrategy[dict]:
    """One to three of ``names``, each with a value from ``values(name)``."""
    return st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True).flatmap(
        lambda chosen: st.fixed_dictionaries({name: values(name) for name in chosen}))


def bodies(path: str) -> st.SearchStrategy[str]:
    """A good request to ``path`` with one to three fields changed to values of their types (half
    the time), or to values shaped like the field's or any JSON, or anything."""
    names = [k for k in SCHEMAS[path][""] if k.lower() == k] + ["no_such_field"]
    typed = protos(OPENAI_MESSAGES[path].DESCRIPTOR).map(
        lambda change: json_format.MessageToDict(change, preserving_proto_field_name=True))
    shaped = some_fields(names, lambda name: FIELD_VALUES.get(name, json_values))
    return st.one_of(
        typed.map(lambda fields: json.dumps({**BASES[path], **fields})),
        st.one_of(
            shaped.map(lambda fields: json.dumps({**BASES[path], **fields})),
            st.tuples(st.sampled_from([n for n in NESTED_IN if n in names]), deep).map(
                lambda nv: json.dumps({**BASES[path], nv[0]: NESTED_IN[nv[0]](nv[1])})),
            st.dictionaries(st.sampled_from(names), json_values, max_size=8).map(json.dumps),
            st.tuples(st.sampled_from(names), deep_text).map(
                lambda kv: json.dumps(BASES[path])[:-1] + f', "{kv[0]}": {kv[1]}}}'),
            json_values.map(json.dumps),
            st.text(max_size=60),  # mostly not JSON at all
        ),
    )


OPENAI_MESSAGES = {"/v1/chat/completions": pb.ChatCompletionRequest, "/v1/completions": pb.CompletionRequest}
requests = st.sampled_from(sorted(BASES)).flatmap(lambda path: st.tuples(st.just(path), bodies(path)))


def refusal_shape(text: str) -> dict:
    error = json.loads(text)["error"]
    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str), text
    return error


def test_generated_json_bodies_through_envoy_are_served_or_refused_never_5xx(mesh: Mesh) -> None:
    before = pids(mesh)
    with httpx.Client(base_url=f"http://{mesh.envoy_address}", timeout=TIMEOUT_S) as http:

        @seed(SEED)
        @FUZZ
        @given(request=requests)
        def answered(request: tuple[str, str]) -> None:
            path, body = request
            with http.stream("POST", path, content=body.encode(), headers={"content-type": "application/json"}) as r:
                text = r.read().decode()  # a stream to its end: no hang, whatever comes
            assert 200 <= r.status_code < 500, (r.status_code, text)
            if r.status_code >= 400:
                refusal_shape(text)
            elif r.headers.get("content-type", "").startswith("text/event-stream"):
                events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
                for event in events[:-1]:  # an error in the stream: the caller's, not the server's
                    if "error" in (parsed := json.loads(event)):
                        assert parsed["error"]["type"] != "server_error", event
                assert events and events[-1] == "[DONE]", text[-300:]

        answered()
    alive_and_serving(mesh, before)


# -- gRPC messages to the gateway ------------------------------------------------------------------

_INTS = {FieldDescriptor.TYPE_INT32, FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SFIXED32,
         FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64, FieldDescriptor.TYPE_SFIXED64}
_UINTS = {FieldDescriptor.TYPE_UINT32, FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_UINT64,
          FieldDescriptor.TYPE_FIXED64}
strings = st.text(max_size=40) | json_values.map(json.dumps) | deep_text


def _scalar(field: FieldDescriptor) -> st.SearchStrategy:
    bits = 64 if field.type in (FieldDescriptor.TYPE_INT64, FieldDescriptor.TYPE_SINT64,
                                FieldDescriptor.TYPE_SFIXED64, FieldDescriptor.TYPE_UINT64,
                                FieldDescriptor.TYPE_FIXED64) else 32
    if field.type in _INTS:
        return st.integers(-3, 40) | st.integers(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    if field.type in _UINTS:
        return st.integers(0, 40) | st.integers(0, 2**bits - 1)
    if field.type in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
        return st.floats(-2, 2) | st.floats(width=32 if field.type == FieldDescriptor.TYPE_FLOAT else 64)
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_ENUM:
        return st.sampled_from([v.number for v in field.enum_type.values]) | st.integers(-1, 99)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=32)
    return strings


def protos(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor``'s type with one to three of their fields set to generated values
    (messages three deep at most; a Struct from generated JSON)."""
    if descriptor.full_name == "google.protobuf.Struct":
        return st.dictionaries(st.text(max_size=8), json_values, max_size=4).map(_struct)
    fields: dict[str, st.SearchStrategy] = {}
    for field in descriptor.fields:
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            key, value = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            fields[field.name] = st.dictionaries(_scalar(key), _value(value, depth), max_size=4)
        elif field.is_repeated:
            fields[field.name] = st.lists(_value(field, depth), max_size=4)
        else:
            fields[field.name] = _value(field, depth)
    message_class = _classes[descriptor.full_name]
    return some_fields(sorted(fields), fields.__getitem__).map(lambda kw: _build(message_class, kw))


def _value(field: FieldDescriptor, depth: int) -> st.SearchStrategy:
    if field.message_type is None:
        return _scalar(field)
    if depth >= 3:
        return st.builds(_classes[field.message_type.full_name])
    return st.deferred(lambda: protos(field.message_type, depth + 1))


def _struct(value: dict) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    out.update(value)
    return out


def _build(cls: type[Message], fields: dict) -> Message:
    message = cls()
    for name, value in fields.items():  # one by one: the last member of a oneof set wins
        target = getattr(message, name)
        if isinstance(value, dict):
            for k, v in value.items():
                if isinstance(v, Message):
                    target[k].CopyFrom(v)
                else:
                    target[k] = v
        elif isinstance(value, list):
            target.extend(value)
        elif isinstance(value, Message):
            target.CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


def _message_classes() -> dict[str, type[Message]]:
    """Each message type of the contract (nested ones too) by its full name."""
    classes: dict[str, type[Message]] = {
        "google.protobuf.Struct": struct_pb2.Struct, "google.protobuf.Value": struct_pb2.Value,
        "google.protobuf.ListValue": struct_pb2.ListValue,
    }

    def add(descriptor: Descriptor, cls: type[Message]) -> None:
        classes[descriptor.full_name] = cls
        for nested in descriptor.nested_types:
            add(nested, getattr(cls, nested.name))

    for descriptor in pb.DESCRIPTOR.message_types_by_name.values():
        add(descriptor, getattr(pb, descriptor.name))
    return classes


_classes = _message_classes()

CHAT = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": "fuzz"}], "max_tokens": 4}
GENERATE = {"prompt": "fuzz", "max_tokens": 4}
# method, a good request to it, whether it streams
METHODS = [
    ("/meshserve.v1.Inference/Generate", json_format.ParseDict(GENERATE, pb.GenerateRequest()), True),
    ("/meshserve.v1.Inference/Complete", json_format.ParseDict(GENERATE, pb.GenerateRequest()), False),
    ("/meshserve.v1.OpenAI/ChatCompletions", json_format.ParseDict(CHAT, pb.ChatCompletionRequest()), False),
    ("/meshserve.v1.OpenAI/StreamChatCompletions", json_format.ParseDict(CHAT, pb.ChatCompletionRequest()), True),
    ("/meshserve.v1.OpenAI/StreamCompletions", json_format.ParseDict(BASES["/v1/completions"],
                                                                     pb.CompletionRequest()), True),
    ("/meshserve.v1.OpenAI/Tokenize", json_format.ParseDict({"model": DEFAULT_MODEL, "prompt": "fuzz"},
                                                            pb.TokenizeRequest()), False),
]


def merged(good: Message, change: Message) -> bytes:
    out = type(good)()
    out.CopyFrom(good)
    out.MergeFrom(change)
    return out.SerializeToString()


def messages_to(good: Message) -> st.SearchStrategy[bytes]:
    """A good request with one to three fields changed (half the time), or any message of its type,
    bytes that are no message, a prompt past the gateway's bound or past its gRPC receive bound."""
    generated = protos(good.DESCRIPTOR)
    return st.one_of(
        generated.map(lambda change: merged(good, change)),
        st.one_of(
            generated.map(lambda msg: msg.SerializeToString()),
            st.binary(max_size=64),
            st.sampled_from([600 * 2**10, 2**20 + 1]).map(lambda n: merged(good, pb.GenerateRequest(prompt="w" * n))
                                                          if isinstance(good, pb.GenerateRequest) else b"\n\x00" * n),
        ),
    )


calls = st.sampled_from(METHODS).flatmap(lambda m: st.tuples(st.just(m[0]), st.just(m[2]), messages_to(m[1])))


def test_generated_grpc_messages_to_the_gateway_are_served_or_refused_never_a_server_error(mesh: Mesh) -> None:
    before = pids(mesh)
    with grpc.insecure_channel(mesh.gateway_address) as channel:

        @seed(SEED)
        @FUZZ
        @given(call=calls)
        def answered(call: tuple[str, bool, bytes]) -> None:
            method, streams, request = call
            send = (channel.unary_stream if streams else channel.unary_unary)(method)  # raw bytes both ways
            try:
                reply = send(request, timeout=TIMEOUT_S)
                if streams:
                    list(reply)
            except grpc.RpcError as e:
                assert e.code() in REFUSALS and e.details(), (method, e.code(), e.details())

        answered()
    alive_and_serving(mesh, before)
