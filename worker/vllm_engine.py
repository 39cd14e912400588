"""The real engine: vLLM v1 ``AsyncLLM`` streaming token deltas, with live load from its
scheduler stats."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import psutil

from meshserve.services.config import DEFAULT_MODEL, WorkerConfig
from meshserve.services.offload import Offload
from meshserve.services.prompts import hf_prompt_ids
from meshserve.services.validation import InvalidRequest
from meshserve.worker.engine import (
    Delta,
    Engine,
    EngineInfo,
    Load,
    LoadSignal,
    LoraInfo,
    PromptTooLong,
    Request,
    TokenLogprob,
    UnknownModel,
    merge_tool_calls,
    prompt_chars,
)
from meshserve.worker.kv_events import KvCacheView
from meshserve.worker.vllm_tools import ParsedStream, ToolCallStream, check_parser, reasoning_parsers
from meshserve.worker.weights import weights_id

log = logging.getLogger(__name__)

CPU_BLOCK_MULTIPLE = 32


def resolve_model(cfg: WorkerConfig) -> tuple[str, str]:
    """(path, served name): the configured model, or one of the project's tiny models (none
    configured: the default one) built on demand; served as --served-model-name says, else
    under the model's own name."""
    from meshserve.worker.tiny_model import TINY_MODELS, ensure_model

    if cfg.model and cfg.model not in TINY_MODELS:
        return cfg.model, cfg.served_model_name or cfg.model
    name = cfg.model or DEFAULT_MODEL
    return str(ensure_model(name=name)), cfg.served_model_name or name


def render_prompt(tokenizer: Any, request: Request) -> list[int]:
    """The request's prompt token ids; chat messages go through the model's chat template."""
    return hf_prompt_ids(tokenizer, request.prompt or "", request.messages, request.tools, request.chat_template_kwargs,
                         request.template_call)


def decode(tokenizer: Any, token_ids: list[int]) -> str:
    """The text of ``token_ids`` (special tokens kept, as vLLM's /detokenize)."""
    if bad := [t for t in token_ids if not 0 <= t < len(tokenizer)]:
        raise InvalidRequest(f"'tokens' holds ids outside the vocabulary of {len(tokenizer)} tokens: {bad[:5]}", param="tokens")
    return tokenizer.decode(token_ids)


def check_fits(num_prompt_tokens: int, max_tokens: int, max_model_len: int) -> None:
    if num_prompt_tokens + max_tokens > max_model_len:
        raise PromptTooLong(
            f"the prompt has {num_prompt_tokens} tokens and 'max_tokens' is {max_tokens}, "
            f"more than the model's context of {max_model_len} tokens",
            param="max_tokens",
        )


