from google.api import annotations_pb2 as _annotations_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ChatMessage(_message.Message):
    __slots__ = ("role", "content")
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    role: str
    content: str
    def __init__(self, role: _Optional[str] = ..., content: _Optional[str] = ...) -> None: ...

class GenerateRequest(_message.Message):
    __slots__ = ("prompt", "messages", "max_tokens", "temperature", "top_p", "seed", "stop", "ignore_eos", "request_id", "skip_cache", "model")
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
    def __init__(self, prompt: _Optional[str] = ..., messages: _Optional[_Iterable[_Union[ChatMessage, _Mapping]]] = ..., max_tokens: _Optional[int] = ..., temperature: _Optional[float] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., stop: _Optional[_Iterable[str]] = ..., ignore_eos: _Optional[bool] = ..., request_id: _Optional[str] = ..., skip_cache: _Optional[bool] = ..., model: _Optional[str] = ...) -> None: ...

class Usage(_message.Message):
    __slots__ = ("prompt_tokens", "completion_tokens", "cached_prompt_tokens")
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    COMPLETION_TOKENS_FIELD_NUMBER: _ClassVar[int]
    CACHED_PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    def __init__(self, prompt_tokens: _Optional[int] = ..., completion_tokens: _Optional[int] = ..., cached_prompt_tokens: _Optional[int] = ...) -> None: ...

class GenerateResponse(_message.Message):
    __slots__ = ("request_id", "text", "token_ids", "finish_reason", "usage", "cached", "worker")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    usage: Usage
    cached: bool
    worker: str
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., cached: _Optional[bool] = ..., worker: _Optional[str] = ...) -> None: ...

class CompleteResponse(_message.Message):
    __slots__ = ("request_id", "text", "token_ids", "finish_reason", "usage", "cached", "worker")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    USAGE_FIELD_NUMBER: _ClassVar[int]
    CACHED_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    text: str
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    finish_reason: str
    usage: Usage
    cached: bool
    worker: str
    def __init__(self, request_id: _Optional[str] = ..., text: _Optional[str] = ..., token_ids: _Optional[_Iterable[int]] = ..., finish_reason: _Optional[str] = ..., usage: _Optional[_Union[Usage, _Mapping]] = ..., cached: _Optional[bool] = ..., worker: _Optional[str] = ...) -> None: ...

class WatchLoadRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("worker_id", "num_running", "num_waiting", "kv_cache_usage", "prefix_cache_hit_rate", "max_num_seqs", "draining", "sequence", "num_in_flight")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_RUNNING_FIELD_NUMBER: _ClassVar[int]
    NUM_WAITING_FIELD_NUMBER: _ClassVar[int]
    KV_CACHE_USAGE_FIELD_NUMBER: _ClassVar[int]
    PREFIX_CACHE_HIT_RATE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    DRAINING_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    NUM_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    num_running: int
    num_waiting: int
    kv_cache_usage: float
    prefix_cache_hit_rate: float
    max_num_seqs: int
    draining: bool
    sequence: int
    num_in_flight: int
    def __init__(self, worker_id: _Optional[str] = ..., num_running: _Optional[int] = ..., num_waiting: _Optional[int] = ..., kv_cache_usage: _Optional[float] = ..., prefix_cache_hit_rate: _Optional[float] = ..., max_num_seqs: _Optional[int] = ..., draining: _Optional[bool] = ..., sequence: _Optional[int] = ..., num_in_flight: _Optional[int] = ...) -> None: ...

class InfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerInfo(_message.Message):
    __slots__ = ("worker_id", "engine", "model", "tensor_parallel_size", "max_model_len", "block_size", "max_num_seqs")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    TENSOR_PARALLEL_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_MODEL_LEN_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_NUM_SEQS_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    engine: str
    model: str
    tensor_parallel_size: int
    max_model_len: int
    block_size: int
    max_num_seqs: int
    def __init__(self, worker_id: _Optional[str] = ..., engine: _Optional[str] = ..., model: _Optional[str] = ..., tensor_parallel_size: _Optional[int] = ..., max_model_len: _Optional[int] = ..., block_size: _Optional[int] = ..., max_num_seqs: _Optional[int] = ...) -> None: ...

class PickRequest(_message.Message):
    __slots__ = ("request_id", "prompt", "exclude")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    EXCLUDE_FIELD_NUMBER: _ClassVar[int]
    request_id: str
    prompt: str
    exclude: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, request_id: _Optional[str] = ..., prompt: _Optional[str] = ..., exclude: _Optional[_Iterable[str]] = ...) -> None: ...

class PickResponse(_message.Message):
    __slots__ = ("worker_id", "address", "reason")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    reason: str
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class ListWorkersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class WorkerState(_message.Message):
    __slots__ = ("worker_id", "address", "healthy", "load", "assigned_unreported")
    WORKER_ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    HEALTHY_FIELD_NUMBER: _ClassVar[int]
    LOAD_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_UNREPORTED_FIELD_NUMBER: _ClassVar[int]
    worker_id: str
    address: str
    healthy: bool
    load: LoadReport
    assigned_unreported: int
    def __init__(self, worker_id: _Optional[str] = ..., address: _Optional[str] = ..., healthy: _Optional[bool] = ..., load: _Optional[_Union[LoadReport, _Mapping]] = ..., assigned_unreported: _Optional[int] = ...) -> None: ...

class ListWorkersResponse(_message.Message):
    __slots__ = ("workers",)
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    workers: _containers.RepeatedCompositeFieldContainer[WorkerState]
    def __init__(self, workers: _Optional[_Iterable[_Union[WorkerState, _Mapping]]] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ("request", "tenant")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    request: GenerateRequest
    tenant: str
    def __init__(self, request: _Optional[_Union[GenerateRequest, _Mapping]] = ..., tenant: _Optional[str] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ("hit", "kind", "chunks")
    HIT_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    hit: bool
    kind: str
    chunks: _containers.RepeatedCompositeFieldContainer[GenerateResponse]
    def __init__(self, hit: _Optional[bool] = ..., kind: _Optional[str] = ..., chunks: _Optional[_Iterable[_Union[GenerateResponse, _Mapping]]] = ...) -> None: ...

class StoreRequest(_message.Message):
    __slots__ = ("request", "tenant", "chunks")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    request: GenerateRequest
    tenant: str
    chunks: _containers.RepeatedCompositeFieldContainer[GenerateResponse]
    def __init__(self, request: _Optional[_Union[GenerateRequest, _Mapping]] = ..., tenant: _Optional[str] = ..., chunks: _Optional[_Iterable[_Union[GenerateResponse, _Mapping]]] = ...) -> None: ...

class StoreResponse(_message.Message):
    __slots__ = ("stored", "reason")
    STORED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    stored: bool
    reason: str
    def __init__(self, stored: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...
