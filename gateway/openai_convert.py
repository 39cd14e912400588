"""OpenAI request/response messages <-> the mesh's GenerateRequest/GenerateResponse.

Pure functions: the OpenAI servicer calls them around the Orchestrator. A request field that
would change the output and that the mesh cannot honour is refused with InvalidRequest naming
it, rather than silently ignored. ``n`` choices are ``n`` GenerateRequests (choice_requests),
merged back by index here.
"""

from __future__ import annotations

import importlib.metadata
import json
import uuid
from collections.abc import Iterable, Sequence
from typing import Any

import grpc
from google.protobuf import json_format, struct_pb2

from meshserve.services import openai_errors, validation
from meshserve.services.config import RequestLimits
from meshserve.services.offload import OFFLOAD_CHARS
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.validation import InvalidRequest

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
FINGERPRINT = f"meshserve-{importlib.metadata.version('meshserve')}"  # system_fingerprint, weights unknown


def fingerprint(weights_id: str | None) -> str:
    """An answer's ``system_fingerprint``: what OpenAI says it is for, the backend whose change may
    change a seeded answer — the weights the fleet serves (WorkerInfo.weights_id) when the workers
    give them, else this meshserve's version."""
    return f"fp_{weights_id}" if weights_id else FINGERPRINT


def _text_parts(value: struct_pb2.Value, name: str) -> str:
    """A message's content: a string, a list of text parts (an assistant's refusal parts are
    text too), or null."""
    kind = value.WhichOneof("kind")
    if kind in (None, "null_value"):
        return ""
    if kind == "string_value":
        return value.string_value
    if kind == "list_value":
        texts: list[str] = []
        for i, part in enumerate(value.list_value.values):
            fields = part.struct_value.fields if part.WhichOneof("kind") == "struct_value" else {}
            key = fields["type"].string_value if "type" in fields else ""  # "text", or "refusal": its text
            if key not in ("text", "refusal") or key not in fields or fields[key].WhichOneof("kind") != "string_value":
                raise InvalidRequest(f"'{name}[{i}]' must be a text part {{\"type\": \"text\", \"text\": \"...\"}}", param=f"{name}[{i}]")
            texts.append(fields[key].string_value)
        return "".join(texts)
    raise InvalidRequest(f"'{name}' must be a string or a list of text parts", param=name)


def _stop(value: struct_pb2.Value) -> list[str]:
    kind = value.WhichOneof("kind")
    if kind in (None, "null_value"):
        return []
    if kind == "string_value":
        return [value.string_value]
    if kind == "list_value" and all(v.WhichOneof("kind") == "string_value" for v in value.list_value.values):
        return [v.string_value for v in value.list_value.values]
    raise InvalidRequest("'stop' must be a string or a list of strings", param="stop")


MAX_N = 128  # choices per request: each is a generation of its own


def choices(req: pb.ChatCompletionRequest | pb.CompletionRequest) -> int:
    """How many choices ``req`` asks for (``n``), checked."""
    n = req.n if req.HasField("n") else 1
    if not 1 <= n <= MAX_N:
        raise InvalidRequest(f"'n' must be in [1, {MAX_N}], got {n}", param="n")
    return n


# The sampling fields an OpenAI request shares with GenerateRequest, by the same names.
_OPTIONAL = ("temperature", "top_p", "seed", "stream_interval", "presence_penalty", "frequency_penalty",
             "repetition_penalty", "top_k", "min_p", "min_tokens", "skip_special_tokens", "priority")


def _sampling(req: pb.ChatCompletionRequest | pb.CompletionRequest, out: pb.GenerateRequest,
              limits: RequestLimits | None = None) -> None:
    n = choices(req)
    if n > 1 and req.HasField("temperature") and req.temperature == 0:
        raise InvalidRequest(f"'n' must be 1 when sampling is greedy ('temperature' 0): the {n} choices would "
                             "be the same answer (as vLLM)", param="n")
    for name in _OPTIONAL:
        if req.HasField(name):
            setattr(out, name, getattr(req, name))
    out.stop.extend(_stop(req.stop))
    out.stop_token_ids.extend(req.stop_token_ids)
    out.logit_bias.update(req.logit_bias)
    out.include_stop_str_in_output = req.include_stop_str_in_output
    out.ignore_eos = req.ignore_eos
    out.skip_cache = req.skip_cache
    out.cache = req.cache
    out.model = req.model
    out.user = req.user
    _structured(req, out, limits.max_json_depth if limits is not None else None)


