"""The interface every worker engine implements (vllm, sim, transformers) and its plain types."""

from __future__ import annotations

import abc
import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from meshserve.services.config import WorkerConfig
from meshserve.services.offload import OFFLOAD_CHARS
from meshserve.services.prompts import OPEN_TURN, TemplateCall
from meshserve.services.validation import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_REPETITION_PENALTY,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_P,
    InvalidRequest,
)
from meshserve.worker.kv_events import KvCacheView


@dataclass(frozen=True)
class Request:
    """One generation request, already validated, as the engine sees it."""

    request_id: str
    prompt: str | None = None                       # a plain prompt, or
    messages: list[dict[str, Any]] | None = None    # chat turns rendered with the chat template
    max_tokens: int = DEFAULT_MAX_TOKENS
    temperature: float = DEFAULT_TEMPERATURE
    top_p: float = DEFAULT_TOP_P
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    stream_interval: int = 1                        # tokens per Delta after the first
    # A stream migrated from a lost worker: the output it had sent, put after the prompt. Counts
    # in max_tokens and in completion_tokens; not streamed again.
    continue_token_ids: list[int] = field(default_factory=list)
    # vLLM's SamplingParams of the same names (validated: services.validation).
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = DEFAULT_REPETITION_PENALTY
    top_k: int = 0                                  # 0: off
    min_p: float = 0.0
    min_tokens: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    logit_bias: dict[int, float] = field(default_factory=dict)
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    logprobs: int | None = None                     # alternatives per token; None: no logprobs
    # Constrained decoding: vLLM's StructuredOutputsParams fields ({"json": schema text}, ...).
    structured_outputs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None       # OpenAI's tools, for the chat template
    chat_template_kwargs: dict[str, Any] | None = None  # more variables for the chat template (vLLM's)
    include_reasoning: bool = True                  # False: a reasoning parser's thinking is dropped
    template_call: TemplateCall = OPEN_TURN         # the assistant's turn opened, or the final message left open
    parse_tool_calls: bool = False                  # tool_choice "auto": find the calls in the output
    priority: int = 0                               # vLLM's: lower is scheduled first
    adapter: str | None = None                      # the LoRA adapter it runs on (its name); None: the base model

    def non_default(self, *names: str) -> list[str]:
        """Those of the fields ``names`` this request sets to other than their default."""
        return [n for n in names if getattr(self, n) != getattr(_DEFAULT_REQUEST, n)]


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log probability and the ``top`` most likely (id, text, logprob) at its
    position, most likely first."""

    token_id: int
    token: str
    logprob: float
    top: list[tuple[int, str, float]] = field(default_factory=list)


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of call ``index``: its first piece has the id and name, any piece may add to its
    arguments (JSON text)."""

    index: int
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True)
class Delta:
    """New output of one request since the previous Delta."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None   # None while running; then "stop", "length", "tool_calls" or "abort"
    prompt_tokens: int = 0
    completion_tokens: int = 0         # total so far
    cached_prompt_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None  # one per token id, when the request asked
    tool_calls: list[ToolCallDelta] = field(default_factory=list)  # parse_tool_calls: calls found
    # A reasoning parser's work (--reasoning-parser): the thinking among this delta's output (not
    # in ``text``), and on the last delta how many generated tokens were thinking.
    reasoning: str = ""
    reasoning_tokens: int = 0

    def then(self, later: Delta) -> Delta:
        """This Delta and the ``later`` one as one (the later one's status and counts)."""
        logprobs = None if self.logprobs is None and later.logprobs is None else \
            [*(self.logprobs or []), *(later.logprobs or [])]
        return replace(later, text=self.text + later.text, token_ids=[*self.token_ids, *later.token_ids],
                       logprobs=logprobs, tool_calls=merge_tool_calls([*self.tool_calls, *later.tool_calls]),
                       reasoning=self.reasoning + later.reasoning)


class Chunker:
    """Groups an engine's Deltas into the chunks a worker sends: the first token at once, then a
    chunk per ``interval`` tokens (the engine may have grouped some already), and the end."""

    def __init__(self, interval: int) -> None:
        self._interval = interval
        self._held: Delta | None = None  # output not sent yet
        self._tokens_sent = False

    def add(self, delta: Delta) -> Delta | None:
        """The chunk to send now, if any."""
        held = delta if self._held is None else self._held.then(delta)
        if self._tokens_sent and len(held.token_ids) < self._interval and delta.finish_reason is None:
            self._held = held
            return None
        self._held = None
        self._tokens_sent = self._tokens_sent or bool(held.token_ids)
        return held

    def rest(self) -> Delta | None:
        """What is still held when the engine stopped without a finish reason."""
        held, self._held = self._held, None
        return held


def merge_tool_calls(deltas: list[ToolCallDelta]) -> list[ToolCallDelta]:
    """Consecutive pieces of the same call as one (its arguments joined in order)."""
    out: list[ToolCallDelta] = []
    for d in deltas:
        if out and out[-1].index == d.index:
            last = out[-1]
            out[-1] = ToolCallDelta(d.index, last.id or d.id, last.name or d.name, last.arguments + d.arguments)
        else:
            out.append(d)
    return out


@dataclass(frozen=True)
class Load:
    """The engine's live load, as reported to the router."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_hit_rate: float = 0.0
    # The LoRA adapters loaded in the engine's slots on the device, least recently used first (the
    # sim); vLLM says only those its running requests use (its vllm:lora_requests_info).
    active_adapters: tuple[str, ...] = ()
    running_adapters: tuple[str, ...] = ()  # of them, those its running requests use
    waiting_adapters: tuple[str, ...] = ()  # adapters whose requests wait for a slot (none runs)


@dataclass(frozen=True)
class LoraInfo:
    """The LoRA adapters an engine serves and its slots for them (vLLM's LoRA settings)."""

    adapters: Mapping[str, str]   # name -> path, as --lora-modules gives them
    max_loras: int                # adapters in one running batch at most (slots)
    max_lora_rank: int
    max_cpu_loras: int            # adapters kept loaded in CPU memory

    @classmethod
    def of(cls, cfg: WorkerConfig) -> LoraInfo | None:
        """A worker's LoRA settings; None when it serves none (--enable-lora off)."""
        if not cfg.enable_lora:
            return None
        return cls(cfg.adapters(), cfg.max_loras, cfg.max_lora_rank, cfg.cpu_loras)


@dataclass(frozen=True)
class EngineInfo:
    engine: str
    model: str
    tensor_parallel_size: int
    max_model_len: int
    block_size: int
    max_num_seqs: int
    tokenizer: str = ""   # what the router tokenizes prompts with ("sim", a path or a name)
    tool_call_parser: str = ""  # vLLM's tool parser for tool_choice "auto"; "" none
    reasoning_parser: str = ""  # vLLM's reasoning parser for chat answers; "" none
    weights_id: str = ""  # what its answers depend on beyond the model's name (worker.weights)
    lora: LoraInfo | None = None  # its LoRA adapters and slots; None: LoRA off

    def adapter(self, model: str) -> str | None:
        """The adapter a request naming ``model`` runs on (None: the base model, named or not);
        UnknownModel when this engine serves no model or adapter of that name."""
        if self.lora is not None and model in self.lora.adapters:
            return model
        if not model or model == self.model:
            return None
        adapters = sorted(self.lora.adapters) if self.lora is not None else []
        raise UnknownModel(f"the model {model!r} does not exist on this worker: it serves {self.model!r}"
                           + (f" and the adapters {', '.join(map(repr, adapters))}" if adapters else ""),
                           param="model")


_DEFAULT_REQUEST = Request(request_id="")


class UnknownModel(InvalidRequest):
    """The request names a model or adapter the engine does not serve (NOT_FOUND)."""


class LoraDisabled(Exception):
    """An adapter change asked of an engine that serves none (LoRA off: FAILED_PRECONDITION)."""


def prompt_chars(request: Request) -> int:
    """About how many characters an engine's chat template and tokenizer go through for
    ``request``: what decides whether its prompt is tokenized off the event loop (services.offload).
    Tools are rendered as JSON by the template: a request with tools counts as a large one."""
    size = len(request.prompt or "")
    for m in request.messages or ():
        size += len(m.get("content") or "")
    return size + OFFLOAD_CHARS if request.tools else size


class PromptTooLong(InvalidRequest):
    """The prompt plus max_tokens does not fit the model's context (INVALID_ARGUMENT)."""


def refuse_unsupported(request: Request, engine: str, *names: str) -> None:
    """Raises InvalidRequest naming the first of the fields ``names`` that ``request`` sets and
    the engine ``engine`` cannot honour."""
    if unsupported := request.non_default(*names):
        raise InvalidRequest(f"'{unsupported[0]}' is not supported by the {engine!r} engine of this worker", param=unsupported[0])


class LoadSignal:
    """Wakes load watchers whenever the engine's load changes. A subscriber has an event of its
    own, so one watcher clearing its wake-up does not hide the change from another."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self._subscribers: set[asyncio.Event] = set()

    def notify(self) -> None:
        self._event.set()
        for event in self._subscribers:
            event.set()

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[asyncio.Event]:
        """An event set on every change while the block runs (set at first: report at once)."""
        event = asyncio.Event()
        event.set()
        self._subscribers.add(event)
        try:
            yield event
        finally:
            self._subscribers.discard(event)

    async def wait(self, timeout: float) -> None:
        """Returns on the next change, or after ``timeout`` seconds."""
        # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that
        # arrives as the wait ends, and a cancelled watcher would then go on forever.
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await self._event.wait()
        self._event.clear()


class Engine(abc.ABC):
    """An inference engine. ``generate`` streams deltas; cancelling its iteration aborts the
    request in the engine and frees its KV cache."""

    info: EngineInfo
    load_signal: LoadSignal
    # What its prefix cache holds, for the router (None: this engine reports no KV events).
    kv_cache: KvCacheView | None = None
    # Changes of the adapters it serves (info.lora.adapters) since it started.
    adapters_version: int = 0
    _adapter_changes: asyncio.Lock | None = None

    @abc.abstractmethod
    async def start(self) -> None:
        """Loads the model; the worker serves only after this returns."""

    @abc.abstractmethod
    def generate(self, request: Request) -> AsyncIterator[Delta]:
        """Streams the request's output. Raises PromptTooLong before the first delta if it
        does not fit. Closing the iterator early (cancellation) aborts the request."""

    @abc.abstractmethod
    def tokenize(self, request: Request) -> list[int]:
        """The prompt token ids ``generate`` would run on for ``request``."""

    @abc.abstractmethod
    def detokenize(self, token_ids: list[int]) -> str:
        """The text of ``token_ids``; raises InvalidRequest for ids the engine cannot decode."""

    @abc.abstractmethod
    def load(self) -> Load:
        """The current load (cheap; called on every report)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Stops the engine and frees its resources."""

    # -- LoRA adapters at run time (vLLM's /v1/load_lora_adapter, /v1/unload_lora_adapter) ----

    async def load_adapter(self, name: str, path: str) -> None:
        """Loads the adapter ``path`` as ``name``, as vLLM's serving layer does: InvalidRequest
        with vLLM's message when the name is empty, the base model's or loaded already, or the
        engine cannot load it (no such folder, a rank above --max-lora-rank); LoraDisabled when
        LoRA is off. The load watchers are told once it is served."""
        self._lora_on()
        if not name or not path:
            raise InvalidRequest("Both 'lora_name' and 'lora_path' must be provided.")
        async with self._adapters_lock():
            if name in self._lora_on().adapters:
                raise InvalidRequest(f"The lora adapter '{name}' has already been loaded.", param="lora_name")
            await self._load_new_adapter(name, path)

    async def ensure_adapter(self, name: str, path: str) -> None:
        """Loads ``path`` as ``name`` unless the engine holds ``name`` already (a request for an
        adapter of the gateway's registry): requests that ask at once wait for one load."""
        if name in self._lora_on().adapters:
            return
        async with self._adapters_lock():
            if name not in self._lora_on().adapters:
                await self._load_new_adapter(name, path)

    async def _load_new_adapter(self, name: str, path: str) -> None:
        """Loads an adapter the engine does not hold (the adapter lock held)."""
        if name == self.info.model:
            raise InvalidRequest(f"The lora adapter '{name}' conflicts with a served base model.", param="lora_name")
        await self._add_adapter(name, path)
        self._set_adapters({**self._lora_on().adapters, name: path})

    async def unload_adapter(self, name: str) -> None:
        """Unloads the adapter ``name``: UnknownModel (vLLM's 404) when it holds none of that name."""
        async with self._adapters_lock():
            lora = self._lora_on()
            if name not in lora.adapters:
                raise UnknownModel(f"The lora adapter '{name}' cannot be found.", param="lora_name")
            await self._remove_adapter(name)
            self._set_adapters({n: p for n, p in lora.adapters.items() if n != name})

    async def _add_adapter(self, name: str, path: str) -> None:
        """The engine's own load of an adapter (InvalidRequest with its reason when it cannot)."""
        raise LoraDisabled(f"the {self.info.engine!r} engine serves no LoRA adapters")

    async def _remove_adapter(self, name: str) -> None:
        raise LoraDisabled(f"the {self.info.engine!r} engine serves no LoRA adapters")

    def _lora_on(self) -> LoraInfo:
        if self.info.lora is None:
            raise LoraDisabled(f"LoRA is off on this {self.info.engine} worker (start it with --enable-lora)")
        return self.info.lora

    def _adapters_lock(self) -> asyncio.Lock:
        # One adapter change at a time: a check and the load it guards are one step.
        if self._adapter_changes is None:
            self._adapter_changes = asyncio.Lock()
        return self._adapter_changes

    def _set_adapters(self, adapters: Mapping[str, str]) -> None:
        assert self.info.lora is not None
        self.info = replace(self.info, lora=replace(self.info.lora, adapters=dict(adapters)))
        self.adapters_version += 1
        self.load_signal.notify()  # load watchers report the change at once

    def adapter_loads(self) -> Mapping[str, int]:
        """How many times each LoRA adapter was brought into a slot since the engine started
        (empty: the engine does not count them)."""
        return {}
