"""The "before" baseline: plain Hugging Face ``generate``, one request at a time, no batching.

Requests queue on a lock (the queue is what ``num_waiting`` reports); the running one streams
its tokens from ``generate`` in a thread through a streamer into the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import Any

from meshserve.services.config import WorkerConfig
from meshserve.services.offload import Offload
from meshserve.worker.engine import (
    Delta,
    Engine,
    EngineInfo,
    Load,
    LoadSignal,
    Request,
    prompt_chars,
    refuse_unsupported,
)
from meshserve.worker.vllm_engine import check_fits, decode, render_prompt, resolve_model
from meshserve.worker.weights import weights_id

log = logging.getLogger(__name__)


# The sampling fields this baseline leaves to vLLM (it has top_k, min_p, repetition_penalty
# and min_tokens, which Hugging Face's generate does too).
UNSUPPORTED = ("presence_penalty", "frequency_penalty", "stop_token_ids", "logit_bias",
               "include_stop_str_in_output", "skip_special_tokens", "logprobs", "structured_outputs")


class TransformersEngine(Engine):
    """One request at a time through ``model.generate`` (fp32, CPU)."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.load_signal = LoadSignal()
        self._lock = asyncio.Lock()
        self._waiting = 0
        self._running = 0
        self._model: Any = None
        self._tokenizer: Any = None
        self._offload = Offload("hf-tokenizer")  # a large prompt is tokenized off the event loop
        self.info = EngineInfo(
            engine="transformers",
            model=cfg.served_name(),
            tensor_parallel_size=1,
            max_model_len=cfg.max_model_len,
            block_size=cfg.block_size,
            max_num_seqs=1,
        )

    async def start(self) -> None:
        path, served_name = resolve_model(self.cfg)
        self._model, self._tokenizer = await asyncio.to_thread(_load, path, self.cfg.dtype)
        max_len = min(self.cfg.max_model_len, self._model.config.max_position_embeddings)
        self.info = EngineInfo("transformers", served_name, 1, max_len, self.cfg.block_size, 1,
                               weights_id=await weights_id(self.cfg, path))

    def load(self) -> Load:
        return Load(num_running=self._running, num_waiting=self._waiting)

    def tokenize(self, request: Request) -> list[int]:
        return render_prompt(self._tokenizer, request)

    def detokenize(self, token_ids: list[int]) -> str:
        return decode(self._tokenizer, token_ids)

    async def close(self) -> None:
        self._model = None
        self._offload.close()

    async def generate(self, request: Request) -> AsyncIterator[Delta]:
        if self._model is None:
            raise RuntimeError("the engine is not started")
        refuse_unsupported(request, "transformers", *UNSUPPORTED)
        prompt_ids = await self._offload.run(prompt_chars(request), render_prompt, self._tokenizer, request)
        check_fits(len(prompt_ids), request.max_tokens, self.info.max_model_len)
        self._waiting += 1
        self.load_signal.notify()
        try:
            await self._lock.acquire()
        finally:
            self._waiting -= 1
        self._running = 1
        self.load_signal.notify()
        try:
            async for delta in self._run(request, prompt_ids, request.continue_token_ids):
                yield delta
        finally:
            self._running = 0
            self._lock.release()
            self.load_signal.notify()

    async def _run(self, request: Request, prompt_ids: list[int], continued: list[int]) -> AsyncIterator[Delta]:
        """``continued``: a migrated stream's output so far, generated after and not sent again."""
        loop = asyncio.get_running_loop()
        # Bounded by max_tokens: generate puts at most that many items, plus the end marker.
        tokens: asyncio.Queue[int | None] = asyncio.Queue()
        stop_flag = threading.Event()
        done = loop.run_in_executor(
            None, _generate, self._model, self._tokenizer, request, [*prompt_ids, *continued],
            lambda token: loop.call_soon_threadsafe(tokens.put_nowait, token), stop_flag,
        )
        eos = self._tokenizer.eos_token_id
        ids: list[int] = list(continued)
        text = self._tokenizer.decode(ids, skip_special_tokens=True).removesuffix("\ufffd") if ids else ""
        finish: str | None = None
        try:
            while finish is None:
                token = await tokens.get()
                if token is None:  # generate ended on its own terms
                    await done  # raises what generate raised
                    finish = "length"
                    yield Delta("", [], finish, len(prompt_ids), len(ids))
                    return
                ids.append(token)
                full = self._tokenizer.decode(ids, skip_special_tokens=True)
                if token == eos and not request.ignore_eos:
                    finish = "stop"
                elif len(ids) >= request.max_tokens:
                    finish = "length"
                # Hold back text while the last token ends inside a multi-byte character (and
                # drop it at the end, as vLLM's detokenizer does).
                new_text = "" if full.endswith("\ufffd") else full[len(text):]
                stop_at = _find_stop(text + new_text, request.stop)
                if stop_at is not None:
                    new_text, finish = (text + new_text)[len(text):stop_at], "stop"
                text += new_text
                yield Delta(new_text, [token], finish, len(prompt_ids), len(ids))
        finally:
            stop_flag.set()
            await asyncio.wait({done})  # the lock is free only once the model is
            if finish is None:
                log.debug("request %s aborted", request.request_id)


def _find_stop(text: str, stops: list[str]) -> int | None:
    found = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(found) if found else None


def _load(path: str, dtype: str) -> tuple[Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = torch.float32 if dtype in ("auto", "float32") else getattr(torch, dtype)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    model.eval()
    return model, AutoTokenizer.from_pretrained(path)


def _generate(model: Any, tokenizer: Any, request: Request, prompt_ids: list[int],
              on_token: Any, stop_flag: threading.Event) -> None:
    """Runs in a worker thread: ``generate`` streaming every new token to ``on_token``."""
    import torch
    from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList
    from transformers.generation.streamers import BaseStreamer

    class Streamer(BaseStreamer):
        def __init__(self) -> None:
            self.prompt_seen = False

        def put(self, value: Any) -> None:
            if not self.prompt_seen:  # generate first hands over the prompt itself
                self.prompt_seen = True
                return
            for token in value.reshape(-1).tolist():
                on_token(int(token))

        def end(self) -> None:
            pass

    class Cancelled(StoppingCriteria):
        def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
            return torch.full((input_ids.shape[0],), stop_flag.is_set(), dtype=torch.bool)

    greedy = request.temperature == 0
    new_tokens = request.max_tokens - len(request.continue_token_ids)
    config = GenerationConfig(
        max_new_tokens=new_tokens,
        do_sample=not greedy,
        temperature=None if greedy else request.temperature,
        top_p=None if greedy else request.top_p,
        top_k=None if greedy or not request.top_k else request.top_k,
        min_p=None if greedy or not request.min_p else request.min_p,
        repetition_penalty=request.repetition_penalty if request.repetition_penalty != 1 else None,
        eos_token_id=None if request.ignore_eos else tokenizer.eos_token_id,
        # generate() fills unset fields from the model's own generation config, its EOS
        # included: without this an ignore_eos request stopped at a sampled EOS.
        min_new_tokens=new_tokens if request.ignore_eos else
        (max(0, request.min_tokens - len(request.continue_token_ids)) or None),
        pad_token_id=tokenizer.pad_token_id,
    )
    try:
        if request.seed is not None:
            torch.manual_seed(request.seed)  # safe: one request at a time
        with torch.inference_mode():
            model.generate(
                torch.tensor([prompt_ids]),
                attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                generation_config=config,
                streamer=Streamer(),
                stopping_criteria=StoppingCriteriaList([Cancelled()]),
            )
    finally:
        on_token(None)