def cost(req: pb.ChatCompletionRequest | pb.CompletionRequest | pb.TokenizeRequest) -> int:
    """What converting ``req`` costs, as a size (services.offload decides by it where to convert
    it): its size in bytes, and more for JSON schemas (tools, a response format), whose check
    costs ~1.5 ms even when small."""
    fields = req.DESCRIPTOR.fields_by_name
    schemas = ("tools" in fields and len(req.tools)) or any(
        name in fields and req.HasField(name) for name in ("structured_outputs", "response_format"))
    return req.ByteSize() + (OFFLOAD_CHARS if schemas else 0)


def _counted(req: pb.ChatCompletionRequest | pb.CompletionRequest, limits: RequestLimits | None) -> None:
    """The bounds of ``limits`` on what a request holds, counted before any of it is converted
    (sizes: what a field weighs as protobuf, close to its JSON's; the converted request's text is
    measured again by ``validation.check_limits``)."""
    if limits is None:
        return
    if isinstance(req, pb.ChatCompletionRequest):
        validation.check_count(len(req.messages), limits.max_messages, "messages", "max-messages")
        validation.check_count(len(req.tools), limits.max_tools, "tools", "max-tools")
        validation.check_size(sum(t.ByteSize() for t in req.tools), limits.max_schema_bytes, "tools",
                              "max-schema-bytes")
        if req.HasField("response_format"):
            validation.check_size(req.response_format.ByteSize(), limits.max_schema_bytes, "response_format",
                                  "max-schema-bytes")
    if req.stop.WhichOneof("kind") == "list_value":
        validation.check_count(len(req.stop.list_value.values), limits.max_stop, "stop", "max-stop")
    validation.check_count(len(req.logit_bias), limits.max_logit_bias, "logit_bias", "max-logit-bias")
    if req.HasField("structured_outputs"):
        validation.check_size(req.structured_outputs.ByteSize(), limits.max_schema_bytes, "structured_outputs",
                              "max-schema-bytes")


def _structured(req: pb.ChatCompletionRequest | pb.CompletionRequest, out: pb.GenerateRequest,
                max_depth: int | None = None) -> None:
    """OpenAI's response_format, or vLLM's structured_outputs, as the request's constraint."""
    so = out.structured_outputs
    if req.HasField("response_format") and req.response_format.type not in ("", "text"):
        if req.HasField("structured_outputs"):
            raise InvalidRequest("give 'response_format' or 'structured_outputs', not both", param="structured_outputs")
        fmt = req.response_format
        if fmt.type == "json_object":
            so.json_object = True
        elif fmt.type == "json_schema":
            if not fmt.json_schema.HasField("schema"):
                raise InvalidRequest("'response_format.json_schema.schema' is missing", param="response_format.json_schema.schema")
            so.json = json.dumps(_schema(fmt.json_schema.schema, "response_format.json_schema.schema", max_depth))
        else:
            raise InvalidRequest(f"'response_format.type' must be 'text', 'json_object' or 'json_schema', "
                                 f"got {fmt.type!r}", param="response_format.type")
        return
    if not req.HasField("structured_outputs"):
        return
    given = req.structured_outputs
    kinds = [name for name, set_ in (("json", given.HasField("json")), ("regex", bool(given.regex)),
                                     ("choice", bool(given.choice)), ("grammar", bool(given.grammar)),
                                     ("json_object", given.HasField("json_object"))) if set_]
    if len(kinds) != 1:
        raise InvalidRequest(f"'structured_outputs' must set exactly one of json, regex, choice, grammar or "
                             f"json_object, got {kinds or 'none'}", param="structured_outputs")
    if kinds == ["json"]:
        so.json = json.dumps(_schema(given.json, "structured_outputs.json", max_depth))
    elif kinds == ["regex"]:
        so.regex = given.regex
    elif kinds == ["choice"]:
        so.choice.values.extend(given.choice)
    elif kinds == ["grammar"]:
        so.grammar = given.grammar
    else:
        so.json_object = given.json_object


