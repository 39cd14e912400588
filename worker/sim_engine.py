"""The ``sim`` engine: a latency-faithful simulation of vLLM's continuous batching, for load-testing
the mesh at scale without GPUs (no model, no tokenizer; same Engine interface and load reports).

How one engine step is simulated (one scheduler task, like vLLM v1's ``EngineCore`` loop):

1. Running requests, oldest first, get the KV slots for the token they decode this step. When the
   block pool is exhausted a running request is preempted: its blocks are freed and it goes back
   to the waiting queue, to be recomputed later (vLLM's "recompute" preemption; its output so far
   is kept and its token stream is unchanged). Which one, and the waiting queue's order, follow
   ``scheduling_policy`` as vLLM's scheduler does: ``fcfs`` preempts the newest and puts it at the
   front of the queue, which is in arrival order; ``priority`` preempts the one with the highest
   (priority, arrival) and keeps the queue ordered by (priority, arrival): lower priority first.
2. The step's token budget (``sim_max_num_batched_tokens``, vLLM v1's ``max_num_batched_tokens``:
   8,192, its default for an API server on an H100) goes first to the running requests: one
   token for each that decodes, then the next chunk of each prompt still being prefilled.
   Waiting requests are then admitted in the queue's order while budget is left, the batch has fewer
   than ``max_num_seqs`` requests and the pool can hold their prompt; the head of the queue
   blocks the rest, as in vLLM. Full ``block_size``-token blocks are looked up in the prefix
   cache by the hash chain of their tokens (unless ``enable_prefix_caching`` is off), so only
   uncached prompt tokens cost prefill time; an admitted prompt gets as much of the budget as
   is left, and the rest of it in the next steps (chunked prefill: a long prompt does not stall
   the running requests for its whole prefill). A budget of 0 is none: every admitted prompt is
   prefilled in one step.
3. The step lasts ``prefill_ms_per_token * prompt tokens computed + itl_base_ms +
   itl_per_seq_ms * batch size`` — one forward pass of the whole batch — with LoRA adapters'
   costs on top (below).
4. Every request of the batch whose prompt is all computed then gets one token. A request
   finishes with "stop" when its text contains one of its stop strings (cut before it, held back
   while it could still be a partial match, like vLLM), else with "length" at ``max_tokens``; the
   simulator never emits EOS.

KV blocks are reference-counted; a full block of a prompt is cached under its hash when the step
that computes it is scheduled (vLLM v1 commits blocks to its prefix cache as it allocates them,
so a request admitted later in the same step reuses them: a burst sharing a prefix computes it
once) and stays cached after its requests finish, until the pool reuses it: unreferenced blocks are evicted
least recently used first (vLLM's free-block queue; a request's blocks are freed tail first).
``kv_cache_usage`` counts referenced blocks only, as vLLM's does.

Parameters (``WorkerConfig.sim_*``) default to published figures for an 8B model in bf16 on one
H100 with vLLM: prefill ~15-17k tokens/s (0.06 ms per uncached token), inter-token latency ~7 ms
for a batch of one rising ~0.05 ms per extra running sequence (~20 ms at 256), and 30k blocks of
16 tokens (~480k tokens of KV cache at 0.9 GPU memory utilisation).

Tokenization is a deterministic stand-in (pieces of up to 4 characters with their leading space,
~4 bytes per token like BPE on English). Output is pseudo-words drawn from a generator seeded by
(``sim_seed``, prompt, request seed), so greedy and seeded requests are reproducible, which the
response cache relies on; unseeded sampling (temperature > 0, no seed) is random.

Sampling: the simulator honours what changes where a request stops (``stop_token_ids``,
``min_tokens``, ``include_stop_str_in_output``) and reports ``logprobs`` from its own
distribution (every word equally likely). Fields that only change which word is drawn
(penalties, ``top_k``, ``min_p``, ``logit_bias``, ``skip_special_tokens``) are accepted and have no
effect: they do not change how long a step takes. A ``structured_outputs`` constraint is refused
(INVALID_ARGUMENT naming it): the simulator cannot make its words match a schema.

LoRA adapters (``--enable-lora``, ``--lora-modules``, ``--max-loras``, ``--max-cpu-loras``) are
modelled as vLLM serves them. A request on an adapter draws its own words, its blocks hash apart
from the base model's and other adapters' (as vLLM's do), and it joins the running batch only
while its adapter runs already or fewer than ``max_loras`` adapters do; until then it waits and
the requests behind it go on, as in vLLM's scheduler. The device has ``max_loras`` slots
(``AdapterSlots``): an adapter stays in its slot after its requests end, and one that is not in
a slot when a request of it is admitted takes a free slot or evicts the least recently used
adapter no running request uses, as vLLM's LRU adapter manager does. Bringing it in makes that
step ``sim_lora_load_ms`` longer, plus ``sim_lora_disk_load_ms`` when it is not among the
``max_cpu_loras`` adapters held in CPU memory (LRU too). At start, as `vllm serve` loads
``--lora-modules`` one after the other, the last ``max_loras`` of them are in the slots and the
last ``max_cpu_loras`` in CPU memory, at no cost. A step whose batch runs adapters costs
``sim_lora_step_overhead`` more, plus ``sim_lora_adapter_ms`` per distinct adapter (vLLM's
punica kernels run beside the base model's and read each adapter's weights).

Time is injected (``clock``, ``sleep``) so tests run the simulation on a fake clock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import random
import time
from collections import Counter, OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Set
from dataclasses import dataclass, field

from meshserve.services.config import SIM_MODEL, WorkerConfig
from meshserve.services.offload import OFFLOAD_CHARS, Offload
from meshserve.services.prompts import (
    SIM_TOKENIZER,
    block_hash,
    chain_root,
    sim_render,
    sim_token_id,
    sim_tokenize,
)
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
    prompt_chars,
    refuse_unsupported,
)
from meshserve.worker.kv_events import KvCacheView

log = logging.getLogger(__name__)

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]

PREFIX_STATS_WINDOW = 1000  # requests in the prefix-cache hit rate, like vLLM's CachingMetrics
# Output words are at most 4 letters, so " word" re-tokenizes to the same single token.
_WORDS = (
    "the of and to in is it that was for on are as with be at one have this from or had by hot "
    "word but what some we can out were all when up use your how said an each she do time if "
    "will way many then them like so her long make see him two has look more day go come did my "
    "no most who over know than call down side been now find any new work part take get made "
    "live back only year came show good me give our name very just form much help low line turn "
    "move same"
).split()


WORD_LOGPROB = -math.log(len(_WORDS))  # the simulator draws every word with the same probability


def _uniform_logprob(at: int, num_top: int) -> TokenLogprob:
    """The logprob of ``_WORDS[at]``: the simulator's true distribution (uniform over its words),
    with ``num_top`` alternatives: the drawn word, then the words after it."""
    words = [" " + _WORDS[(at + i) % len(_WORDS)] for i in range(min(num_top, len(_WORDS)))]
    return TokenLogprob(token_id=sim_token_id(" " + _WORDS[at]), token=" " + _WORDS[at], logprob=WORD_LOGPROB,
                        top=[(sim_token_id(w), w, WORD_LOGPROB) for w in words])


def render_prompt(request: Request) -> str:
    return sim_render(request.prompt or "", request.messages, request.chat_template_kwargs, request.template_call)


def _rendered(request: Request) -> tuple[str, list[int]]:
    """The prompt's text and its token ids (off the event loop for a large prompt)."""
    prompt = render_prompt(request)
    return prompt, sim_tokenize(prompt)