def _cpu_thread_binding(tp: int) -> str:
    """VLLM_CPU_OMP_THREADS_BIND for ``tp`` ranks: the CPUs we may use, split in ``tp`` groups."""
    cpus = sorted(os.sched_getaffinity(0))
    per_rank = max(1, len(cpus) // tp)
    groups = [cpus[i * per_rank : (i + 1) * per_rank] or cpus[-1:] for i in range(tp)]
    return "|".join(",".join(map(str, g)) for g in groups)


SMALL_MACHINE_CPUS = 4


def _on_small_machine(setting: str, on: str) -> bool:
    """Whether a small-machine setting (``auto``, ``on`` or its opposite) applies here."""
    if setting == "auto":
        return len(os.sched_getaffinity(0)) <= SMALL_MACHINE_CPUS
    return setting == on


def _each_thread(proc: psutil.Process, action: Callable[[int], None]) -> None:
    """``action(tid)`` for every thread of ``proc``: on Linux CPU affinity and niceness belong to
    threads, and a new thread inherits them from the one that starts it."""
    for thread in proc.threads():
        with contextlib.suppress(ProcessLookupError):  # a thread that just ended
            action(thread.id)


def colocate_engine_core(cores: list[psutil.Process]) -> None:
    """Moves each vLLM engine-core process (our child) onto the CPUs of its model workers (its
    children). On CPU, vLLM pins the workers' OpenMP threads and leaves the engine core on the
    CPUs it reserves for "the scheduler", where it busy-waits (``sched_yield``) for each step's
    result. On a small machine those CPUs are also the only ones left to this worker's API
    process, the gateway and Envoy, and that spinning starves them for seconds at a time
    (measured: a 3 s gap in a token stream and in the load reports, so the router dropped the
    worker). Next to its workers the engine core yields to the model, and the other CPUs stay
    free. ``cores``: the engine-core processes."""
    for core in cores:
        try:
            workers = core.children(recursive=True)
            if not workers:
                continue
            cpus: set[int] = set().union(*(w.cpu_affinity() for w in workers))
            _each_thread(core, lambda tid: os.sched_setaffinity(tid, cpus))
        except psutil.Error as e:  # a process that just ended: nothing to move
            log.warning("could not move the vLLM engine core (pid %d): %s", core.pid, e)
            continue
        log.info("vLLM engine core (pid %d) shares its model workers' CPUs %s", core.pid, sorted(cpus))


ENGINE_NICENESS = 10


def lower_engine_priority(cores: list[psutil.Process]) -> None:
    """Gives every vLLM engine process (``cores`` and their descendants, the model workers) niceness
    ``ENGINE_NICENESS``. On a small CPU machine the model busy-runs its CPU whenever it has
    work, and the processes that feed it (this worker's API process, the gateway, Envoy) get
    what is left: measured on 2 CPUs, runs fell into a mode where the gateway started each
    request ~8 s after Envoy handed it over while vLLM decoded batches of ~5 flat out
    (docs/benchmarks.md, "engine priority"). At a lower priority the model still takes every
    idle cycle, but a request waiting to be served goes first."""
    lowered: list[int] = []
    for core in cores:
        try:
            for proc in (core, *core.children(recursive=True)):
                _each_thread(proc, lambda tid: os.setpriority(os.PRIO_PROCESS, tid, ENGINE_NICENESS))
                lowered.append(proc.pid)
        except psutil.Error as e:  # a process that just ended
            log.warning("could not lower the priority of vLLM engine core %d: %s", core.pid, e)
    log.info("vLLM engine processes %s run at niceness %d", lowered, ENGINE_NICENESS)


class VllmEngine(Engine):
    """vLLM's ``AsyncLLM`` (engine core in a subprocess, continuous batching, prefix caching)."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.load_signal = LoadSignal()
        self._load = Load()
        self._active: set[str] = set()  # request ids submitted to vLLM and not yet over
        self._llm: Any = None
        self.processes: list[psutil.Process] = []  # vLLM's engine cores, once started
        self._tokenizer: Any = None
        self._model_path = ""
        self._kv_events: Any = None  # VllmKvEvents while the engine publishes KV events
        # --reasoning-parser: vLLM's combined parser classes, without and with tool calls
        self._parsers: dict[bool, Any] = {}
        self._lora_requests: dict[str, Any] = {}  # adapter name -> vLLM's LoRARequest
        self._lora_ids = 0  # the last LoRARequest id given (vLLM's ids: unique, from 1)
        # A large prompt is rendered and tokenized off the event loop (the tokenizer is thread-safe
        # for encoding: the loop and this thread may encode at once).
        self._offload = Offload("vllm-tokenizer")
        self.info = EngineInfo(
            engine="vllm",
            model=cfg.served_name(),
            tensor_parallel_size=cfg.tensor_parallel_size,
            max_model_len=cfg.max_model_len,
            block_size=cfg.block_size,
            max_num_seqs=cfg.max_num_seqs,
        )

    async def start(self) -> None:
        from transformers import AutoTokenizer
        from vllm.config import StructuredOutputsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        cfg = self.cfg
        if cfg.tool_call_parser:
            check_parser(cfg.tool_call_parser)  # before minutes of model loading
        self._model_path, served_name = resolve_model(cfg)
        on_cpu = current_platform.is_cpu()
        extra: dict[str, Any] = {}
        block_size = cfg.block_size
        if on_cpu:
            extra["kv_cache_memory_bytes"] = cfg.kv_cache_memory_bytes
            if block_size % CPU_BLOCK_MULTIPLE:
                # vLLM's CPU attention kernel takes blocks of a multiple of 32 tokens only.
                block_size = -(-block_size // CPU_BLOCK_MULTIPLE) * CPU_BLOCK_MULTIPLE
                log.warning("block size %d is not a multiple of %d on CPU; using %d",
                            cfg.block_size, CPU_BLOCK_MULTIPLE, block_size)
        else:
            extra["gpu_memory_utilization"] = cfg.gpu_memory_utilization
            if cfg.swap_space_gib:
                # vLLM v1 has no swap space; its nearest equivalent is KV offloading to CPU memory.
                extra["kv_offloading_size"] = cfg.swap_space_gib
        if cfg.tensor_parallel_size > 1:
            extra["distributed_executor_backend"] = "mp"
            if on_cpu:
                # vLLM's default binding refuses several ranks on one NUMA node.
                binding = _cpu_thread_binding(cfg.tensor_parallel_size)
                os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", binding)
                os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        if cfg.reasoning_parser:  # the engine's structured outputs wait for the thinking to end
            extra["reasoning_parser"] = cfg.reasoning_parser
        if cfg.enable_lora:
            extra.update(enable_lora=True, max_loras=cfg.max_loras, max_lora_rank=cfg.max_lora_rank,
                         max_cpu_loras=cfg.cpu_loras)
        if cfg.kv_events and cfg.enable_prefix_caching:
            from meshserve.worker.vllm_kv_events import VllmKvEvents

            self.kv_cache = KvCacheView(block_size)
            self._kv_events = VllmKvEvents(self.kv_cache)  # listening before the engine publishes
            extra["kv_events_config"] = self._kv_events.config()
        args = AsyncEngineArgs(
            model=self._model_path,
            served_model_name=served_name,
            tensor_parallel_size=cfg.tensor_parallel_size,
            max_model_len=cfg.max_model_len,
            max_num_seqs=cfg.max_num_seqs,
            block_size=block_size,
            enable_prefix_caching=cfg.enable_prefix_caching,
            dtype=cfg.dtype,
            enforce_eager=cfg.enforce_eager,
            scheduling_policy=cfg.scheduling_policy,
            disable_log_stats=False,  # scheduler stats feed our load reports
            # Compact JSON needs a backend that has the option: guidance (llguidance), which also
            # takes the schemas "auto" would hand it when xgrammar cannot.
            structured_outputs_config=StructuredOutputsConfig(backend="guidance", disable_any_whitespace=True)
            if cfg.compact_json else StructuredOutputsConfig(),
            **extra,
        )
        log.info("starting vLLM on %s (tp=%d)", self._model_path, cfg.tensor_parallel_size)
        self._tokenizer = AutoTokenizer.from_pretrained(self._model_path)
        if cfg.reasoning_parser:  # refused now, not after the model has loaded
            self._parsers = reasoning_parsers(cfg.reasoning_parser, cfg.tool_call_parser, self._tokenizer)
        before = {p.pid for p in psutil.Process().children()}
        self._llm = AsyncLLM.from_engine_args(args, stat_loggers=[self._make_stat_logger])
        # The engine-core processes AsyncLLM just started (an embedding process may have others),
        # not multiprocessing's resource tracker, started with the first of them: it is this
        # process's and exits with it, so closing the engine must not wait for it.
        cores = [p for p in psutil.Process().children() if p.pid not in before and not _resource_tracker(p)]
        self.processes = cores
        if on_cpu and _on_small_machine(cfg.engine_core_cpus, on="shared"):
            colocate_engine_core(cores)
        if on_cpu and _on_small_machine(cfg.engine_priority, on="low"):
            lower_engine_priority(cores)
        self.info = EngineInfo(
            engine="vllm",
            model=served_name,
            tensor_parallel_size=cfg.tensor_parallel_size,
            max_model_len=self._llm.model_config.max_model_len,
            block_size=self._llm.vllm_config.cache_config.block_size,
            max_num_seqs=self._llm.vllm_config.scheduler_config.max_num_seqs,
            tokenizer=self._model_path,
            tool_call_parser=cfg.tool_call_parser,
            reasoning_parser=cfg.reasoning_parser,
            weights_id=await weights_id(cfg, self._model_path),
            lora=LoraInfo.of(cfg),
        )
        await self._add_adapters(cfg.adapters())
        if self._kv_events is not None:
            self.kv_cache.block_size = self.info.block_size
            self._kv_events.start()

    async def _add_adapters(self, adapters: dict[str, str]) -> None:
        """Loads every adapter of --lora-modules into the engine, as `vllm serve` does at start: one
        that cannot be loaded (no such folder, a rank above --max-lora-rank) stops the worker now,
        with vLLM's reason, not its first request."""
        from vllm.lora.request import LoRARequest

        for name, path in adapters.items():
            self._lora_ids += 1
            request = LoRARequest(lora_name=name, lora_int_id=self._lora_ids, lora_path=path)
            try:
                await self._llm.add_lora(request)
            except Exception as e:
                await self.close()
                raise ValueError(f"LoRA adapter {name!r} ({path}) cannot be loaded: {e}") from None
            self._lora_requests[name] = request
        if adapters:
            log.info("LoRA adapters: %s", ", ".join(f"{n}={p}" for n, p in adapters.items()))

    async def _add_adapter(self, name: str, path: str) -> None:
        """vLLM's add_lora, which reads and checks the adapter in the engine core; its reason for
        refusing one (no such folder, a rank above --max-lora-rank) is the caller's."""
        from vllm.lora.request import LoRARequest

        self._lora_ids += 1
        request = LoRARequest(lora_name=name, lora_int_id=self._lora_ids, lora_path=path)
        try:
            await self._llm.add_lora(request)
        except Exception as e:
            raise InvalidRequest(str(e), param="lora_path") from None
        self._lora_requests[name] = request
        log.info("LoRA adapter loaded: %s=%s", name, path)

    async def _remove_adapter(self, name: str) -> None:
        # Requests running on it keep their LoRARequest: vLLM loads it again for them if needed.
        request = self._lora_requests.pop(name)
        await self._llm.remove_lora(request.lora_int_id)
        log.info("LoRA adapter unloaded: %s", name)

    def _make_stat_logger(self, vllm_config: Any, engine_index: int) -> Any:
        return _make_load_logger(self, vllm_config, engine_index)

    def _on_scheduler_stats(self, load: Load) -> None:
        if load != self._load:
            self._load = load
            self.load_signal.notify()

    def tokenize(self, request: Request) -> list[int]:
        return render_prompt(self._tokenizer, request)

    def detokenize(self, token_ids: list[int]) -> str:
        return decode(self._tokenizer, token_ids)

    def load(self) -> Load:
        # Scheduler stats arrive with engine steps; after the last request ends (an abort, say)
        # the engine may go idle without another step, leaving the last stats stale. With
        # nothing in the engine, its load is zero whatever the stale stats said.
        if not self._active:
            return Load(prefix_cache_hit_rate=self._load.prefix_cache_hit_rate)
        return self._load

    async def generate(self, request: Request) -> AsyncIterator[Delta]:
        from vllm.inputs import TokensPrompt

        if self._llm is None:
            raise RuntimeError("the engine is not started")
        prompt_ids = await self._offload.run(prompt_chars(request), render_prompt, self._tokenizer, request)
        check_fits(len(prompt_ids), request.max_tokens, self.info.max_model_len)
        continued = request.continue_token_ids  # a migrated stream: its output so far follows the prompt
        # --reasoning-parser: a chat's output goes through vLLM's combined parser (thinking, then
        # the calls of tool_choice "auto" in what follows); a continued stream's output so far is
        # part of what the parser is shown as the prompt.
        parsed = ParsedStream(self._parsers[request.parse_tool_calls], self._tokenizer, request,
                              [*prompt_ids, *continued]) if self._parsers and request.messages else None
        with _refusals_as_invalid():
            params = self._sampling_params(request)
        extra: dict[str, Any] = {}
        if parsed is not None:
            params.skip_special_tokens = parsed.skip_special_tokens
            if request.structured_outputs is not None:  # the constraint starts where the thinking ends
                extra = {"reasoning_ended": parsed.reasoning_ended,
                         "reasoning_parser_kwargs": {"chat_template_kwargs": parsed.chat_template_kwargs}}
        # tool_choice "auto": the output goes through the parser (the worker refused the request
        # if it has none); a migrated stream never asks (the parser's state stayed behind).
        tools = ToolCallStream(self.cfg.tool_call_parser, self._tokenizer, request.tools or []) \
            if request.parse_tool_calls and parsed is None else None
        lora = None
        if request.adapter is not None:
            lora = self._lora_requests.get(request.adapter)
            if lora is None:
                raise UnknownModel(f"the LoRA adapter {request.adapter!r} is not loaded in this engine", param="model")
        completion_tokens = len(continued)
        finished = False
        self._active.add(request.request_id)
        try:
            outputs = self._llm.generate(TokensPrompt(prompt_token_ids=[*prompt_ids, *continued]), params,
                                         request.request_id, priority=request.priority if self.cfg.scheduling_policy == "priority" else 0,
                                         lora_request=lora,
                                         **extra)
            with _refusals_as_invalid(structured=request.structured_outputs is not None):
                async for out in outputs:
                    completion = out.outputs[0]
                    completion_tokens += len(completion.token_ids)
                    finished = out.finished
                    text, calls, reasoning = completion.text, [], ""
                    finish_reason = completion.finish_reason if finished else None
                    if parsed is not None:
                        reasoning, text, calls = parsed.feed(text, list(completion.token_ids), finished)
                        if finished and parsed.called and finish_reason == "stop":
                            finish_reason = "tool_calls"  # as vLLM's server says it
                    elif tools is not None:
                        text, calls = tools.feed(text, list(completion.token_ids))
                        if finished:
                            held, rest = tools.finish()
                            text, calls = text + held, merge_tool_calls([*calls, *rest])
                            if tools.called and finish_reason == "stop":
                                finish_reason = "tool_calls"  # as vLLM's server says it
                    yield Delta(
                        text=text,
                        token_ids=list(completion.token_ids),
                        finish_reason=finish_reason,
                        tool_calls=calls,
                        reasoning=reasoning,
                        reasoning_tokens=parsed.reasoning_tokens() if parsed is not None and finished else 0,
                        prompt_tokens=len(prompt_ids),
                        completion_tokens=completion_tokens,
                        cached_prompt_tokens=min(out.num_cached_tokens or 0, len(prompt_ids)),
                        logprobs=None if request.logprobs is None else
                        _token_logprobs(completion.token_ids, completion.logprobs, request.logprobs),
                    )
        finally:
            self._active.discard(request.request_id)
            if not finished:
                # Closed early (the client went away): free the request's KV blocks now. Shielded:
                # a second cancellation of this task must not skip the abort. vLLM's own
                # generator aborts as well when closed; abort is idempotent.
                await asyncio.shield(self._llm.abort(request.request_id))
                log.debug("request %s aborted", request.request_id)
            self.load_signal.notify()

    @staticmethod
    def _sampling_params(request: Request) -> Any:
        from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

        continued = request.continue_token_ids
        return SamplingParams(
            max_tokens=request.max_tokens - len(continued),
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
            stop=list(request.stop) or None,
            ignore_eos=request.ignore_eos,
            output_kind=RequestOutputKind.DELTA,
            # vLLM then builds one output per interval, not one per token.
            stream_interval=request.stream_interval if request.stream_interval > 1 else None,
            presence_penalty=request.presence_penalty,
            frequency_penalty=request.frequency_penalty,
            repetition_penalty=request.repetition_penalty,
            top_k=request.top_k,
            min_p=request.min_p,
            # A migrated stream's output so far counts towards its minimum.
            min_tokens=max(0, request.min_tokens - len(continued)),
            stop_token_ids=list(request.stop_token_ids) or None,
            logit_bias=dict(request.logit_bias) or None,
            include_stop_str_in_output=request.include_stop_str_in_output,
            skip_special_tokens=request.skip_special_tokens,
            logprobs=request.logprobs,
            structured_outputs=None if request.structured_outputs is None
            else StructuredOutputsParams(**request.structured_outputs),
        )

    async def close(self) -> None:
        """Shuts vLLM down and returns once its engine processes are gone (vLLM's shutdown may
        return while an engine core is still exiting: a second engine started in the same
        process then saw two)."""
        if self._llm is not None:
            family = list(self.processes)
            for proc in self.processes:
                with contextlib.suppress(psutil.Error):
                    family += proc.children(recursive=True)  # model workers (tensor parallel)
            self._llm.shutdown()
            self._llm = None
            await asyncio.to_thread(_reap, family)
            self.processes = []
        if self._kv_events is not None:
            await self._kv_events.close()
            self._kv_events = None
        self._offload.close()


@contextlib.contextmanager
def _refusals_as_invalid(structured: bool = False) -> Iterator[None]:
    """vLLM's own request checks (those that need the model, such as token ids outside the
    vocabulary, raise VLLMValidationError when the request is added) as InvalidRequest, naming
    the field. ``structured``: the request has a constraint, whose backend (xgrammar, guidance)
    refuses one it cannot compile with a plain ValueError."""
    from vllm.exceptions import VLLMValidationError

    try:
        yield
    except VLLMValidationError as e:
        field = getattr(e, "parameter", None) or ("structured_outputs" if structured else None)
        raise InvalidRequest(f"'{field}': {e}" if field else str(e), param=field) from None
    except ValueError as e:
        if not structured:
            raise
        raise InvalidRequest(f"'structured_outputs': the engine's structured-output backend refused it: {e}", param="structured_outputs") from None


LOGPROB_FLOOR = -9999.0  # vLLM's serving layer prints -inf as this (JSON has no -inf)


def _token_logprobs(token_ids: Any, positions: Any, num_top: int) -> list[TokenLogprob]:
    """vLLM's per-position ``{token id: Logprob}`` (the sampled token and the ``num_top`` most
    likely) as TokenLogprobs, alternatives by rank."""
    out: list[TokenLogprob] = []
    for token_id, position in zip(token_ids, positions or (), strict=False):
        chosen = position[token_id]
        top = sorted(((lp.rank or 0, tid, lp) for tid, lp in position.items() if lp.rank and lp.rank <= num_top),
                     key=lambda r: r[0])
        out.append(TokenLogprob(
            token_id=token_id, token=chosen.decoded_token or "", logprob=max(chosen.logprob, LOGPROB_FLOOR),
            top=[(tid, lp.decoded_token or "", max(lp.logprob, LOGPROB_FLOOR)) for _, tid, lp in top[:num_top]],
        ))
    return out


def _resource_tracker(proc: psutil.Process) -> bool:
    """Whether ``proc`` is Python multiprocessing's resource tracker (it runs ``-c "from
    multiprocessing.resource_tracker import main; ..."``)."""
    try:
        return any("multiprocessing.resource_tracker" in arg for arg in proc.cmdline())
    except psutil.Error:
        return False


def _reap(processes: list[psutil.Process], timeout_s: float = 10.0) -> None:
    """Waits for ``processes`` to exit (reaping those that are ours), killing what outlives
    ``timeout_s``."""
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for proc in alive:
        log.warning("vLLM process %d outlived its shutdown by %.0f s; killing it", proc.pid, timeout_s)
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=timeout_s)