def _schema(value: struct_pb2.Struct | struct_pb2.Value, field: str, max_depth: int | None = None) -> Any:
    """The JSON schema a request gives in ``field`` (an object, or its JSON text), checked (no
    deeper than ``max_depth`` first: the check recurses)."""
    schema = json_format.MessageToDict(value)
    if isinstance(schema, str):
        schema = validation.parse_json(schema, field, max_depth)
    validation.check_depth(schema, max_depth, field)
    schema = _plain(schema)
    validation.check_schema(schema, field)
    return schema


def _plain(value: Any) -> Any:
    """JSON from a protobuf Struct, whose numbers are all doubles: integral ones back to ints
    (a schema's "minItems": 2 must not reach the backend as 2.0)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def chat_request(req: pb.ChatCompletionRequest, limits: RequestLimits | None = None) -> pb.GenerateRequest:
    """The GenerateRequest a chat completion asks for; raises InvalidRequest naming the field, or
    the bound of ``limits`` (the gateway's) it is past, before converting what it counts."""
    if not req.messages:
        raise InvalidRequest("'messages' is empty: give at least one message", param="messages")
    _counted(req, limits)
    out = pb.GenerateRequest()
    for i, m in enumerate(req.messages):
        content = _text_parts(m.content, f"messages[{i}].content") or m.refusal
        for name in ("audio", "function_call"):
            if getattr(m, name).WhichOneof("kind") not in (None, "null_value"):
                raise InvalidRequest(f"'messages[{i}].{name}' must be null: " + (
                    "the mesh generates text" if name == "audio" else "send the calls as 'tool_calls'"),
                    param=f"messages[{i}].{name}")
        turn = out.messages.add(role=m.role, content=content, tool_call_id=m.tool_call_id)
        if m.role == "assistant":  # its thinking, for templates that show it (vLLM's reasoning)
            turn.reasoning = m.reasoning or m.reasoning_content
        for call in m.tool_calls:
            turn.tool_calls.add(id=call.id, name=call.function.name, arguments=call.function.arguments)
    if req.HasField("max_completion_tokens"):
        out.max_tokens = req.max_completion_tokens
    elif req.HasField("max_tokens"):
        out.max_tokens = req.max_tokens
    if req.HasField("top_logprobs"):
        if not req.logprobs:
            raise InvalidRequest("'top_logprobs' needs 'logprobs': true", param="top_logprobs")
        if not 0 <= req.top_logprobs <= validation.MAX_LOGPROBS:
            raise InvalidRequest(f"'top_logprobs' must be in [0, {validation.MAX_LOGPROBS}], got {req.top_logprobs}", param="top_logprobs")
    if req.logprobs:
        out.logprobs = req.top_logprobs
    _sampling(req, out, limits)
    if req.prompt_cache_key:  # OpenAI's hint for requests that share a prefix: one worker's cache
        out.user = req.prompt_cache_key
    if req.HasField("include_reasoning"):
        out.include_reasoning = req.include_reasoning
    _generation_prompt(req, out)
    _template_kwargs(req, out)
    _tools(req, out, limits.max_json_depth if limits is not None else None)
    _check_openai_only(req)
    if not req.HasField("priority") and req.service_tier in TIER_PRIORITY:
        out.priority = TIER_PRIORITY[req.service_tier]
    if limits is not None:  # the sizes, before the request is copied per choice
        validation.check_limits(out, limits)
    return out


def _generation_prompt(req: pb.ChatCompletionRequest | pb.TokenizeRequest, out: pb.GenerateRequest) -> None:
    """vLLM's add_generation_prompt and continue_final_message, as the worker's template call takes
    them (checked with the rest of the request: services.validation)."""
    if req.HasField("add_generation_prompt"):
        out.add_generation_prompt = req.add_generation_prompt
    out.continue_final_message = req.continue_final_message


REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")  # vLLM's


def _template_kwargs(req: pb.ChatCompletionRequest | pb.TokenizeRequest, out: pb.GenerateRequest) -> None:
    """vLLM's chat_template_kwargs and OpenAI's reasoning_effort, as vLLM gives them to the chat
    template: ``reasoning_effort`` over the kwargs' own, and ``enable_thinking`` (off for
    "none") unless the kwargs set it."""
    kwargs = _plain(json_format.MessageToDict(req.chat_template_kwargs)) if req.HasField("chat_template_kwargs") else {}
    effort = req.reasoning_effort if isinstance(req, pb.ChatCompletionRequest) else ""
    if effort:
        if effort not in REASONING_EFFORTS:
            raise InvalidRequest(f"'reasoning_effort' must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}",
                                 param="reasoning_effort")
        kwargs["reasoning_effort"] = effort
        kwargs.setdefault("enable_thinking", effort != "none")
    if kwargs:  # checked with the rest of the request (services.validation.check_template)
        out.chat_template_kwargs = json.dumps(kwargs, sort_keys=True, ensure_ascii=False)


SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")
# OpenAI's tiers as vLLM priorities (lower is served first), when the request gives no priority.
# "flex" asks to be served later. "priority" asks for nothing a tenant is not given: urgency is the
# keys file's to grant (a tenant's priority=), and a client sending OpenAI's tier is served at its
# tenant's priority, as OpenAI serves an account without Priority processing at the default tier.
TIER_PRIORITY = {"flex": 1}
VERBOSITIES = ("low", "medium", "high")
MAX_METADATA_PAIRS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512  # OpenAI's limits
MAX_SAFETY_IDENTIFIER = 64


def _check_openai_only(req: pb.ChatCompletionRequest) -> None:
    """Checks, as OpenAI does, the fields that say something about the request and change nothing
    generated here (``store``, ``metadata``, ``service_tier``, ``safety_identifier``,
    ``verbosity``, ``modalities``): a client written for OpenAI sends them, and a bad one is a
    400 all the same."""
    if len(req.metadata) > MAX_METADATA_PAIRS:
        raise InvalidRequest(f"'metadata' holds {len(req.metadata)} pairs; at most {MAX_METADATA_PAIRS}", param="metadata")
    for key, value in req.metadata.items():
        if len(key) > MAX_METADATA_KEY:
            raise InvalidRequest(f"'metadata' key {key[:20]!r}... has {len(key)} characters; at most {MAX_METADATA_KEY}",
                                 param="metadata")
        if len(value) > MAX_METADATA_VALUE:
            raise InvalidRequest(f"'metadata[{key!r}]' has {len(value)} characters; at most {MAX_METADATA_VALUE}",
                                 param="metadata")
    if req.service_tier and req.service_tier not in SERVICE_TIERS:
        raise InvalidRequest(f"'service_tier' must be one of {', '.join(SERVICE_TIERS)}, got {req.service_tier!r}",
                             param="service_tier")
    if req.verbosity and req.verbosity not in VERBOSITIES:
        raise InvalidRequest(f"'verbosity' must be one of {', '.join(VERBOSITIES)}, got {req.verbosity!r}", param="verbosity")
    if len(req.safety_identifier) > MAX_SAFETY_IDENTIFIER:
        raise InvalidRequest(f"'safety_identifier' has {len(req.safety_identifier)} characters; at most "
                             f"{MAX_SAFETY_IDENTIFIER}", param="safety_identifier")
    if other := [m for m in req.modalities if m != "text"]:
        raise InvalidRequest(f"'modalities' may only hold \"text\" (the mesh generates text), got {other}",
                             param="modalities")


def tokenize_request(req: pb.TokenizeRequest, limits: RequestLimits | None = None) -> pb.GenerateRequest:
    """The GenerateRequest whose prompt /tokenize counts: its prompt, or its messages (and tools)
    as a chat completion renders them."""
    if req.prompt and req.messages:
        raise InvalidRequest("give either 'prompt' or 'messages', not both")
    if not req.messages:
        if not req.prompt:
            raise InvalidRequest("'prompt' is empty: give a prompt or chat 'messages'", param="prompt")
        out = pb.GenerateRequest(prompt=req.prompt, model=req.model)
        if limits is not None:
            validation.check_limits(out, limits)
        return out
    as_chat = pb.ChatCompletionRequest(model=req.model, messages=req.messages, tools=req.tools,
                                       continue_final_message=req.continue_final_message)
    if req.HasField("chat_template_kwargs"):
        as_chat.chat_template_kwargs.CopyFrom(req.chat_template_kwargs)
    if req.HasField("add_generation_prompt"):
        as_chat.add_generation_prompt = req.add_generation_prompt
    if req.tools:
        as_chat.tool_choice.string_value = NONE  # the tools as the template shows them; no call forced
    out = chat_request(as_chat, limits)
    out.ClearField("structured_outputs")
    return out


# -- tools ---------------------------------------------------------------------------------------

NONE, AUTO, REQUIRED, FUNCTION = "none", "auto", "required", "function"
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


def tool_choice(req: pb.ChatCompletionRequest) -> tuple[str, str]:
    """(kind, function name) of the request's tool_choice: "none", "auto" (the default when it
    has tools), "required", or "function" with the function it names."""
    value = req.tool_choice
    kind = value.WhichOneof("kind")
    if kind in (None, "null_value"):
        return (AUTO if req.tools else NONE), ""
    if kind == "string_value" and value.string_value in (NONE, AUTO, REQUIRED):
        return value.string_value, ""
    if kind == "struct_value":
        fields = value.struct_value.fields
        function = fields["function"].struct_value.fields if "function" in fields else {}
        name = function["name"].string_value if "name" in function else ""
        if "type" in fields and fields["type"].string_value == FUNCTION and name:
            return FUNCTION, name
    raise InvalidRequest("'tool_choice' must be \"none\", \"auto\", \"required\" or "
                         "{\"type\": \"function\", \"function\": {\"name\": ...}}", param="tool_choice")


def _tools(req: pb.ChatCompletionRequest, out: pb.GenerateRequest, max_depth: int | None = None) -> None:
    """The tools go to the chat template; a forced call (a named function, or "required") is a
    JSON schema the output must match, as vLLM builds it (vllm/tool_parsers/utils.py)."""
    kind, name = tool_choice(req)
    if kind != NONE and not req.tools:
        raise InvalidRequest(f"'tool_choice' is {kind!r} but the request has no 'tools'", param="tool_choice")
    parameters: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(req.tools):
        if tool.type not in ("", FUNCTION):
            raise InvalidRequest(f"'tools[{i}].type' must be 'function', got {tool.type!r}", param=f"tools[{i}].type")
        fname = tool.function.name
        if not fname:
            raise InvalidRequest(f"'tools[{i}].function.name' is missing", param=f"tools[{i}].function.name")
        if fname in parameters:
            raise InvalidRequest(f"'tools[{i}].function.name' {fname!r} is given twice", param=f"tools[{i}].function.name")
        params = EMPTY_PARAMETERS
        if tool.function.HasField("parameters"):
            params = _schema(tool.function.parameters, f"tools[{i}].function.parameters", max_depth) or EMPTY_PARAMETERS
        parameters[fname] = params
    if not req.tools:
        return
    out.tools = json.dumps([{"type": FUNCTION, "function": {"name": t.function.name, "description": t.function.description,
                                                           "parameters": parameters[t.function.name]}}
                            for t in req.tools])
    if kind == AUTO:
        out.parse_tool_calls = True  # the worker's tool-call parser finds the calls (it refuses without one)
        return
    if kind == NONE:
        return
    if out.HasField("structured_outputs"):
        raise InvalidRequest(f"'tool_choice' {kind!r} forces a call: it cannot be combined with 'response_format' "
                             "or 'structured_outputs'", param="tool_choice")
    if kind == FUNCTION:
        if name not in parameters:
            raise InvalidRequest(f"'tool_choice' names {name!r}, which is not one of the 'tools'", param="tool_choice")
        out.structured_outputs.json = json.dumps(parameters[name])
        return
    calls: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": [
        {"properties": {"name": {"type": "string", "enum": [n]}, "parameters": p}, "required": ["name", "parameters"]}
        for n, p in parameters.items()]}}
    if req.HasField("parallel_tool_calls") and not req.parallel_tool_calls:
        calls["maxItems"] = 1
    out.structured_outputs.json = json.dumps(calls)