class BlockPool:
    """A vLLM-style pool of KV blocks: reference-counted, full blocks cached by hash, and
    unreferenced blocks reused least recently used first (evicting their cache entry)."""

    def __init__(self, num_blocks: int, view: KvCacheView | None = None) -> None:
        self.num_blocks = num_blocks
        self.evictions = 0
        self._view = view  # told of every block cached and evicted
        self._refs = [0] * num_blocks
        self._hash: list[int | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # LRU first
        self._cached: dict[int, int] = {}  # block hash -> block id

    @property
    def num_free(self) -> int:
        """Blocks that can be allocated now (empty or cached but unreferenced)."""
        return len(self._free)

    def usage(self) -> float:
        return 1.0 - len(self._free) / self.num_blocks

    def cached_prefix(self, hashes: list[int]) -> list[int]:
        """The blocks holding the longest cached prefix of this hash chain."""
        blocks = []
        for h in hashes:
            block = self._cached.get(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def can_take(self, num_new: int, hits: list[int]) -> bool:
        """Whether ``hits`` can be referenced and ``num_new`` blocks allocated besides."""
        reusable_hits = sum(1 for b in hits if self._refs[b] == 0)
        return num_new <= len(self._free) - reusable_hits

    def take(self, hits: list[int], num_new: int) -> list[int]:
        for block in hits:
            if self._refs[block] == 0:
                del self._free[block]
            self._refs[block] += 1
        return hits + [self._allocate() for _ in range(num_new)]

    def _allocate(self) -> int:
        block, _ = self._free.popitem(last=False)
        h = self._hash[block]
        if h is not None:
            del self._cached[h]
            self._hash[block] = None
            self.evictions += 1
            if self._view is not None:
                self._view.removed((h,))
        self._refs[block] = 1
        return block

    def cache(self, block: int, block_hash: int) -> None:
        """Registers a full, computed block; a duplicate of a cached block stays uncached."""
        if block_hash not in self._cached and self._hash[block] is None:
            self._cached[block_hash] = block
            self._hash[block] = block_hash
            if self._view is not None:
                self._view.stored((block_hash,))

    def release(self, blocks: list[int]) -> None:
        # Tail first, so a prompt's last blocks are evicted before its first (they match less often).
        for block in reversed(blocks):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._free[block] = None
                if self._hash[block] is None:
                    self._free.move_to_end(block, last=False)  # nothing cached: reuse it first


class AdapterSlots:
    """vLLM's LoRA adapters on a device: ``max_loras`` slots, and the ``max_cpu_loras`` adapters
    kept in CPU memory, each least recently used first. Counts every adapter brought into a slot."""

    def __init__(self, max_loras: int, max_cpu_loras: int, load_ms: float, disk_load_ms: float,
                 preloaded: Iterable[str] = ()) -> None:
        self.max_loras = max_loras
        self.max_cpu_loras = max_cpu_loras
        self.load_ms = load_ms
        self.disk_load_ms = disk_load_ms
        self.loads: Counter[str] = Counter()       # brought into a slot
        self.disk_loads: Counter[str] = Counter()  # of them, read from disk first
        self._device: OrderedDict[str, None] = OrderedDict()
        self._cpu: OrderedDict[str, None] = OrderedDict()
        for name in preloaded:  # `vllm serve` loads --lora-modules in turn at start
            self._keep(self._cpu, name, self.max_cpu_loras)
            self._keep(self._device, name, self.max_loras)

    @property
    def active(self) -> tuple[str, ...]:
        """The adapters in the slots, least recently used first."""
        return tuple(self._device)

    def bring(self, adapter: str, busy: Set[str]) -> float:
        """Puts ``adapter`` in a slot, evicting the least recently used adapter not in ``busy``
        (those running requests use) when every slot is taken; the ms it costs. The scheduler
        calls it only when fewer than ``max_loras`` adapters are busy, so one can be evicted."""
        if adapter in self._device:
            self._device.move_to_end(adapter)
            return 0.0
        if len(self._device) >= self.max_loras:
            del self._device[next(a for a in self._device if a not in busy)]
        ms = self.load_ms
        if adapter not in self._cpu:
            ms += self.disk_load_ms
            self.disk_loads[adapter] += 1
        self._keep(self._cpu, adapter, self.max_cpu_loras)
        self._device[adapter] = None
        self.loads[adapter] += 1
        return ms

    def added(self, name: str) -> None:
        """An adapter loaded at run time: read into CPU memory (a slot takes it when it runs)."""
        self._keep(self._cpu, name, self.max_cpu_loras)

    def forget(self, name: str) -> None:
        """An adapter unloaded at run time: out of CPU memory, its slot free."""
        self._cpu.pop(name, None)
        self._device.pop(name, None)

    def used(self, adapters: Iterable[str]) -> None:
        """Marks the adapters a step ran as the most recently used."""
        for adapter in adapters:
            if adapter in self._device:
                self._device.move_to_end(adapter)

    @staticmethod
    def _keep(lru: OrderedDict[str, None], name: str, capacity: int) -> None:
        lru[name] = None
        lru.move_to_end(name)
        while len(lru) > capacity:
            lru.popitem(last=False)


class _Collector:
    """A request's unread output: merges deltas the reader has not taken yet (like vLLM's
    RequestOutputCollector), so a slow reader never makes it grow."""

    def __init__(self) -> None:
        self._delta: Delta | None = None
        self._ready = asyncio.Event()

    def put(self, delta: Delta) -> None:
        if self._delta is not None:
            delta = Delta(
                text=self._delta.text + delta.text,
                token_ids=self._delta.token_ids + delta.token_ids,
                finish_reason=delta.finish_reason,
                prompt_tokens=delta.prompt_tokens,
                completion_tokens=delta.completion_tokens,
                cached_prompt_tokens=delta.cached_prompt_tokens,
            )
        self._delta = delta
        self._ready.set()

    async def get(self) -> Delta:
        await self._ready.wait()
        self._ready.clear()
        delta, self._delta = self._delta, None
        assert delta is not None
        return delta


@dataclass(eq=False)
class _Seq:
    """One request inside the simulator."""

    request: Request
    prompt_ids: list[int]
    rng: random.Random
    out: _Collector = field(default_factory=_Collector)
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    sent_chars: int = 0
    blocks: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)  # hash chain of the full blocks so far
    num_cached_blocks: int = 0          # blocks of ``blocks`` registered in the prefix cache
    cached_prompt_tokens: int = 0
    prefill_left: int = 0               # prompt tokens to compute before its next token (0: decoding)
    chunk: int = 0                      # of them, computed in the step being run
    scheduled_once: bool = False
    finish_reason: str | None = None
    arrival: int = 0                    # its place in arrival order (the queue's tie-break)

    @property
    def order(self) -> tuple[int, int]:
        """Its place in a priority-ordered queue: lower priority first, then earlier arrival."""
        return self.request.priority, self.arrival

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def tokens(self, start: int, end: int) -> list[int]:
        n = len(self.prompt_ids)
        if end <= n:
            return self.prompt_ids[start:end]
        return self.prompt_ids[start:] + self.output_ids[max(0, start - n) : end - n]


class SimEngine(Engine):
    """Simulates a vLLM engine's scheduling and latency; see the module docstring."""

    def __init__(
        self, cfg: WorkerConfig, clock: Clock = time.monotonic, sleep: Sleep = asyncio.sleep,
        offload_chars: int = OFFLOAD_CHARS,
    ) -> None:
        self.info = EngineInfo(
            engine="sim",
            model=cfg.served_model_name or cfg.model or SIM_MODEL,
            tensor_parallel_size=cfg.tensor_parallel_size,
            max_model_len=cfg.max_model_len,
            block_size=cfg.block_size,
            max_num_seqs=cfg.max_num_seqs,
            tokenizer=SIM_TOKENIZER,
            weights_id=cfg.weights_id,  # none of its own: its answers depend on no files
            lora=LoraInfo.of(cfg),
        )
        if 0 < cfg.sim_max_num_batched_tokens < cfg.max_num_seqs:
            raise ValueError(
                f"--sim-max-num-batched-tokens ({cfg.sim_max_num_batched_tokens}) must be 0 (no budget) or at "
                f"least --max-num-seqs ({cfg.max_num_seqs}): every running request decodes a token each step")
        self.load_signal = LoadSignal()
        self.kv_cache = KvCacheView(cfg.block_size) if cfg.kv_events and cfg.enable_prefix_caching else None
        self._cfg = cfg
        self._clock = clock
        self._sleep = sleep
        self._block_size = cfg.block_size
        self._pool = BlockPool(cfg.sim_num_kv_blocks, self.kv_cache)
        lora = self.info.lora
        self._slots = None if lora is None else AdapterSlots(
            lora.max_loras, lora.max_cpu_loras, cfg.sim_lora_load_ms, cfg.sim_lora_disk_load_ms, lora.adapters)
        self._waiting: deque[_Seq] = deque()  # in arrival order, or by (priority, arrival)
        self._arrivals = 0
        self._by_priority = cfg.scheduling_policy == "priority"
        self._running: list[_Seq] = []  # in admission order: the last is preempted first
        self._live: set[_Seq] = set()   # every request not finished, wherever it is
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._prefix_window: deque[tuple[int, int]] = deque()  # (prompt tokens, cached tokens)
        self._prefix_queries = 0
        self._prefix_hits = 0
        self._last_load = Load()
        self.num_preemptions = 0
        # A prompt of ``offload_chars`` or more is tokenized off the event loop (a test on a fake
        # clock keeps every prompt on it: the thread's time is not the clock's).
        self._offload = Offload("sim-tokenizer", offload_chars)

    # -- Engine interface ------------------------------------------------------------------

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sim-engine")
        log.info(
            "sim engine: %d KV blocks of %d tokens, max_num_seqs %d, %s tokens a step, "
            "prefill %.3f ms/token, ITL %.2f + %.3f ms/seq, speed x%.2f",
            self._pool.num_blocks, self._block_size, self._cfg.max_num_seqs,
            self._cfg.sim_max_num_batched_tokens or "no budget of",
            self._cfg.sim_prefill_ms_per_token, self._cfg.sim_itl_base_ms, self._cfg.sim_itl_per_seq_ms,
            self._cfg.sim_speed,
        )

    async def generate(self, request: Request) -> AsyncIterator[Delta]:
        # It draws words, not tokens of a grammar: it cannot honour a constraint, so it says so.
        refuse_unsupported(request, "sim", "structured_outputs")
        prompt, prompt_ids = await self._offload.run(prompt_chars(request), _rendered, request)
        seq = self._new_seq(request, prompt, prompt_ids)
        if self._task is None or self._task.done():
            raise RuntimeError("the sim engine is not running")
        self._arrivals += 1
        seq.arrival = self._arrivals
        self._queue(seq)
        self._live.add(seq)
        self._wakeup.set()
        self._notify()
        try:
            while True:
                delta = await seq.out.get()
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            if seq.finish_reason is None:  # the reader went away: abort and free its blocks
                self._abort(seq)

    def tokenize(self, request: Request) -> list[int]:
        return sim_tokenize(render_prompt(request))

    def detokenize(self, token_ids: list[int]) -> str:
        raise InvalidRequest("'tokens': the sim engine's token ids are hashes of text pieces, not a vocabulary: "
                             "they cannot be turned back into text", param="tokens")

    def load(self) -> Load:
        running = self._running_adapters()
        return Load(
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            kv_cache_usage=self._pool.usage(),
            prefix_cache_hit_rate=self._prefix_hits / self._prefix_queries if self._prefix_queries else 0.0,
            active_adapters=() if self._slots is None else self._slots.active,
            running_adapters=tuple(sorted(running)),
            waiting_adapters=tuple(sorted({s.request.adapter for s in self._waiting if s.request.adapter} - running)),
        )

    async def _add_adapter(self, name: str, path: str) -> None:
        """Takes the adapter if its folder holds one of a rank the slots hold (vLLM's checks and
        messages); its weights are not read: the simulator's words do not come from weights."""
        assert self.info.lora is not None
        try:
            with open(os.path.join(path, "adapter_config.json"), encoding="utf-8") as f:
                rank = json.load(f).get("r", 0)
        except (OSError, ValueError):
            raise InvalidRequest(f"Loading lora {name} failed: No adapter found for {path}", param="lora_path") from None
        if rank > self.info.lora.max_lora_rank:
            raise InvalidRequest(f"LoRA rank {rank} is greater than max_lora_rank {self.info.lora.max_lora_rank}.",
                                 param="lora_path")
        if self._slots is not None:
            self._slots.added(name)

    async def _remove_adapter(self, name: str) -> None:
        # A request still running on it finishes on it, as in vLLM; then its slot is free.
        if self._slots is not None:
            self._slots.forget(name)

    def adapter_loads(self) -> Mapping[str, int]:
        return {} if self._slots is None else self._slots.loads

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):  # a failed loop was logged when it failed
                pass
            self._task = None
        for seq in list(self._live):
            self._finish(seq, "abort")
        self._notify()
        self._offload.close()

    # -- requests --------------------------------------------------------------------------

    def _new_seq(self, request: Request, prompt: str, prompt_ids: list[int]) -> _Seq:
        total = len(prompt_ids) + request.max_tokens
        if total > self.info.max_model_len:
            raise PromptTooLong(
                f"prompt ({len(prompt_ids)} tokens) + max_tokens ({request.max_tokens}) exceeds "
                f"the model's context of {self.info.max_model_len} tokens",
                param="max_tokens",
            )
        if math.ceil(total / self._block_size) > self._pool.num_blocks:
            raise PromptTooLong(f"prompt + max_tokens ({total} tokens) exceeds the KV cache", param="max_tokens")
        if request.adapter is not None and (self.info.lora is None or request.adapter not in self.info.lora.adapters):
            raise UnknownModel(f"the LoRA adapter {request.adapter!r} is not loaded in this engine", param="model")
        if request.temperature == 0 or request.seed is not None:
            seed = "greedy" if request.temperature == 0 else str(request.seed)
            # An adapter's words are its own (a base model's stream is drawn as it always was).
            adapter = "" if request.adapter is None else f"{request.adapter}\0"
            rng = random.Random(f"{self._cfg.sim_seed}\0{seed}\0{adapter}{prompt}")
        else:
            rng = random.Random()
        seq = _Seq(request=request, prompt_ids=prompt_ids, rng=rng)
        # A migrated stream: its output so far is already there (recomputed at admission, like a
        # preempted request) and the generator is where it was, so greedy output goes on unchanged.
        for token in request.continue_token_ids:
            seq.text += " " + rng.choice(_WORDS)
            seq.output_ids.append(token)
        seq.sent_chars = len(seq.text)
        return seq

    def _abort(self, seq: _Seq) -> None:
        seq.finish_reason = "abort"
        self._remove(seq)
        self._notify()

    def _finish(self, seq: _Seq, reason: str, token_ids: list[int] | None = None,
                logprobs: list[TokenLogprob] | None = None) -> None:
        """Ends a request: frees its blocks and sends the rest of its text with the finish reason."""
        seq.finish_reason = reason
        self._remove(seq)
        text, seq.sent_chars = seq.text[seq.sent_chars:], len(seq.text)
        seq.out.put(self._delta(seq, text, token_ids or [], reason, logprobs))

    def _remove(self, seq: _Seq) -> None:
        self._live.discard(seq)
        if seq in self._waiting:
            self._waiting.remove(seq)
        elif seq in self._running:
            self._running.remove(seq)
        self._pool.release(seq.blocks)
        seq.blocks = []

    def _delta(self, seq: _Seq, text: str, token_ids: list[int], finish_reason: str | None,
               logprobs: list[TokenLogprob] | None = None) -> Delta:
        return Delta(
            text=text,
            token_ids=token_ids,
            finish_reason=finish_reason,
            prompt_tokens=len(seq.prompt_ids),
            completion_tokens=len(seq.output_ids),
            cached_prompt_tokens=seq.cached_prompt_tokens,
            logprobs=logprobs if seq.request.logprobs is not None else None,
        )

    def _notify(self) -> None:
        load = self.load()
        if load != self._last_load:
            self._last_load = load
            self.load_signal.notify()

    # -- the engine loop -------------------------------------------------------------------

    async def _run(self) -> None:
        try:
            await self._loop()
        except Exception:
            log.exception("sim engine failed; aborting every request")
            for seq in list(self._live):  # wherever the failure left it, none is forgotten
                self._finish(seq, "abort")
            raise

    async def _loop(self) -> None:
        deadline = self._clock()
        while True:
            if not self._running and not self._waiting:
                self._wakeup.clear()
                await self._wakeup.wait()
                deadline = self._clock()
            batch, duration = self._schedule()
            self._notify()
            # Sleep to an absolute deadline so Python overhead does not slow the simulated GPU;
            # after a long stall, start afresh rather than run a burst of zero-length steps.
            deadline += duration
            now = self._clock()
            if deadline < now - 0.1:
                deadline = now
            await self._sleep(max(0.0, deadline - now))
            self._emit(batch)
            self._notify()

    def _schedule(self) -> tuple[list[_Seq], float]:
        """Plans one step (steps 1-3 of the module docstring): the batch and its duration in s."""
        bs = self._block_size
        # 1. Running requests get the KV slots of the token they decode; preempt when out of blocks.
        preempted = False
        i = 0
        while i < len(self._running):
            seq = self._running[i]
            needed = math.ceil(seq.num_tokens / bs) - len(seq.blocks)
            while needed > self._pool.num_free:
                victim = self._victim()
                preempted = True
                if victim is seq:  # nobody else to make room: the request itself waits
                    break
                if self._running.index(victim) < i:
                    i -= 1
                self._preempt(victim)
            if seq not in self._running or needed > self._pool.num_free:
                if seq in self._running:
                    self._preempt(seq)
                break
            seq.blocks += self._pool.take([], needed)
            i += 1
        # 2. The token budget: a token for each decoding request, then the prompts being prefilled.
        batch = [seq for seq in self._running if not seq.prefill_left]
        budget = (self._cfg.sim_max_num_batched_tokens or math.inf) - len(batch)
        prefill_tokens = 0

        def prefill(seq: _Seq) -> None:  # the next chunk of its prompt, in this step
            nonlocal budget, prefill_tokens
            seq.chunk = int(min(seq.prefill_left, budget))
            budget -= seq.chunk
            prefill_tokens += seq.chunk
            batch.append(seq)
            # Its full blocks are cached now, as vLLM v1 commits a block to the prefix cache when
            # it allocates it for the step that computes it: a prompt admitted later in this step
            # reuses them (the step's forward pass writes them before its attention reads them).
            self._cache_computed_blocks(seq, seq.num_tokens - seq.prefill_left + seq.chunk)

        for seq in self._running:
            if seq.prefill_left and budget > 0:
                prefill(seq)
        # Admit waiting requests in the queue's order (not in a step that had to preempt, like vLLM).
        # One on an adapter that finds every adapter slot taken by others waits, and those behind
        # it go on (vLLM's scheduler skips it likewise).
        skipped: list[_Seq] = []
        load_ms = 0.0
        while not preempted and budget > 0 and self._waiting and len(self._running) < self._cfg.max_num_seqs:
            seq = self._waiting[0]
            if not self._adapter_fits(seq):
                skipped.append(self._waiting.popleft())
                continue
            self._hash_full_blocks(seq)
            # At least one token must be computed to produce the next one.
            hits: list[int] = []
            if self._cfg.enable_prefix_caching:
                hits = self._pool.cached_prefix(seq.block_hashes[: (seq.num_tokens - 1) // bs])
            num_new = math.ceil(seq.num_tokens / bs) - len(hits)
            if not self._pool.can_take(num_new, hits):
                break
            self._waiting.popleft()
            seq.blocks = self._pool.take(hits, num_new)
            seq.num_cached_blocks = len(hits)
            cached = len(hits) * bs
            if not seq.scheduled_once:
                seq.scheduled_once = True
                seq.cached_prompt_tokens = cached
            self._record_prefix_query(seq.num_tokens, cached)
            seq.prefill_left = seq.num_tokens - cached
            if seq.request.adapter is not None and self._slots is not None:
                load_ms += self._slots.bring(seq.request.adapter, self._running_adapters())
            self._running.append(seq)
            prefill(seq)
        self._waiting.extendleft(reversed(skipped))
        cfg = self._cfg
        ms = prefill_tokens * cfg.sim_prefill_ms_per_token + cfg.sim_itl_base_ms + cfg.sim_itl_per_seq_ms * len(batch)
        adapters = {seq.request.adapter for seq in batch} - {None}
        if adapters and self._slots is not None:
            # 3. The LoRA kernels beside the base model's, then the adapters brought into slots
            # before the forward pass (vLLM activates them in the step that first runs them).
            self._slots.used(a for a in adapters if a)
            ms = ms * (1.0 + cfg.sim_lora_step_overhead) + cfg.sim_lora_adapter_ms * len(adapters)
        return batch, (ms + load_ms) / cfg.sim_speed / 1000.0

    def _running_adapters(self) -> set[str]:
        return {a for a in (s.request.adapter for s in self._running) if a is not None}

    def _adapter_fits(self, seq: _Seq) -> bool:
        """Whether ``seq`` may join the running batch: its adapter (if any) has a slot, that is,
        it is running already or fewer than --max-loras adapters are."""
        adapter = seq.request.adapter
        if adapter is None or self.info.lora is None:
            return True
        running = self._running_adapters()
        return adapter in running or len(running) < self.info.lora.max_loras

    def _victim(self) -> _Seq:
        """The running request to preempt: the newest (fcfs), or the one with the highest
        (priority, arrival), as vLLM's scheduler picks."""
        return max(self._running, key=lambda s: s.order) if self._by_priority else self._running[-1]

    def _queue(self, seq: _Seq, preempted: bool = False) -> None:
        """Puts ``seq`` in the waiting queue: by (priority, arrival), or at the back on arrival and
        the front after a preemption (fcfs)."""
        if self._by_priority:
            at = next((i for i, other in enumerate(self._waiting) if other.order > seq.order), len(self._waiting))
            self._waiting.insert(at, seq)
        elif preempted:
            self._waiting.appendleft(seq)
        else:
            self._waiting.append(seq)

    def _preempt(self, seq: _Seq) -> None:
        self._running.remove(seq)
        self._pool.release(seq.blocks)
        seq.blocks = []
        seq.num_cached_blocks = 0
        seq.prefill_left = 0  # recomputed from its admission
        self._queue(seq, preempted=True)
        self.num_preemptions += 1
        log.debug("sim engine: preempted %s (KV cache full)", seq.request.request_id)

    def _emit(self, batch: list[_Seq]) -> None:
        """Step 4: every request of the batch that is still running and has its prompt computed
        gets its next token."""
        for seq in batch:
            if seq.finish_reason is not None:
                continue  # aborted while the step ran
            if seq.prefill_left:
                seq.prefill_left -= seq.chunk
                if seq.prefill_left:  # a chunk of its prompt (cached when scheduled): no token yet
                    continue
            self._cache_computed_blocks(seq)
            request = seq.request
            at = seq.rng.randrange(len(_WORDS))
            if len(seq.output_ids) < request.min_tokens and request.stop_token_ids:
                # As vLLM: before min_tokens a stop token is never drawn (its logit is masked).
                for _ in range(len(_WORDS)):
                    if sim_token_id(" " + _WORDS[at]) not in request.stop_token_ids:
                        break
                    at = seq.rng.randrange(len(_WORDS))
            word = " " + _WORDS[at]
            token = sim_token_id(word)
            seq.output_ids.append(token)
            logprobs = None if request.logprobs is None else [_uniform_logprob(at, request.logprobs)]
            old_len = len(seq.text)
            seq.text += word
            stop = request.stop
            may_stop = len(seq.output_ids) >= request.min_tokens  # vLLM checks no stop string before
            if may_stop and token in request.stop_token_ids:
                if not request.include_stop_str_in_output:
                    seq.text = seq.text[:old_len]
                self._finish(seq, "stop", [token], logprobs)
            elif may_stop and stop and self._cut_at_stop(seq, old_len):
                self._finish(seq, "stop", [token], logprobs)
            elif len(seq.output_ids) >= request.max_tokens:
                self._finish(seq, "length", [token], logprobs)
            else:
                # Hold back what could still be the start of a stop string (vLLM does the same).
                hold = max((len(s) for s in stop), default=1) - 1
                end = max(seq.sent_chars, len(seq.text) - hold)
                text, seq.sent_chars = seq.text[seq.sent_chars:end], end
                seq.out.put(self._delta(seq, text, [token], None, logprobs))

    @staticmethod
    def _cut_at_stop(seq: _Seq, old_len: int) -> bool:
        """Cuts the text before the first stop string that the new word completed."""
        best, end = -1, -1
        for stop in seq.request.stop:
            at = seq.text.find(stop, max(0, old_len - len(stop) + 1))
            if at >= 0 and (best < 0 or at < best):
                best, end = at, at + len(stop)
        if best < 0:
            return False
        cut = end if seq.request.include_stop_str_in_output else best
        seq.text = seq.text[:cut]
        seq.sent_chars = min(seq.sent_chars, cut)
        return True

    def _hash_full_blocks(self, seq: _Seq) -> None:
        bs = self._block_size
        while len(seq.block_hashes) < seq.num_tokens // bs:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else chain_root(seq.request.adapter)
            seq.block_hashes.append(block_hash(parent, seq.tokens(i * bs, (i + 1) * bs)))

    def _cache_computed_blocks(self, seq: _Seq, computed: int | None = None) -> None:
        """Registers the full blocks of ``seq``'s first ``computed`` tokens (default: all tokens
        before the new one): a prompt's when its step is scheduled, a decode's after its step."""
        if not self._cfg.enable_prefix_caching:
            return
        self._hash_full_blocks(seq)
        full = min((seq.num_tokens if computed is None else computed) // self._block_size, len(seq.blocks))
        for j in range(seq.num_cached_blocks, full):
            self._pool.cache(seq.blocks[j], seq.block_hashes[j])
        seq.num_cached_blocks = max(seq.num_cached_blocks, full)

    def _record_prefix_query(self, queries: int, hits: int) -> None:
        self._prefix_window.append((queries, hits))
        self._prefix_queries += queries
        self._prefix_hits += hits
        if len(self._prefix_window) > PREFIX_STATS_WINDOW:
            old_q, old_h = self._prefix_window.popleft()
            self._prefix_queries -= old_q
            self._prefix_hits -= old_h
