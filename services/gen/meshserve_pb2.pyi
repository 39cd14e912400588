from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatMessage(_message.Message):
    __slots__ = ("role", "content", "tool_call_id", "tool_calls", "reasoning")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_call_id: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    reasoning: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_call_id: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., reasoning: _Optional[str] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("id", "name", "arguments")
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    arguments: str
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "messages", "max_tokens", "temperature", "top_p", "seed", "stop", "ignore_eos", "request_id", "skip_cache", "model", "stream_interval", "user", "cache", "continue_token_ids", "presence_penalty", "frequency_penalty", "repetition_penalty", "top_k", "min_p", "min_tokens", "stop_token_ids", "logit_bias", "include_stop_str_in_output", "skip_special_tokens", "logprobs", "structured_outputs", "tools", "parse_tool_calls", "chat_template_kwargs", "include_reasoning", "add_generation_prompt", "continue_final_message", "priority", "lora_path")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    SKIP_CACHE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    PARSE_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_REASONING_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_FINAL_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    LORA_PATH_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: _containers.RepeatedScalarFieldContainer[str]
    ignore_eos: bool
    request_id: str
    skip_cache: bool
    model: str
    stream_interval: int
    user: str
    cache: str
    continue_token_ids: _containers.RepeatedScalarFieldContainer[int]
    presence_penalty: float
    frequency_penalty: float
    repetition_penalty: float
    top_k: int
    min_p: float
    min_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logit_bias: _containers.ScalarMap[int, float]
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    logprobs: int
    structured_outputs: StructuredOutputs
    tools: str
    parse_tool_calls: bool
    chat_template_kwargs: str
    include_reasoning: bool
    add_generation_prompt: bool
    continue_final_message: bool
    priority: int
    lora_path: str
    def __init__(self, prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., ignore_eos: _Optional[bool] = ..., request_id: _Optional[str] = ..., skip_cache: _Optional[bool] = ..., model: _Optional[str] = ..., stream_interval: _Optional[int] = ..., user: _Optional[str] = ..., cache: _Optional[str] = ..., continue_token_ids: _Optional[_Iterable[int]] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., repetition_penalty: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., min_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., include_stop_str_in_output: _Optional[bool] = ..., skip_special_tokens: _Optional[bool] = ..., logprobs: _Optional[int] = ..., structured_outputs: _Optional[_Union[StructuredOutputs, _Mapping]] = ..., tools: _Optional[str] = ..., parse_tool_calls: _Optional[bool] = ..., chat_template_kwargs: _Optional[str] = ..., include_reasoning: _Optional[bool] = ..., add_generation_prompt: _Optional[bool] = ..., continue_final_message: _Optional[bool] = ..., priority: _Optional[int] = ..., lora_path: _Optional[str] = ...) -> None: ...

class StructuredOutputs(_message.Message):
    __slots__ = ("json", "json_object", "regex", "choice", "grammar")
    JSON_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    json: str
    json_object: bool
    regex: str
    choice: StringList
    grammar: str
    def __init__(self, json: _Optional[str] = ..., json_object: _Optional[bool] = ..., regex: _Optional[str] = ..., choice: _Optional[_Union[StringList, _Mapping]] = ..., grammar: _Optional[str] = ...) -> None: ...

class StringList(_message.Message):
    __slots__ = ("values",)
    VALUES_FIELD_NUMBER: _ClassVar[int]
    values: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, values: _Optional[_Iterable[str]] = ...) -> None: ...

class TokenLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob", "top")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    top: _containers.RepeatedCompositeFieldContainer[TopLogprob]
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ..., top: _Optional[_Iterable[_Union[TopLogprob, _Mapping]]] = ...) -> None: ...

class TopLogprob(_message.Message):
    __slots__ = ("token_id", "token", "logprob")
    TOKEN_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    token_id: int
    token: str
    logprob: float
    def __init__(self, token_id: _Optional[int] = ..., token: _Optional[str] = ..., logprob: _Optional[float] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens", "reasoning_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    reasoning_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ..., reasoning_tokens: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "text", "token_ids", "finish_reason", "usage", "cached", "worker", "cache_kind", "cache_age_s", "cache_similarity", "logprobs", "tool_calls", "reasoning")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    CACHE_KIND_FIELD_NUMBER: _ClassVar[int]
    CACHE_AGE_S_FIELD_NUMBER: _ClassVar[int]
    CACHE_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    usage: Usage
    cached: bool
    worker: str
    cache_kind: str
    cache_age_s: float
    cache_similarity: float
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCallDelta]
    reasoning: str
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., cached: _Optional[bool] = ..., worker: _Optional[str] = ..., cache_kind: _Optional[str] = ..., cache_age_s: _Optional[float] = ..., cache_similarity: _Optional[float] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCallDelta, _Mapping]]] = ..., reasoning: _Optional[str] = ...) -> None: ...

class ToolCallDelta(_message.Message):
    __slots__ = ("index", "id", "name", "arguments")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    name: str
    arguments: str
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("request_id", "text", "token_ids", "finish_reason", "usage", "cached", "worker", "cache_kind", "cache_age_s", "cache_similarity", "logprobs", "tool_calls", "reasoning")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    CACHE_KIND_FIELD_NUMBER: _ClassVar[int]
    CACHE_AGE_S_FIELD_NUMBER: _ClassVar[int]
    CACHE_SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    usage: Usage
    cached: bool
    worker: str
    cache_kind: str
    cache_age_s: float
    cache_similarity: float
    logprobs: _containers.RepeatedCompositeFieldContainer[TokenLogprob]
    tool_calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    reasoning: str
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., cached: _Optional[bool] = ..., worker: _Optional[str] = ..., cache_kind: _Optional[str] = ..., cache_age_s: _Optional[float] = ..., cache_similarity: _Optional[float] = ..., logprobs: _Optional[_Iterable[_Union[TokenLogprob, _Mapping]]] = ..., tool_calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., reasoning: _Optional[str] = ...) -> None: ...