def required_calls(text: str) -> list[tuple[str, str]] | None:
    """The calls of a "required" answer (a JSON list of {name, parameters}) as (name, arguments
    JSON); None if the text is not such a list (cut short by max_tokens)."""
    try:
        calls = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(calls, list) or not all(isinstance(c, dict) and "name" in c for c in calls):
        return None
    return [(str(c["name"]), json.dumps(c.get("parameters", {}), ensure_ascii=False)) for c in calls]


def call_id() -> str:
    return f"chatcmpl-tool-{uuid.uuid4().hex}"


def _message(r: pb.CompleteResponse, tools: tuple[str, str]) -> tuple[pb.ChatCompletionMessage, str]:
    """A choice's message and finish reason: a forced call's output is its tool_calls."""
    kind, name = tools
    message = pb.ChatCompletionMessage(role="assistant", content=r.text)
    if r.reasoning:  # a worker's reasoning parser found the model's thinking
        message.reasoning = r.reasoning
    if kind == FUNCTION:
        message.content = ""
        message.tool_calls.add(id=call_id(), type=FUNCTION, function=pb.FunctionCall(name=name, arguments=r.text))
    elif kind == REQUIRED and (calls := required_calls(r.text)) is not None:
        message.content = ""
        for fname, arguments in calls:
            message.tool_calls.add(id=call_id(), type=FUNCTION, function=pb.FunctionCall(name=fname, arguments=arguments))
        # As vLLM: "tool_calls" for a required call that completed, "stop" for a named one.
        return message, "tool_calls" if r.finish_reason == "stop" else r.finish_reason
    elif kind == AUTO:  # the calls the worker's parser found, whole ("tool_calls" if any)
        for call in r.tool_calls:
            message.tool_calls.add(id=call.id or call_id(), type=FUNCTION,
                                   function=pb.FunctionCall(name=call.name, arguments=call.arguments))
    return message, r.finish_reason


