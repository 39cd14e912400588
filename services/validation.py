"""Checks a GenerateRequest before any work is done; every message names the offending field."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection, Sequence

from meshserve.services.config import RequestLimits
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.offload import OFFLOAD_CHARS

# The serving defaults of a request's optional fields: applied by the worker, and by the cache
# before hashing (a request that leaves a field unset and one that spells out the default share
# one entry). Defined here alone.
DEFAULT_MAX_TOKENS = 128
DEFAULT_TEMPERATURE = 1.0
DEFAULT_TOP_P = 1.0
# vLLM's SamplingParams defaults and limits (vllm/sampling_params.py), so that a request vLLM
# would refuse is refused here, naming the field, before it reaches a worker.
DEFAULT_REPETITION_PENALTY = 1.0
MAX_TEMPERATURE = 2.0
MAX_PENALTY = 2.0          # |presence_penalty|, |frequency_penalty|
MAX_LOGIT_BIAS = 100.0     # OpenAI's range for logit_bias values
MAX_LOGPROBS = 20          # vLLM's default --max-logprobs
# The finish reasons of a completed generation (an aborted one ends "abort", and is not kept);
# "tool_calls": it stopped after calls a worker's tool-call parser found (parse_tool_calls).
FINISHED = frozenset({"stop", "length", "tool_calls"})
VALID_ROLES = {"system", "user", "assistant", "tool", "developer"}
# GenerateRequest.cache: "" leaves it to the gateway's --cache-mode.
CACHE_OFF, CACHE_EXACT, CACHE_SEMANTIC = "off", "exact", "semantic"
CACHE_MODES = (CACHE_OFF, CACHE_EXACT, CACHE_SEMANTIC)
# chat_template_kwargs may not name what the worker's call of the template sets itself
# (transformers' apply_chat_template arguments and the variables it renders with).
TEMPLATE_OWN = frozenset({"conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
                          "continue_final_message", "tokenize", "padding", "truncation", "max_length",
                          "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})


# Trailing metadata of an INVALID_ARGUMENT: the request field at fault (OpenAI's error `param`).
PARAM_METADATA = "x-meshserve-param"


class InvalidRequest(ValueError):
    """A request the caller must fix (gRPC INVALID_ARGUMENT, HTTP 400); ``param`` names the field
    at fault (``messages[2].role``), None when no one field is."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def unknown_model(asked: str, served: str | Sequence[str], adapters: Collection[str] = ()) -> str:
    """The message for a request naming a model this mesh does not serve, neither one of its
    base models ``served`` nor one of its LoRA ``adapters`` (NOT_FOUND: HTTP 404, as OpenAI's and
    vLLM's servers answer)."""
    models = [served] if isinstance(served, str) else list(served)
    named = repr(models[0]) if len(models) == 1 else f"the models {', '.join(map(repr, models))}"
    also = f" and the LoRA adapters {', '.join(map(repr, sorted(adapters)))}" if adapters else ""
    return f"the model {asked!r} does not exist; this mesh serves {named}{also}"


def param_metadata(param: str | None) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that carries ``param`` with the status (none without one)."""
    return ((PARAM_METADATA, param),) if param else ()


def param_of(metadata: object) -> str | None:
    """The ``param`` a call's trailing metadata carries, if any."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == PARAM_METADATA:
            return value if isinstance(value, str) else value.decode()
    return None