class StreamOptions(_message.Message):
    __slots__ = ("include_usage",)
    INCLUDE_USAGE_FIELD_NUMBER: _ClassVar[int]
    include_usage: bool
    def __init__(self, include_usage: _Optional[bool] = ...) -> None: ...

class ChatCompletionRequestMessage(_message.Message):
    __slots__ = ("role", "content", "name", "tool_calls", "tool_call_id", "refusal", "annotations", "audio", "function_call", "reasoning", "reasoning_content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_ID_FIELD_NUMBER: _ClassVar[int]
    REFUSAL_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_FIELD_NUMBER: _ClassVar[int]
    AUDIO_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_CALL_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    REASONING_CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: _struct_pb2.Value
    name: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ChatCompletionMessageToolCall]
    tool_call_id: str
    refusal: str
    annotations: _struct_pb2.Value
    audio: _struct_pb2.Value
    function_call: _struct_pb2.Value
    reasoning: str
    reasoning_content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., name: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ChatCompletionMessageToolCall, _Mapping]]] = ..., tool_call_id: _Optional[str] = ..., refusal: _Optional[str] = ..., annotations: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., audio: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., function_call: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., reasoning: _Optional[str] = ..., reasoning_content: _Optional[str] = ...) -> None: ...

class ChatCompletionMessageToolCall(_message.Message):
    __slots__ = ("id", "type", "function")
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    id: str
    type: str
    function: FunctionCall
    def __init__(self, id: _Optional[str] = ..., type: _Optional[str] = ..., function: _Optional[_Union[FunctionCall, _Mapping]] = ...) -> None: ...

class FunctionCall(_message.Message):
    __slots__ = ("name", "arguments")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    arguments: str
    def __init__(self, name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ChatCompletionTool(_message.Message):
    __slots__ = ("type", "function")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    type: str
    function: FunctionDefinition
    def __init__(self, type: _Optional[str] = ..., function: _Optional[_Union[FunctionDefinition, _Mapping]] = ...) -> None: ...

class FunctionDefinition(_message.Message):
    __slots__ = ("name", "description", "parameters", "strict")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    parameters: _struct_pb2.Struct
    strict: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., parameters: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., strict: _Optional[bool] = ...) -> None: ...

class ChatCompletionRequest(_message.Message):
    __slots__ = ("model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n", "user", "presence_penalty", "frequency_penalty", "logprobs", "ignore_eos", "skip_cache", "stream_interval", "cache", "top_logprobs", "repetition_penalty", "top_k", "min_p", "min_tokens", "stop_token_ids", "logit_bias", "include_stop_str_in_output", "skip_special_tokens", "response_format", "structured_outputs", "tools", "tool_choice", "parallel_tool_calls", "store", "metadata", "service_tier", "safety_identifier", "verbosity", "modalities", "prompt_cache_key", "chat_template_kwargs", "reasoning_effort", "include_reasoning", "add_generation_prompt", "continue_final_message", "priority")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MAX_COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    STREAM_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    SKIP_CACHE_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHOICE_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    STORE_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    SERVICE_TIER_FIELD_NUMBER: _ClassVar[int]
    SAFETY_IDENTIFIER_FIELD_NUMBER: _ClassVar[int]
    VERBOSITY_FIELD_NUMBER: _ClassVar[int]
    MODALITIES_FIELD_NUMBER: _ClassVar[int]
    PROMPT_CACHE_KEY_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_FIELD_NUMBER: _ClassVar[int]
    REASONING_EFFORT_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_REASONING_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_FINAL_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    model: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatCompletionRequestMessage]
    max_tokens: int
    max_completion_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: _struct_pb2.Value
    stream: bool
    stream_options: StreamOptions
    n: int
    user: str
    presence_penalty: float
    frequency_penalty: float
    logprobs: bool
    ignore_eos: bool
    skip_cache: bool
    stream_interval: int
    cache: str
    top_logprobs: int
    repetition_penalty: float
    top_k: int
    min_p: float
    min_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logit_bias: _containers.ScalarMap[int, float]
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    response_format: ResponseFormat
    structured_outputs: StructuredOutputsRequest
    tools: _containers.RepeatedCompositeFieldContainer[ChatCompletionTool]
    tool_choice: _struct_pb2.Value
    parallel_tool_calls: bool
    store: bool
    metadata: _containers.ScalarMap[str, str]
    service_tier: str
    safety_identifier: str
    verbosity: str
    modalities: _containers.RepeatedScalarFieldContainer[str]
    prompt_cache_key: str
    chat_template_kwargs: _struct_pb2.Struct
    reasoning_effort: str
    include_reasoning: bool
    add_generation_prompt: bool
    continue_final_message: bool
    priority: int
    def __init__(self, model: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatCompletionRequestMessage, _Mapping]]] = ..., max_tokens: _Optional[int] = ..., max_completion_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., stream: _Optional[bool] = ..., stream_options: _Optional[_Union[StreamOptions, _Mapping]] = ..., n: _Optional[int] = ..., user: _Optional[str] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., logprobs: _Optional[bool] = ..., ignore_eos: _Optional[bool] = ..., skip_cache: _Optional[bool] = ..., stream_interval: _Optional[int] = ..., cache: _Optional[str] = ..., top_logprobs: _Optional[int] = ..., repetition_penalty: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., min_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., include_stop_str_in_output: _Optional[bool] = ..., skip_special_tokens: _Optional[bool] = ..., response_format: _Optional[_Union[ResponseFormat, _Mapping]] = ..., structured_outputs: _Optional[_Union[StructuredOutputsRequest, _Mapping]] = ..., tools: _Optional[_Iterable[_Union[ChatCompletionTool, _Mapping]]] = ..., tool_choice: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., parallel_tool_calls: _Optional[bool] = ..., store: _Optional[bool] = ..., metadata: _Optional[_Mapping[str, str]] = ..., service_tier: _Optional[str] = ..., safety_identifier: _Optional[str] = ..., verbosity: _Optional[str] = ..., modalities: _Optional[_Iterable[str]] = ..., prompt_cache_key: _Optional[str] = ..., chat_template_kwargs: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., reasoning_effort: _Optional[str] = ..., include_reasoning: _Optional[bool] = ..., add_generation_prompt: _Optional[bool] = ..., continue_final_message: _Optional[bool] = ..., priority: _Optional[int] = ...) -> None: ...