def _make_load_logger(engine: VllmEngine, vllm_config: Any, engine_index: int) -> Any:
    """A vLLM stat logger that turns every step's scheduler stats into the engine's Load."""
    from vllm.v1.metrics.loggers import StatLoggerBase
    from vllm.v1.metrics.stats import CachingMetrics

    class LoadStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.prefix_cache = CachingMetrics()

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None,
                   engine_idx: int = 0) -> None:
            if scheduler_stats is None:
                return
            self.prefix_cache.observe(scheduler_stats.prefix_cache_stats)
            running = tuple(sorted(name for name, n in scheduler_stats.running_lora_adapters.items() if n))
            engine._on_scheduler_stats(Load(
                num_running=scheduler_stats.num_running_reqs,
                num_waiting=scheduler_stats.num_waiting_reqs + scheduler_stats.num_skipped_waiting_reqs,
                kv_cache_usage=scheduler_stats.kv_cache_usage,
                prefix_cache_hit_rate=self.prefix_cache.hit_rate,
                # vLLM tells which adapters its running requests use, not which idle ones its
                # slots still hold (the same names as its vllm:lora_requests_info gauge).
                active_adapters=running, running_adapters=running,
                waiting_adapters=tuple(sorted(
                    name for name, n in scheduler_stats.waiting_lora_adapters.items() if n and name not in running)),
            ))

        def log_engine_initialized(self) -> None:
            pass

    return LoadStatLogger(vllm_config, engine_index)