def validate(req: pb.GenerateRequest, max_model_len: int | None = None,
             limits: RequestLimits | None = None) -> None:
    """Raises InvalidRequest for a request no worker could serve, or (``limits``: the gateway's)
    one past a bound of what a request may hold: sizes and counts first, before anything is parsed."""
    if limits is not None:
        check_limits(req, limits)
    max_depth = limits.max_json_depth if limits is not None else None
    if req.prompt and req.messages:
        raise InvalidRequest("give either 'prompt' or 'messages', not both")
    if not req.prompt.strip() and not req.messages:
        raise InvalidRequest("'prompt' is empty: give a prompt or chat 'messages'", param="prompt")
    for i, m in enumerate(req.messages):
        if m.role not in VALID_ROLES:
            raise InvalidRequest(f"'messages[{i}].role' must be one of {sorted(VALID_ROLES)}, got {m.role!r}", param=f"messages[{i}].role")
    if req.HasField("max_tokens"):
        if req.max_tokens <= 0:
            raise InvalidRequest(f"'max_tokens' must be at least 1, got {req.max_tokens}", param="max_tokens")
        if max_model_len is not None and req.max_tokens >= max_model_len:
            raise InvalidRequest(
                f"'max_tokens' is {req.max_tokens} but the model's context is {max_model_len} tokens",
                param="max_tokens")
    if req.HasField("temperature") and not (0 <= req.temperature <= MAX_TEMPERATURE):
        raise InvalidRequest(f"'temperature' must be in [0, {MAX_TEMPERATURE:g}], got {req.temperature:g}", param="temperature")
    if req.HasField("top_p") and not (0 < req.top_p <= 1):
        raise InvalidRequest(f"'top_p' must be in (0, 1], got {req.top_p}", param="top_p")
    for i, s in enumerate(req.stop):
        if not s:
            raise InvalidRequest(f"'stop[{i}]' is an empty string", param=f"stop[{i}]")
    if req.HasField("stream_interval") and req.stream_interval < 1:
        raise InvalidRequest(f"'stream_interval' must be at least 1 (tokens per chunk), got {req.stream_interval}", param="stream_interval")
    if len(req.continue_token_ids) >= max_tokens(req):
        raise InvalidRequest(f"'continue_token_ids' has {len(req.continue_token_ids)} tokens: no room left "
                             f"under max_tokens ({max_tokens(req)})", param="continue_token_ids")
    _validate_sampling(req, max_depth)
    check_template(req, max_depth)
    if req.tools:
        check_tools(req.tools, limits.max_tools if limits is not None else None, max_depth)
    if req.parse_tool_calls and not (req.tools and req.messages):
        raise InvalidRequest("'parse_tool_calls' needs chat 'messages' and the 'tools' the model may call", param="parse_tool_calls")
    if req.cache and req.cache not in CACHE_MODES:
        raise InvalidRequest(f"'cache' must be one of {list(CACHE_MODES)} (or empty: the gateway's default), got {req.cache!r}", param="cache")


def check_cost(req: pb.GenerateRequest) -> int:
    """What checking ``req`` costs, as a size (services.offload decides by it where to check it):
    its size in bytes, and more for a JSON schema or tools, whose check costs ~1.5 ms even when small."""
    size = req.ByteSize()
    if req.tools or (req.HasField("structured_outputs") and req.structured_outputs.HasField("json")):
        size += OFFLOAD_CHARS
    return size


def check_limits(req: pb.GenerateRequest, limits: RequestLimits) -> None:
    """The bounds of ``limits`` that need nothing parsed: each costs a length, a count or one pass
    over a field's text, so a request past one is refused before any work that grows with it."""
    if len(req.request_id) > limits.max_request_id_chars:
        raise InvalidRequest(f"'request_id' has {len(req.request_id):,} characters; at most "
                             f"{limits.max_request_id_chars:,} (the gateway's --max-request-id-chars)", param="request_id")
    if req.messages:
        check_count(len(req.messages), limits.max_messages, "messages", "max-messages")
        check_size(sum(map(message_bytes, req.messages)), limits.max_prompt_bytes, "messages", "max-prompt-bytes")
    else:
        check_size(utf8_len(req.prompt), limits.max_prompt_bytes, "prompt", "max-prompt-bytes")
    check_count(len(req.stop), limits.max_stop, "stop", "max-stop")
    check_count(len(req.logit_bias), limits.max_logit_bias, "logit_bias", "max-logit-bias")
    for name in ("tools", "chat_template_kwargs"):
        check_size(utf8_len(getattr(req, name)), limits.max_schema_bytes, name, "max-schema-bytes")
    if req.HasField("structured_outputs"):
        so = req.structured_outputs
        kind = so.WhichOneof("kind")
        if kind in ("json", "regex", "grammar"):
            check_size(utf8_len(getattr(so, kind)), limits.max_schema_bytes, f"structured_outputs.{kind}",
                       "max-schema-bytes")
        elif kind == "choice":
            check_size(sum(map(utf8_len, so.choice.values)), limits.max_schema_bytes, "structured_outputs.choice",
                       "max-schema-bytes")