def completion_request(req: pb.CompletionRequest, limits: RequestLimits | None = None) -> pb.GenerateRequest:
    """The GenerateRequest a text completion asks for; raises InvalidRequest naming the field, or
    the bound of ``limits`` (the gateway's) it is past, before converting what it counts."""
    _counted(req, limits)
    if req.HasField("best_of") and req.best_of != choices(req):
        raise InvalidRequest(f"'best_of' must equal 'n' ({choices(req)}): vLLM's engine has no best_of, got {req.best_of}", param="best_of")
    if req.echo and req.HasField("logprobs"):
        raise InvalidRequest("'echo' with 'logprobs' is not supported (it would need the prompt's logprobs)", param="echo")
    kind = req.prompt.WhichOneof("kind")
    if kind == "string_value":
        prompt = req.prompt.string_value
    elif (
        kind == "list_value"
        and len(req.prompt.list_value.values) == 1
        and req.prompt.list_value.values[0].WhichOneof("kind") == "string_value"
    ):
        prompt = req.prompt.list_value.values[0].string_value
    elif kind in (None, "null_value"):
        raise InvalidRequest("'prompt' is missing", param="prompt")
    else:
        raise InvalidRequest("'prompt' must be a string (batches and token-id prompts are not supported)", param="prompt")
    out = pb.GenerateRequest(prompt=prompt)
    out.max_tokens = req.max_tokens if req.HasField("max_tokens") else COMPLETIONS_DEFAULT_MAX_TOKENS
    if req.HasField("logprobs"):
        out.logprobs = req.logprobs
    _sampling(req, out, limits)
    if limits is not None:  # the sizes, before the request is copied per choice
        validation.check_limits(out, limits)
    return out


