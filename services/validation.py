"""Checks a GenerateRequest before any work is done; every message names the offending field."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection

from meshserve.services.gen import meshserve_pb2 as pb

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


def unknown_model(asked: str, served: str, adapters: Collection[str] = ()) -> str:
    """The message for a request naming a model this mesh does not serve, neither its model
    ``served`` nor one of its LoRA ``adapters`` (NOT_FOUND: HTTP 404, as OpenAI's and vLLM's
    servers answer)."""
    also = f" and the LoRA adapters {', '.join(map(repr, sorted(adapters)))}" if adapters else ""
    return f"the model {asked!r} does not exist; this mesh serves {served!r}{also}"


def param_metadata(param: str | None) -> tuple[tuple[str, str], ...]:
    """The trailing metadata that carries ``param`` with the status (none without one)."""
    return ((PARAM_METADATA, param),) if param else ()


def param_of(metadata: object) -> str | None:
    """The ``param`` a call's trailing metadata carries, if any."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == PARAM_METADATA:
            return value if isinstance(value, str) else value.decode()
    return None


def validate(req: pb.GenerateRequest, max_model_len: int | None = None) -> None:
    """Raises InvalidRequest for a request no worker could serve."""
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
    _validate_sampling(req)
    check_template(req)
    if req.parse_tool_calls and not (req.tools and req.messages):
        raise InvalidRequest("'parse_tool_calls' needs chat 'messages' and the 'tools' the model may call", param="parse_tool_calls")
    if req.cache and req.cache not in CACHE_MODES:
        raise InvalidRequest(f"'cache' must be one of {list(CACHE_MODES)} (or empty: the gateway's default), got {req.cache!r}", param="cache")


def _validate_sampling(req: pb.GenerateRequest) -> None:
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
        _validate_structured(req.structured_outputs)


def _validate_structured(so: pb.StructuredOutputs) -> None:
    """A constraint the engine can be given: one kind, a JSON schema that is one, a regex that
    compiles, a non-empty choice. (A grammar is the backend's to compile.)"""
    kind = so.WhichOneof("kind")
    if kind is None:
        raise InvalidRequest("'structured_outputs' sets no constraint: give json, json_object, regex, choice or grammar", param="structured_outputs")
    if kind == "json":
        try:
            schema = json.loads(so.json)
        except json.JSONDecodeError as e:
            raise InvalidRequest(f"'structured_outputs.json' is not JSON: {e}", param="structured_outputs.json") from None
        check_schema(schema, "structured_outputs.json")
    elif kind == "json_object" and not so.json_object:
        raise InvalidRequest("'structured_outputs.json_object' must be true when given", param="structured_outputs.json_object")
    elif kind == "regex":
        try:
            re.compile(so.regex)
        except re.error as e:
            raise InvalidRequest(f"'structured_outputs.regex' is not a regular expression: {e}", param="structured_outputs.regex") from None
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


def check_template(req: pb.GenerateRequest) -> None:
    """How a chat's template is to be called: its variables (``template_kwargs``), and vLLM's
    add_generation_prompt / continue_final_message: for a chat, not both, and a final message
    with something to continue."""
    template_kwargs(req)
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


def template_kwargs(req: pb.GenerateRequest) -> dict[str, object] | None:
    """The request's chat_template_kwargs (None when it has none), checked: a JSON object, for
    chat messages, not naming the template call's own arguments."""
    if not req.chat_template_kwargs:
        return None
    try:
        kwargs = json.loads(req.chat_template_kwargs)
    except json.JSONDecodeError as e:
        raise InvalidRequest(f"'chat_template_kwargs' is not JSON: {e}", param="chat_template_kwargs") from None
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