def utf8_len(text: str) -> int:
    """``text``'s length in UTF-8 bytes (ASCII text, most prompts, is not encoded to count it)."""
    return len(text) if text.isascii() else len(text.encode())


def message_bytes(m: pb.ChatMessage) -> int:
    """What a chat message gives its template, in UTF-8 bytes."""
    size = utf8_len(m.content) + utf8_len(m.reasoning) + utf8_len(m.tool_call_id)
    for call in m.tool_calls:
        size += utf8_len(call.id) + utf8_len(call.name) + utf8_len(call.arguments)
    return size


def check_count(count: int, most: int, field: str, flag: str) -> None:
    """Raises InvalidRequest naming ``field`` when it holds more than ``most`` entries (``flag``:
    the gateway's setting of that bound, named in the message)."""
    if count > most:
        raise InvalidRequest(f"'{field}' holds {count:,} entries; at most {most:,} (the gateway's --{flag})",
                             param=field)


def check_size(size: int, most: int, field: str, flag: str) -> None:
    """Raises InvalidRequest naming ``field`` when it is more than ``most`` bytes."""
    if size > most:
        raise InvalidRequest(f"'{field}' is {size:,} bytes; at most {most:,} (the gateway's --{flag})", param=field)


def check_depth(value: object, most: int | None, field: str) -> None:
    """Raises InvalidRequest naming ``field`` when JSON ``value`` nests objects and arrays more
    than ``most`` deep (None: no bound). Iterative: a value of any depth is measured."""
    if most is None or not isinstance(value, dict | list):
        return
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > most:
            raise InvalidRequest(f"'{field}' nests objects and arrays more than {most} deep (the gateway's "
                                 "--max-json-depth)", param=field)
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children  # type: ignore[union-attr]
                     if isinstance(child, dict | list))