INT64 = 2**63


def choice_requests(req: pb.GenerateRequest, request_id: str, n: int) -> list[pb.GenerateRequest]:
    """One GenerateRequest per choice (``req`` itself when n = 1), ids ``request_id`` (n = 1) or
    ``request_id-i``. A seeded request's choice i has seed + i, as vLLM's parallel sampling, so
    the choices differ and each is reproducible (and cacheable)."""
    if n == 1:  # the request itself: no copy on every request's path
        req.request_id = request_id
        return [req]
    out = []
    for i in range(n):
        r = pb.GenerateRequest()
        r.CopyFrom(req)
        r.request_id = f"{request_id}-{i}"
        if req.HasField("seed"):
            r.seed = (req.seed + i + INT64) % (2 * INT64) - INT64  # wraps within int64 (vLLM's range)
        out.append(r)
    return out


def usage(u: pb.Usage) -> pb.CompletionUsage:
    return pb.CompletionUsage(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.completion_tokens,
        total_tokens=u.prompt_tokens + u.completion_tokens,
        prompt_tokens_details=pb.PromptTokensDetails(cached_tokens=u.cached_prompt_tokens),
        completion_tokens_details=pb.CompletionTokensDetails(reasoning_tokens=u.reasoning_tokens)
        if u.reasoning_tokens else None,
    )