class CompletionRequest(_message.Message):
    __slots__ = ("model", "prompt", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n", "user", "presence_penalty", "frequency_penalty", "logprobs", "echo", "best_of", "ignore_eos", "skip_cache", "stream_interval", "cache", "repetition_penalty", "top_k", "min_p", "min_tokens", "stop_token_ids", "logit_bias", "include_stop_str_in_output", "skip_special_tokens", "response_format", "structured_outputs", "priority")
    class LogitBiasEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: float
        def __init__(self, key: _Optional[int] = ..., value: _Optional[float] = ...) -> None: ...
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    STREAM_FIELD_NUMBER: _ClassVar[int]
    STREAM_OPTIONS_FIELD_NUMBER: _ClassVar[int]
    N_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    PRESENCE_PENALTY_FIELD_NUMBER: _ClassVar[int]
    FREQUENCY_PENALTY_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ECHO_FIELD_NUMBER: _ClassVar[int]
    BEST_OF_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    SKIP_CACHE_FIELD_NUMBER: _ClassVar[int]
    STREAM_INTERVAL_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    REPETITION_PENALTY_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    MIN_P_FIELD_NUMBER: _ClassVar[int]
    MIN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    STOP_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    LOGIT_BIAS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_STOP_STR_IN_OUTPUT_FIELD_NUMBER: _ClassVar[int]
    SKIP_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FORMAT_FIELD_NUMBER: _ClassVar[int]
    STRUCTURED_OUTPUTS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: _struct_pb2.Value
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    stop: _struct_pb2.Value
    stream: bool
    stream_options: StreamOptions
    n: int
    user: str
    presence_penalty: float
    frequency_penalty: float
    logprobs: int
    echo: bool
    best_of: int
    ignore_eos: bool
    skip_cache: bool
    stream_interval: int
    cache: str
    repetition_penalty: float
    top_k: int
    min_p: float
    min_tokens: int
    stop_token_ids: _containers.RepeatedScalarFieldContainer[int]
    logit_bias: _containers.ScalarMap[int, float]
    include_stop_str_in_output: bool
    skip_special_tokens: bool
    response_format: ResponseFormat
    structured_outputs: StructuredOutputsRequest
    priority: int
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., stream: _Optional[bool] = ..., stream_options: _Optional[_Union[StreamOptions, _Mapping]] = ..., n: _Optional[int] = ..., user: _Optional[str] = ..., presence_penalty: _Optional[float] = ..., frequency_penalty: _Optional[float] = ..., logprobs: _Optional[int] = ..., echo: _Optional[bool] = ..., best_of: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., skip_cache: _Optional[bool] = ..., stream_interval: _Optional[int] = ..., cache: _Optional[str] = ..., repetition_penalty: _Optional[float] = ..., top_k: _Optional[int] = ..., min_p: _Optional[float] = ..., min_tokens: _Optional[int] = ..., stop_token_ids: _Optional[_Iterable[int]] = ..., logit_bias: _Optional[_Mapping[int, float]] = ..., include_stop_str_in_output: _Optional[bool] = ..., skip_special_tokens: _Optional[bool] = ..., response_format: _Optional[_Union[ResponseFormat, _Mapping]] = ..., structured_outputs: _Optional[_Union[StructuredOutputsRequest, _Mapping]] = ..., priority: _Optional[int] = ...) -> None: ...

class PromptTokensDetails(_message.Message):
    __slots__ = ("cached_tokens",)
    CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    cached_tokens: int
    def __init__(self, cached_tokens: _Optional[int] = ...) -> None: ...

class CompletionUsage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details", "completion_tokens_details")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOTAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_DETAILS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_DETAILS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: CompletionTokensDetails
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., total_tokens: _Optional[int] = ..., prompt_tokens_details: _Optional[_Union[PromptTokensDetails, _Mapping]] = ..., completion_tokens_details: _Optional[_Union[CompletionTokensDetails, _Mapping]] = ...) -> None: ...

class CompletionTokensDetails(_message.Message):
    __slots__ = ("reasoning_tokens",)
    REASONING_TOKENS_FIELD_NUMBER: _ClassVar[int]
    reasoning_tokens: int
    def __init__(self, reasoning_tokens: _Optional[int] = ...) -> None: ...