def parse_json(text: str, field: str, max_depth: int | None = None) -> object:
    """``text`` parsed, no deeper than ``max_depth``; InvalidRequest naming ``field`` if it is not
    JSON, or nests past the bound (or past what Python's parser recurses through, whatever the bound)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise InvalidRequest(f"'{field}' is not JSON: {e}", param=field) from None
    except RecursionError:
        raise InvalidRequest(f"'{field}' nests objects and arrays too deep to be read", param=field) from None
    check_depth(value, max_depth, field)
    return value


def check_tools(tools: str, most: int | None, max_depth: int | None) -> list[dict[str, object]]:
    """The request's ``tools`` (OpenAI's, as JSON text): a JSON array of at most ``most`` objects
    (None: no bound), no deeper than ``max_depth``."""
    value = parse_json(tools, "tools", max_depth)
    if not isinstance(value, list) or not all(isinstance(tool, dict) for tool in value):
        raise InvalidRequest("'tools' must be a JSON array of tool objects", param="tools")
    if most is not None:
        check_count(len(value), most, "tools", "max-tools")
    return value


def _validate_sampling(req: pb.GenerateRequest, max_depth: int | None = None) -> None:
    """vLLM's sampling fields, with vLLM's limits (out-of-vocabulary token ids are the worker's
    to refuse: only it knows the vocabulary)."""
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if req.HasField(name) and not (-MAX_PENALTY <= value <= MAX_PENALTY):
            raise InvalidRequest(f"'{name}' must be in [-{MAX_PENALTY:g}, {MAX_PENALTY:g}], got {value:g}", param=name)
    if req.HasField("repetition_penalty") and not (0 < req.repetition_penalty < math.inf):
        raise InvalidRequest(f"'repetition_penalty' must be > 0 (1 is off), got {req.repetition_penalty:g}", param="repetition_penalty")
    if req.HasField("top_k") and req.top_k < -1:
        raise InvalidRequest(f"'top_k' must be 0 or -1 (off) or at least 1, got {req.top_k}", param="top_k")
    if req.HasField("min_p") and not (0 <= req.min_p <= 1):
        raise InvalidRequest(f"'min_p' must be in [0, 1], got {req.min_p:g}", param="min_p")
    if req.HasField("min_tokens"):
        if req.min_tokens < 0:
            raise InvalidRequest(f"'min_tokens' must be >= 0, got {req.min_tokens}", param="min_tokens")
        if req.min_tokens > max_tokens(req):
            raise InvalidRequest(f"'min_tokens' ({req.min_tokens}) must be at most 'max_tokens' ({max_tokens(req)})", param="min_tokens")
    for i, token in enumerate(req.stop_token_ids):
        if token < 0:
            raise InvalidRequest(f"'stop_token_ids[{i}]' must be a token id (>= 0), got {token}", param=f"stop_token_ids[{i}]")
    for token, bias in req.logit_bias.items():
        if token < 0:
            raise InvalidRequest(f"'logit_bias' keys must be token ids (>= 0), got {token}", param="logit_bias")
        if not (-MAX_LOGIT_BIAS <= bias <= MAX_LOGIT_BIAS):
            raise InvalidRequest(f"'logit_bias' of token {token} must be in [-{MAX_LOGIT_BIAS:g}, "
                                 f"{MAX_LOGIT_BIAS:g}], got {bias:g}", param="logit_bias")
    if req.HasField("logprobs") and not (0 <= req.logprobs <= MAX_LOGPROBS):
        raise InvalidRequest(f"'logprobs' must be in [0, {MAX_LOGPROBS}] (alternatives per token), got {req.logprobs}", param="logprobs")
    if req.HasField("structured_outputs"):
        _validate_structured(req.structured_outputs, max_depth)


def _validate_structured(so: pb.StructuredOutputs, max_depth: int | None = None) -> None:
    """A constraint the engine can be given: one kind, a JSON schema that is one, a regex that
    compiles, a non-empty choice. (A grammar is the backend's to compile.)"""
    kind = so.WhichOneof("kind")
    if kind is None:
        raise InvalidRequest("'structured_outputs' sets no constraint: give json, json_object, regex, choice or grammar", param="structured_outputs")
    if kind == "json":
        check_schema(parse_json(so.json, "structured_outputs.json", max_depth), "structured_outputs.json")
    elif kind == "json_object" and not so.json_object:
        raise InvalidRequest("'structured_outputs.json_object' must be true when given", param="structured_outputs.json_object")
    elif kind == "regex":
        try:
            re.compile(so.regex)
        except re.error as e:
            raise InvalidRequest(f"'structured_outputs.regex' is not a regular expression: {e}", param="structured_outputs.regex") from None
        except (RecursionError, OverflowError):  # groups nested past what Python's parser recurses through
            raise InvalidRequest("'structured_outputs.regex' nests too deep to be compiled",
                                 param="structured_outputs.regex") from None
    elif kind == "choice" and (not so.choice.values or not all(so.choice.values)):
        raise InvalidRequest("'structured_outputs.choice' must list at least one non-empty string", param="structured_outputs.choice")
    elif kind == "grammar" and not so.grammar.strip():
        raise InvalidRequest("'structured_outputs.grammar' is empty", param="structured_outputs.grammar")


def check_schema(schema: object, field: str) -> None:
    """Raises InvalidRequest naming ``field`` unless ``schema`` is a valid JSON schema (of its
    own draft, Draft 2020-12 when it names none)."""
    import jsonschema

    if not isinstance(schema, dict | bool):
        raise InvalidRequest(f"'{field}' must be a JSON schema (an object), got {type(schema).__name__}", param=field)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "the top level"
        raise InvalidRequest(f"'{field}' is not a valid JSON schema (at {where}): {e.message}", param=field) from None
    except RecursionError:  # a schema nested deeper than any bound let through (the worker sets none)
        raise InvalidRequest(f"'{field}' nests too deep to be checked", param=field) from None


def check_template(req: pb.GenerateRequest, max_depth: int | None = None) -> None:
    """How a chat's template is to be called: its variables (``template_kwargs``), and vLLM's
    add_generation_prompt / continue_final_message: for a chat, not both, and a final message
    with something to continue."""
    template_kwargs(req, max_depth)
    if not (req.HasField("add_generation_prompt") or req.continue_final_message):
        return
    name = "continue_final_message" if req.continue_final_message else "add_generation_prompt"
    if not req.messages:
        raise InvalidRequest(f"'{name}' needs chat 'messages' (a plain prompt has no template)", param=name)
    if req.continue_final_message and add_generation_prompt(req):
        raise InvalidRequest("'continue_final_message' and 'add_generation_prompt' cannot both be true (as vLLM): "
                             "set 'add_generation_prompt' to false to continue the final message",
                             param="continue_final_message")
    if req.continue_final_message and not req.messages[-1].content:
        raise InvalidRequest("'continue_final_message' needs a final message with text to continue",
                             param="continue_final_message")


def add_generation_prompt(req: pb.GenerateRequest) -> bool:
    """Whether a chat's template opens the assistant's turn (vLLM's default: true)."""
    return req.add_generation_prompt if req.HasField("add_generation_prompt") else True


def template_kwargs(req: pb.GenerateRequest, max_depth: int | None = None) -> dict[str, object] | None:
    """The request's chat_template_kwargs (None when it has none), checked: a JSON object, for
    chat messages, not naming the template call's own arguments."""
    if not req.chat_template_kwargs:
        return None
    kwargs = parse_json(req.chat_template_kwargs, "chat_template_kwargs", max_depth)
    if not isinstance(kwargs, dict):
        raise InvalidRequest(f"'chat_template_kwargs' must be a JSON object, got {type(kwargs).__name__}",
                             param="chat_template_kwargs")
    if not req.messages:
        raise InvalidRequest("'chat_template_kwargs' needs chat 'messages' (a plain prompt has no template)",
                             param="chat_template_kwargs")
    if own := sorted(TEMPLATE_OWN & kwargs.keys()):
        raise InvalidRequest(f"'chat_template_kwargs' may not set {', '.join(map(repr, own))}: the worker's call "
                             "of the chat template sets it ('add_generation_prompt' and 'continue_final_message' "
                             "are request fields of their own)", param="chat_template_kwargs")
    return kwargs


def max_tokens(req: pb.GenerateRequest) -> int:
    return req.max_tokens if req.HasField("max_tokens") else DEFAULT_MAX_TOKENS


def temperature(req: pb.GenerateRequest) -> float:
    return req.temperature if req.HasField("temperature") else DEFAULT_TEMPERATURE


def top_p(req: pb.GenerateRequest) -> float:
    return req.top_p if req.HasField("top_p") else DEFAULT_TOP_P


def repetition_penalty(req: pb.GenerateRequest) -> float:
    return req.repetition_penalty if req.HasField("repetition_penalty") else DEFAULT_REPETITION_PENALTY


def skip_special_tokens(req: pb.GenerateRequest) -> bool:
    return req.skip_special_tokens if req.HasField("skip_special_tokens") else True


def cache_mode(req: pb.GenerateRequest, default: str) -> str:
    """How the response cache serves ``req``: "off" (skip_cache, cache "off", or sampled
    output: nothing to share), else its own ``cache`` or ``default``. A request asking for
    logprobs is answered by exact matches only: a similar prompt's answer would carry the log
    probabilities of another prompt; so is one whose tool calls are parsed (a similar question's
    calls would carry the other question's arguments)."""
    if req.skip_cache or req.cache == CACHE_OFF or not is_deterministic(req):
        return CACHE_OFF
    mode = req.cache or default
    if mode == CACHE_SEMANTIC and (req.HasField("logprobs") or req.parse_tool_calls):
        return CACHE_EXACT
    return mode


def is_deterministic(req: pb.GenerateRequest) -> bool:
    """Greedy or seeded sampling: the same request always yields the same completion."""
    return (req.HasField("temperature") and req.temperature == 0) or req.HasField("seed")


CHARS_PER_TOKEN = 4  # a prompt's tokens, guessed before any tokenizer has seen it (English text, BPE)


def prompt_tokens_estimate(req: pb.GenerateRequest) -> int:
    """About how many tokens ``req``'s prompt is, from its length (the gateway has no tokenizer:
    what it weighs requests by when they queue)."""
    chars = len(req.prompt) + sum(len(m.content) for m in req.messages)
    return max(1, chars // CHARS_PER_TOKEN)