def total_usage(usages: Sequence[pb.Usage]) -> pb.Usage:
    """The usage of a request's choices as vLLM counts it: the prompt once, every choice's output."""
    if len(usages) == 1:
        return usages[0]
    first = usages[0] if usages else pb.Usage()
    return pb.Usage(prompt_tokens=first.prompt_tokens, cached_prompt_tokens=first.cached_prompt_tokens,
                    completion_tokens=sum(u.completion_tokens for u in usages),
                    reasoning_tokens=sum(u.reasoning_tokens for u in usages))


def cache_info(resp: pb.GenerateResponse | pb.CompleteResponse) -> pb.CacheInfo | None:
    """How an answer was served when not generated for this request alone (None when it was)."""
    if not resp.cache_kind:
        return None
    return pb.CacheInfo(kind=resp.cache_kind, age_s=resp.cache_age_s, similarity=resp.cache_similarity)


def _utf8(token: str) -> list[int]:
    return list(token.encode("utf-8", errors="replace"))


def chat_logprobs(logprobs: Iterable[pb.TokenLogprob]) -> pb.ChatCompletionLogprobs:
    """OpenAI's chat logprobs: per token its text, bytes, logprob and the likeliest alternatives."""
    return pb.ChatCompletionLogprobs(content=[
        pb.ChatCompletionTokenLogprob(
            token=lp.token, logprob=lp.logprob, bytes=_utf8(lp.token),
            top_logprobs=[pb.ChatCompletionTopLogprob(token=t.token, logprob=t.logprob, bytes=_utf8(t.token))
                          for t in lp.top],
        )
        for lp in logprobs
    ])


def completion_logprobs(logprobs: Iterable[pb.TokenLogprob], offset: int = 0) -> pb.CompletionLogprobs:
    """OpenAI's legacy completions logprobs: parallel lists; ``offset`` is where the first token's
    text starts in the choice's text (a stream's earlier chunks)."""
    out = pb.CompletionLogprobs()
    for lp in logprobs:
        out.text_offset.append(offset)
        offset += len(lp.token)
        out.tokens.append(lp.token)
        out.token_logprobs.append(lp.logprob)
        alternatives = {t.token: t.logprob for t in lp.top}
        alternatives.setdefault(lp.token, lp.logprob)
        out.top_logprobs.add().update(alternatives)
    return out


def chat_completion(resps: Sequence[pb.CompleteResponse], response_id: str, logprobs: bool,
                    model: str, created: int, tools: tuple[str, str] = (NONE, ""),
                    system_fingerprint: str = FINGERPRINT) -> pb.ChatCompletion:
    """The chat completion of a request's choices (``resps``, by index); ``tools``: its
    tool_choice (a forced call's output is the message's tool_calls)."""
    messages = [_message(r, tools) for r in resps]
    return pb.ChatCompletion(
        id=f"chatcmpl-{response_id}",
        object="chat.completion",
        system_fingerprint=system_fingerprint,
        created=created,
        model=model,
        choices=[
            pb.ChatCompletionChoice(
                index=i,
                message=message,
                finish_reason=finish_reason,
                logprobs=chat_logprobs(r.logprobs) if logprobs else None,
            )
            for i, (r, (message, finish_reason)) in enumerate(zip(resps, messages, strict=True))
        ],
        usage=usage(total_usage([r.usage for r in resps])),
        cache=cache_info(resps[0]),
    )


def completion(resps: Sequence[pb.CompleteResponse], response_id: str, logprobs: bool, echo: str,
               model: str, created: int, system_fingerprint: str = FINGERPRINT) -> pb.Completion:
    """The text completion of a request's choices; ``echo``: the prompt, put before each text."""
    return pb.Completion(
        id=f"cmpl-{response_id}",
        object="text_completion",
        system_fingerprint=system_fingerprint,
        created=created,
        model=model,
        choices=[
            pb.CompletionChoice(index=i, text=echo + r.text, finish_reason=r.finish_reason,
                                logprobs=completion_logprobs(r.logprobs) if logprobs else None)
            for i, r in enumerate(resps)
        ],
        usage=usage(total_usage([r.usage for r in resps])),
        cache=cache_info(resps[0]),
    )