class OpenAIError(_message.Message):
    __slots__ = ("message", "type", "param", "code")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    message: str
    type: str
    param: str
    code: str
    def __init__(self, message: _Optional[str] = ..., type: _Optional[str] = ..., param: _Optional[str] = ..., code: _Optional[str] = ...) -> None: ...

class ChatCompletionMessage(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "reasoning")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ChatCompletionMessageToolCall]
    reasoning: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ChatCompletionMessageToolCall, _Mapping]]] = ..., reasoning: _Optional[str] = ...) -> None: ...

class ResponseFormat(_message.Message):
    __slots__ = ("type", "json_schema")
    TYPE_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    type: str
    json_schema: JsonSchemaFormat
    def __init__(self, type: _Optional[str] = ..., json_schema: _Optional[_Union[JsonSchemaFormat, _Mapping]] = ...) -> None: ...

class JsonSchemaFormat(_message.Message):
    __slots__ = ("name", "description", "schema", "strict")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_FIELD_NUMBER: _ClassVar[int]
    STRICT_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    schema: _struct_pb2.Struct
    strict: bool
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., schema: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., strict: _Optional[bool] = ...) -> None: ...

class StructuredOutputsRequest(_message.Message):
    __slots__ = ("json", "regex", "choice", "grammar", "json_object")
    JSON_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    CHOICE_FIELD_NUMBER: _ClassVar[int]
    GRAMMAR_FIELD_NUMBER: _ClassVar[int]
    JSON_OBJECT_FIELD_NUMBER: _ClassVar[int]
    json: _struct_pb2.Value
    regex: str
    choice: _containers.RepeatedScalarFieldContainer[str]
    grammar: str
    json_object: bool
    def __init__(self, json: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., regex: _Optional[str] = ..., choice: _Optional[_Iterable[str]] = ..., grammar: _Optional[str] = ..., json_object: _Optional[bool] = ...) -> None: ...

class ChatCompletionTopLogprob(_message.Message):
    __slots__ = ("token", "logprob", "bytes")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    token: str
    logprob: float
    bytes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, token: _Optional[str] = ..., logprob: _Optional[float] = ..., bytes: _Optional[_Iterable[int]] = ...) -> None: ...

class ChatCompletionTokenLogprob(_message.Message):
    __slots__ = ("token", "logprob", "bytes", "top_logprobs")
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    token: str
    logprob: float
    bytes: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedCompositeFieldContainer[ChatCompletionTopLogprob]
    def __init__(self, token: _Optional[str] = ..., logprob: _Optional[float] = ..., bytes: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[_Union[ChatCompletionTopLogprob, _Mapping]]] = ...) -> None: ...

class ChatCompletionLogprobs(_message.Message):
    __slots__ = ("content",)
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    content: _containers.RepeatedCompositeFieldContainer[ChatCompletionTokenLogprob]
    def __init__(self, content: _Optional[_Iterable[_Union[ChatCompletionTokenLogprob, _Mapping]]] = ...) -> None: ...

class ChatCompletionChoice(_message.Message):
    __slots__ = ("index", "message", "finish_reason", "logprobs")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    index: int
    message: ChatCompletionMessage
    finish_reason: str
    logprobs: ChatCompletionLogprobs
    def __init__(self, index: _Optional[int] = ..., message: _Optional[_Union[ChatCompletionMessage, _Mapping]] = ..., finish_reason: _Optional[str] = ..., logprobs: _Optional[_Union[ChatCompletionLogprobs, _Mapping]] = ...) -> None: ...

class CacheInfo(_message.Message):
    __slots__ = ("kind", "age_s", "similarity")
    KIND_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    kind: str
    age_s: float
    similarity: float
    def __init__(self, kind: _Optional[str] = ..., age_s: _Optional[float] = ..., similarity: _Optional[float] = ...) -> None: ...

class ChatCompletion(_message.Message):
    __slots__ = ("id", "object", "created", "model", "choices", "usage", "cache", "system_fingerprint")
    ID_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    id: str
    object: str
    created: int
    model: str
    choices: _containers.RepeatedCompositeFieldContainer[ChatCompletionChoice]
    usage: CompletionUsage
    cache: CacheInfo
    system_fingerprint: str
    def __init__(self, id: _Optional[str] = ..., object: _Optional[str] = ..., created: _Optional[int] = ..., model: _Optional[str] = ..., choices: _Optional[_Iterable[_Union[ChatCompletionChoice, _Mapping]]] = ..., usage: _Optional[_Union[CompletionUsage, _Mapping]] = ..., cache: _Optional[_Union[CacheInfo, _Mapping]] = ..., system_fingerprint: _Optional[str] = ...) -> None: ...

class ChatCompletionDelta(_message.Message):
    __slots__ = ("role", "content", "tool_calls", "reasoning")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    REASONING_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    tool_calls: _containers.RepeatedCompositeFieldContainer[ChatCompletionDeltaToolCall]
    reasoning: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ..., tool_calls: _Optional[_Iterable[_Union[ChatCompletionDeltaToolCall, _Mapping]]] = ..., reasoning: _Optional[str] = ...) -> None: ...

class ChatCompletionDeltaToolCall(_message.Message):
    __slots__ = ("index", "id", "type", "function")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    FUNCTION_FIELD_NUMBER: _ClassVar[int]
    index: int
    id: str
    type: str
    function: FunctionCallDelta
    def __init__(self, index: _Optional[int] = ..., id: _Optional[str] = ..., type: _Optional[str] = ..., function: _Optional[_Union[FunctionCallDelta, _Mapping]] = ...) -> None: ...