def chat_chunk(chunk: pb.GenerateResponse, index: int, first: bool, response_id: str, logprobs: bool,
               model: str, created: int, tools: tuple[str, str] = (NONE, ""), so_far: str = "",
               system_fingerprint: str = FINGERPRINT) -> pb.ChatCompletionChunk:
    """The OpenAI chunk of choice ``index`` for one mesh chunk (its first carries the role).
    ``tools``: the tool_choice; a named call streams its arguments as they come, a "required"
    one (a JSON list until it is complete) all its calls with its last chunk; ``so_far``: the
    choice's text before this chunk."""
    kind, name = tools
    # Built in place (choices.add, the delta within it): no copies of the nested messages.
    out = pb.ChatCompletionChunk(id=f"chatcmpl-{response_id}", object="chat.completion.chunk", created=created,
                                 model=model, system_fingerprint=system_fingerprint)
    choice = out.choices.add(index=index)
    delta = choice.delta
    delta.SetInParent()  # always present, possibly {}
    finish_reason = chunk.finish_reason
    if kind == FUNCTION:
        call = pb.ChatCompletionDeltaToolCall(index=0, function=pb.FunctionCallDelta(arguments=chunk.text))
        if first:
            call.id, call.type, call.function.name = call_id(), FUNCTION, name
        delta.tool_calls.append(call)
        if chunk.finish_reason:
            delta.content = ""  # as vLLM's last chunk of a call
    elif kind == REQUIRED:
        calls = required_calls(so_far + chunk.text) if chunk.finish_reason else None
        if calls is not None:
            delta.tool_calls.extend(
                pb.ChatCompletionDeltaToolCall(index=i, id=call_id(), type=FUNCTION,
                                               function=pb.FunctionCallDelta(name=fname, arguments=arguments))
                for i, (fname, arguments) in enumerate(calls))
            finish_reason = "tool_calls" if chunk.finish_reason == "stop" else chunk.finish_reason
        elif chunk.finish_reason:
            delta.content = so_far + chunk.text  # not a list of calls after all: the text as it is
    elif kind == AUTO:  # the parser's pieces: content, and calls as they are found
        if chunk.text or not chunk.tool_calls:
            delta.content = chunk.text
        for piece in chunk.tool_calls:
            call = delta.tool_calls.add(index=piece.index)
            if piece.id:
                call.id, call.type = piece.id, FUNCTION
            if piece.name:
                call.function.name = piece.name
            call.function.arguments = piece.arguments
    else:
        delta.content = chunk.text
    if chunk.reasoning:  # a worker's reasoning parser: the thinking beside the content, as vLLM's
        delta.reasoning = chunk.reasoning
        if not chunk.text and kind in (NONE, AUTO):
            delta.ClearField("content")  # thinking only: no empty content beside it
    if first:
        delta.role = "assistant"
    if logprobs:
        choice.logprobs.CopyFrom(chat_logprobs(chunk.logprobs))
    if finish_reason:
        choice.finish_reason = finish_reason
        if (cache := cache_info(chunk)) is not None:
            out.cache.CopyFrom(cache)
    return out


def completion_chunk(chunk: pb.GenerateResponse, index: int, text_before: str, offset: int, response_id: str,
                     logprobs: bool, model: str, created: int, system_fingerprint: str = FINGERPRINT) -> pb.Completion:
    """The OpenAI chunk of choice ``index``; ``text_before``: the echoed prompt (first chunk);
    ``offset``: the length of the choice's text sent before this chunk."""
    out = pb.Completion(id=f"cmpl-{response_id}", object="text_completion", created=created, model=model,
                        system_fingerprint=system_fingerprint)
    choice = out.choices.add(index=index, text=text_before + chunk.text)  # in place: no copy
    if logprobs:
        choice.logprobs.CopyFrom(completion_logprobs(chunk.logprobs, offset + len(text_before)))
    if chunk.finish_reason:
        choice.finish_reason = chunk.finish_reason
        if (cache := cache_info(chunk)) is not None:
            out.cache.CopyFrom(cache)
    return out


def error(code: grpc.StatusCode, message: str, trailers: tuple[tuple[str, str], ...] = ()) -> pb.OpenAIError:
    """The error object that ends a stream which failed after its first chunk (``trailers``:
    the status's, which may name the field at fault)."""
    kind, name = openai_errors.error_type(code)
    return pb.OpenAIError(message=message, type=kind, code=name, param=validation.param_of(trailers))