class FunctionCallDelta(_message.Message):
    __slots__ = ("name", "arguments")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    arguments: str
    def __init__(self, name: _Optional[str] = ..., arguments: _Optional[str] = ...) -> None: ...

class ChatCompletionChunkChoice(_message.Message):
    __slots__ = ("index", "delta", "finish_reason", "logprobs")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    index: int
    delta: ChatCompletionDelta
    finish_reason: str
    logprobs: ChatCompletionLogprobs
    def __init__(self, index: _Optional[int] = ..., delta: _Optional[_Union[ChatCompletionDelta, _Mapping]] = ..., finish_reason: _Optional[str] = ..., logprobs: _Optional[_Union[ChatCompletionLogprobs, _Mapping]] = ...) -> None: ...

class ChatCompletionChunk(_message.Message):
    __slots__ = ("id", "object", "created", "model", "choices", "usage", "error", "cache", "system_fingerprint")
    ID_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    id: str
    object: str
    created: int
    model: str
    choices: _containers.RepeatedCompositeFieldContainer[ChatCompletionChunkChoice]
    usage: CompletionUsage
    error: OpenAIError
    cache: CacheInfo
    system_fingerprint: str
    def __init__(self, id: _Optional[str] = ..., object: _Optional[str] = ..., created: _Optional[int] = ..., model: _Optional[str] = ..., choices: _Optional[_Iterable[_Union[ChatCompletionChunkChoice, _Mapping]]] = ..., usage: _Optional[_Union[CompletionUsage, _Mapping]] = ..., error: _Optional[_Union[OpenAIError, _Mapping]] = ..., cache: _Optional[_Union[CacheInfo, _Mapping]] = ..., system_fingerprint: _Optional[str] = ...) -> None: ...

class CompletionLogprobs(_message.Message):
    __slots__ = ("text_offset", "token_logprobs", "tokens", "top_logprobs")
    TEXT_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    text_offset: _containers.RepeatedScalarFieldContainer[int]
    token_logprobs: _containers.RepeatedScalarFieldContainer[float]
    tokens: _containers.RepeatedScalarFieldContainer[str]
    top_logprobs: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    def __init__(self, text_offset: _Optional[_Iterable[int]] = ..., token_logprobs: _Optional[_Iterable[float]] = ..., tokens: _Optional[_Iterable[str]] = ..., top_logprobs: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ...) -> None: ...

class CompletionChoice(_message.Message):
    __slots__ = ("index", "text", "finish_reason", "logprobs")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    index: int
    text: str
    finish_reason: str
    logprobs: CompletionLogprobs
    def __init__(self, index: _Optional[int] = ..., text: _Optional[str] = ..., finish_reason: _Optional[str] = ..., logprobs: _Optional[_Union[CompletionLogprobs, _Mapping]] = ...) -> None: ...

class Completion(_message.Message):
    __slots__ = ("id", "object", "created", "model", "choices", "usage", "error", "cache", "system_fingerprint")
    ID_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    SYSTEM_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    id: str
    object: str
    created: int
    model: str
    choices: _containers.RepeatedCompositeFieldContainer[CompletionChoice]
    usage: CompletionUsage
    error: OpenAIError
    cache: CacheInfo
    system_fingerprint: str
    def __init__(self, id: _Optional[str] = ..., object: _Optional[str] = ..., created: _Optional[int] = ..., model: _Optional[str] = ..., choices: _Optional[_Iterable[_Union[CompletionChoice, _Mapping]]] = ..., usage: _Optional[_Union[CompletionUsage, _Mapping]] = ..., error: _Optional[_Union[OpenAIError, _Mapping]] = ..., cache: _Optional[_Union[CacheInfo, _Mapping]] = ..., system_fingerprint: _Optional[str] = ...) -> None: ...

class ListModelsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RetrieveModelRequest(_message.Message):
    __slots__ = ("model",)
    MODEL_FIELD_NUMBER: _ClassVar[int]
    model: str
    def __init__(self, model: _Optional[str] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthStatus(_message.Message):
    __slots__ = ("status", "workers")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    status: str
    workers: int
    def __init__(self, status: _Optional[str] = ..., workers: _Optional[int] = ...) -> None: ...

class Model(_message.Message):
    __slots__ = ("id", "object", "created", "owned_by", "root", "max_model_len", "permission", "parent")
    ID_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    OWNED_BY_FIELD_NUMBER: _ClassVar[int]
    ROOT_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    PARENT_FIELD_NUMBER: _ClassVar[int]
    id: str
    object: str
    created: int
    owned_by: str
    root: str
    max_model_len: int
    permission: _containers.RepeatedCompositeFieldContainer[ModelPermission]
    parent: str
    def __init__(self, id: _Optional[str] = ..., object: _Optional[str] = ..., created: _Optional[int] = ..., owned_by: _Optional[str] = ..., root: _Optional[str] = ..., max_model_len: _Optional[int] = ..., permission: _Optional[_Iterable[_Union[ModelPermission, _Mapping]]] = ..., parent: _Optional[str] = ...) -> None: ...

class ModelPermission(_message.Message):
    __slots__ = ("id", "object", "created", "allow_create_engine", "allow_sampling", "allow_logprobs", "allow_search_indices", "allow_view", "allow_fine_tuning", "organization", "is_blocking")
    ID_FIELD_NUMBER: _ClassVar[int]
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    ALLOW_CREATE_ENGINE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_SAMPLING_FIELD_NUMBER: _ClassVar[int]
    ALLOW_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_SEARCH_INDICES_FIELD_NUMBER: _ClassVar[int]
    ALLOW_VIEW_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FINE_TUNING_FIELD_NUMBER: _ClassVar[int]
    ORGANIZATION_FIELD_NUMBER: _ClassVar[int]
    IS_BLOCKING_FIELD_NUMBER: _ClassVar[int]
    id: str
    object: str
    created: int
    allow_create_engine: bool
    allow_sampling: bool
    allow_logprobs: bool
    allow_search_indices: bool
    allow_view: bool
    allow_fine_tuning: bool
    organization: str
    is_blocking: bool
    def __init__(self, id: _Optional[str] = ..., object: _Optional[str] = ..., created: _Optional[int] = ..., allow_create_engine: _Optional[bool] = ..., allow_sampling: _Optional[bool] = ..., allow_logprobs: _Optional[bool] = ..., allow_search_indices: _Optional[bool] = ..., allow_view: _Optional[bool] = ..., allow_fine_tuning: _Optional[bool] = ..., organization: _Optional[str] = ..., is_blocking: _Optional[bool] = ...) -> None: ...

class ModelList(_message.Message):
    __slots__ = ("object", "data")
    OBJECT_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    object: str
    data: _containers.RepeatedCompositeFieldContainer[Model]
    def __init__(self, object: _Optional[str] = ..., data: _Optional[_Iterable[_Union[Model, _Mapping]]] = ...) -> None: ...

class LoadLoraAdapterRequest(_message.Message):
    __slots__ = ("lora_name", "lora_path", "base_model_name")
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    LORA_PATH_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    lora_name: str
    lora_path: str
    base_model_name: str
    def __init__(self, lora_name: _Optional[str] = ..., lora_path: _Optional[str] = ..., base_model_name: _Optional[str] = ...) -> None: ...

class UnloadLoraAdapterRequest(_message.Message):
    __slots__ = ("lora_name", "base_model_name")
    LORA_NAME_FIELD_NUMBER: _ClassVar[int]
    BASE_MODEL_NAME_FIELD_NUMBER: _ClassVar[int]
    lora_name: str
    base_model_name: str
    def __init__(self, lora_name: _Optional[str] = ..., base_model_name: _Optional[str] = ...) -> None: ...

class LoraAdapterResponse(_message.Message):
    __slots__ = ("message", "workers")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    message: str
    workers: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, message: _Optional[str] = ..., workers: _Optional[_Iterable[str]] = ...) -> None: ...

class UsageRequest(_message.Message):
    __slots__ = ("tenant",)
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class TenantUsage(_message.Message):
    __slots__ = ("tenant", "answered", "requests", "prompt_tokens", "completion_tokens", "cached_prompt_tokens")
    TENANT_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    answered: str
    requests: int
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    def __init__(self, tenant: _Optional[str] = ..., answered: _Optional[str] = ..., requests: _Optional[int] = ..., prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ...) -> None: ...

class UsageReport(_message.Message):
    __slots__ = ("usage", "shared")
    USAGE_FIELD_NUMBER: _ClassVar[int]
    SHARED_FIELD_NUMBER: _ClassVar[int]
    usage: _containers.RepeatedCompositeFieldContainer[TenantUsage]
    shared: bool
    def __init__(self, usage: _Optional[_Iterable[_Union[TenantUsage, _Mapping]]] = ..., shared: _Optional[bool] = ...) -> None: ...

class TokenizeRequest(_message.Message):
    __slots__ = ("model", "prompt", "messages", "tools", "chat_template_kwargs", "add_generation_prompt", "continue_final_message")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    CHAT_TEMPLATE_KWARGS_FIELD_NUMBER: _ClassVar[int]
    ADD_GENERATION_PROMPT_FIELD_NUMBER: _ClassVar[int]
    CONTINUE_FINAL_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    model: str
    prompt: str
    messages: _containers.RepeatedCompositeFieldContainer[ChatCompletionRequestMessage]
    tools: _containers.RepeatedCompositeFieldContainer[ChatCompletionTool]
    chat_template_kwargs: _struct_pb2.Struct
    add_generation_prompt: bool
    continue_final_message: bool
    def __init__(self, model: _Optional[str] = ..., prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatCompletionRequestMessage, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[ChatCompletionTool, _Mapping]]] = ..., chat_template_kwargs: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ..., add_generation_prompt: _Optional[bool] = ..., continue_final_message: _Optional[bool] = ...) -> None: ...

class TokenizeResponse(_message.Message):
    __slots__ = ("count", "max_model_len", "tokens")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    count: int
    max_model_len: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, count: _Optional[int] = ..., max_model_len: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeRequest(_message.Message):
    __slots__ = ("model", "tokens")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    model: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, model: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class DetokenizeResponse(_message.Message):
    __slots__ = ("prompt",)
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    def __init__(self, prompt: _Optional[str] = ...) -> None: ...

class WatchLoadRequest(_message.Message):
    __slots__ = ("kv_events", "min_interval_s")
    KV_EVENTS_FIELD_NUMBER: _ClassVar[int]
    MIN_INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    kv_events: bool
    min_interval_s: float
    def __init__(self, kv_events: _Optional[bool] = ..., min_interval_s: _Optional[float] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("worker_id", "num_running", "num_waiting", "kv_cache_usage", "prefix_cache_hit_rate", "max_num_seqs", "draining", "sequence", "num_in_flight", "requests_received", "kv", "lora", "active_adapters", "running_adapters", "waiting_adapters")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    NUM_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_RECEIVED_FIELD_NUMBER: _ClassVar[int]
    KV_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    RUNNING_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    WAITING_ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_hit_rate: float
    max_num_seqs: int
    draining: bool
    sequence: int
    num_in_flight: int
    requests_received: int
    kv: KvEvents
    lora: LoraConfig
    active_adapters: _containers.RepeatedScalarFieldContainer[str]
    running_adapters: _containers.RepeatedScalarFieldContainer[str]
    waiting_adapters: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, worker_id: _Optional[str] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., prefix_cache_hit_rate: _Optional[float] = ..., max_num_seqs: _Optional[int] = ..., draining: _Optional[bool] = ..., sequence: _Optional[int] = ..., num_in_flight: _Optional[int] = ..., requests_received: _Optional[int] = ..., kv: _Optional[_Union[KvEvents, _Mapping]] = ..., lora: _Optional[_Union[LoraConfig, _Mapping]] = ..., active_adapters: _Optional[_Iterable[str]] = ..., running_adapters: _Optional[_Iterable[str]] = ..., waiting_adapters: _Optional[_Iterable[str]] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "engine", "model", "tensor_parallel_size", "max_model_len", "block_size", "max_num_seqs", "tokenizer", "kv_events", "tool_call_parser", "weights_id", "reasoning_parser", "lora")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_FIELD_NUMBER: _ClassVar[int]
    KV_EVENTS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALL_PARSER_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_ID_FIELD_NUMBER: _ClassVar[int]
    REASONING_PARSER_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    engine: str
    model: str
    tensor_parallel_size: int
    max_model_len: int
    block_size: int
    max_num_seqs: int
    tokenizer: str
    kv_events: bool
    tool_call_parser: str
    weights_id: str
    reasoning_parser: str
    lora: LoraConfig
    def __init__(self, worker_id: _Optional[str] = ..., engine: _Optional[str] = ..., model: _Optional[str] = ..., tensor_parallel_size: _Optional[int] = ..., max_model_len: _Optional[int] = ..., block_size: _Optional[int] = ..., max_num_seqs: _Optional[int] = ..., tokenizer: _Optional[str] = ..., kv_events: _Optional[bool] = ..., tool_call_parser: _Optional[str] = ..., weights_id: _Optional[str] = ..., reasoning_parser: _Optional[str] = ..., lora: _Optional[_Union[LoraConfig, _Mapping]] = ...) -> None: ...

class LoraAdapter(_message.Message):
    __slots__ = ("name", "path")
    NAME_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    name: str
    path: str
    def __init__(self, name: _Optional[str] = ..., path: _Optional[str] = ...) -> None: ...

class LoraConfig(_message.Message):
    __slots__ = ("adapters", "max_loras", "max_lora_rank", "max_cpu_loras")
    ADAPTERS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORAS_FIELD_NUMBER: _ClassVar[int]
    MAX_LORA_RANK_FIELD_NUMBER: _ClassVar[int]
    MAX_CPU_LORAS_FIELD_NUMBER: _ClassVar[int]
    adapters: _containers.RepeatedCompositeFieldContainer[LoraAdapter]
    max_loras: int
    max_lora_rank: int
    max_cpu_loras: int
    def __init__(self, adapters: _Optional[_Iterable[_Union[LoraAdapter, _Mapping]]] = ..., max_loras: _Optional[int] = ..., max_lora_rank: _Optional[int] = ..., max_cpu_loras: _Optional[int] = ...) -> None: ...

class WatchKvEventsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class KvEvents(_message.Message):
    __slots__ = ("reset", "stored", "removed", "block_size", "sequence")
    RESET_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    reset: bool
    stored: _containers.RepeatedScalarFieldContainer[int]
    removed: _containers.RepeatedScalarFieldContainer[int]
    block_size: int
    sequence: int
    def __init__(self, reset: _Optional[bool] = ..., stored: _Optional[_Iterable[int]] = ..., removed: _Optional[_Iterable[int]] = ..., block_size: _Optional[int] = ..., sequence: _Optional[int] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("generate", "cancel", "trace_context", "batch")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    GENERATE_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    BATCH_FIELD_NUMBER: _ClassVar[int]
    generate: GenerateRequest
    cancel: str
    trace_context: _containers.ScalarMap[str, str]
    batch: _containers.RepeatedCompositeFieldContainer[SessionRequest]
    def __init__(self, generate: _Optional[_Union[GenerateRequest, _Mapping]] = ..., cancel: _Optional[str] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., batch: _Optional[_Iterable[_Union[SessionRequest, _Mapping]]] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("deltas", "errors")
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    ERRORS_FIELD_NUMBER: _ClassVar[int]
    deltas: _containers.RepeatedCompositeFieldContainer[GenerateResponse]
    errors: _containers.RepeatedCompositeFieldContainer[SessionError]
    def __init__(self, deltas: _Optional[_Iterable[_Union[GenerateResponse, _Mapping]]] = ..., errors: _Optional[_Iterable[_Union[SessionError, _Mapping]]] = ...) -> None: ...

class SessionError(_message.Message):
    __slots__ = ("request_id", "code", "message", "param")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARAM_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    code: int
    message: str
    param: str
    def __init__(self, request_id: _Optional[str] = ..., code: _Optional[int] = ..., message: _Optional[str] = ..., param: _Optional[str] = ...) -> None: ...

class PickRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "exclude", "pick_id", "trace_context", "messages", "session_key", "deadline_unix_ms", "adapter", "adapter_loadable", "model")
    class TraceContextEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    PICK_ID_FIELD_NUMBER: _ClassVar[int]
    TRACE_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    MESSAGES_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_FIELD_NUMBER: _ClassVar[int]
    ADAPTER_LOADABLE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: str
    exclude: _containers.RepeatedScalarFieldContainer[str]
    pick_id: int
    trace_context: _containers.ScalarMap[str, str]
    messages: _containers.RepeatedCompositeFieldContainer[ChatMessage]
    session_key: str
    deadline_unix_ms: int
    adapter: str
    adapter_loadable: bool
    model: str
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[str] = ..., exclude: _Optional[_Iterable[str]] = ..., pick_id: _Optional[int] = ..., trace_context: _Optional[_Mapping[str, str]] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., session_key: _Optional[str] = ..., deadline_unix_ms: _Optional[int] = ..., adapter: _Optional[str] = ..., adapter_loadable: _Optional[bool] = ..., model: _Optional[str] = ...) -> None: ...

class PickResponse(_message.Message):
    __slots__ = ("worker_id", "address", "reason", "pick_id", "error_code", "error_message", "predicted_cached_tokens")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PICK_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    reason: str
    pick_id: int
    error_code: int
    error_message: str
    predicted_cached_tokens: int
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., reason: _Optional[str] = ..., pick_id: _Optional[int] = ..., error_code: _Optional[int] = ..., error_message: _Optional[str] = ..., predicted_cached_tokens: _Optional[int] = ...) -> None: ...

class PickBatch(_message.Message):
    __slots__ = ("picks",)
    PICKS_FIELD_NUMBER: _ClassVar[int]
    picks: _containers.RepeatedCompositeFieldContainer[PickRequest]
    def __init__(self, picks: _Optional[_Iterable[_Union[PickRequest, _Mapping]]] = ...) -> None: ...

class PickBatchResponse(_message.Message):
    __slots__ = ("answers",)
    ANSWERS_FIELD_NUMBER: _ClassVar[int]
    answers: _containers.RepeatedCompositeFieldContainer[PickResponse]
    def __init__(self, answers: _Optional[_Iterable[_Union[PickResponse, _Mapping]]] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerState(_message.Message):
    __slots__ = ("worker_id", "address", "healthy", "load", "assigned_unreported", "weights_id", "max_model_len", "model", "lora")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_UNREPORTED_FIELD_NUMBER: _ClassVar[int]
    WEIGHTS_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    LORA_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    healthy: bool
    load: LoadReport
    assigned_unreported: int
    weights_id: str
    max_model_len: int
    model: str
    lora: LoraConfig
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., healthy: _Optional[bool] = ..., load: _Optional[_Union[LoadReport, _Mapping]] = ..., assigned_unreported: _Optional[int] = ..., weights_id: _Optional[str] = ..., max_model_len: _Optional[int] = ..., model: _Optional[str] = ..., lora: _Optional[_Union[LoraConfig, _Mapping]] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerState]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerState, _Mapping]]] = ...) -> None: ...

class WatchFleetRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class FleetUpdate(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerState]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerState, _Mapping]]] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("request", "tenant", "mode", "exact_missed")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    EXACT_MISSED_FIELD_NUMBER: _ClassVar[int]
    request: GenerateRequest
    tenant: str
    mode: str
    exact_missed: bool
    def __init__(self, request: _Optional[_Union[GenerateRequest, _Mapping]] = ..., tenant: _Optional[str] = ..., mode: _Optional[str] = ..., exact_missed: _Optional[bool] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("hit", "kind", "chunks", "age_s", "similarity")
    HIT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    AGE_S_FIELD_NUMBER: _ClassVar[int]
    SIMILARITY_FIELD_NUMBER: _ClassVar[int]
    hit: bool
    kind: str
    chunks: _containers.RepeatedCompositeFieldContainer[GenerateResponse]
    age_s: float
    similarity: float
    def __init__(self, hit: _Optional[bool] = ..., kind: _Optional[str] = ..., chunks: _Optional[_Iterable[_Union[GenerateResponse, _Mapping]]] = ..., age_s: _Optional[float] = ..., similarity: _Optional[float] = ...) -> None: ...

class CacheEntry(_message.Message):
    __slots__ = ("chunks", "stored_at")
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    STORED_AT_FIELD_NUMBER: _ClassVar[int]
    chunks: _containers.RepeatedCompositeFieldContainer[GenerateResponse]
    stored_at: float
    def __init__(self, chunks: _Optional[_Iterable[_Union[GenerateResponse, _Mapping]]] = ..., stored_at: _Optional[float] = ...) -> None: ...

class StoreRequest(_message.Message):
    __slots__ = ("request", "tenant", "chunks", "index_only")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    INDEX_ONLY_FIELD_NUMBER: _ClassVar[int]
    request: GenerateRequest
    tenant: str
    chunks: _containers.RepeatedCompositeFieldContainer[GenerateResponse]
    index_only: bool
    def __init__(self, request: _Optional[_Union[GenerateRequest, _Mapping]] = ..., tenant: _Optional[str] = ..., chunks: _Optional[_Iterable[_Union[GenerateResponse, _Mapping]]] = ..., index_only: _Optional[bool] = ...) -> None: ...

class StoreResponse(_message.Message):
    __slots__ = ("stored", "reason")
    STORED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    stored: bool
    reason: str
    def __init__(self, stored: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...
