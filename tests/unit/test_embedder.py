"""The semantic cache's embedding model on ONNX Runtime against sentence-transformers itself: the
same vectors for the labelled prompts, whatever batch a text comes in, exported once; and its
estimate of how long a text queued now would wait."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import numpy as np
import pytest

from meshserve.cache_service import embedder as embedder_module
from meshserve.cache_service.embedder import Embedder

DATA = Path(__file__).parent.parent / "data"


def texts() -> list[str]:
    pairs = [json.loads(line) for line in (DATA / "semantic_pairs.jsonl").read_text().splitlines() if line.strip()]
    return sorted({t for p in pairs[:150] for t in (p["a"], p["b"])})


def test_onnx_runtime_gives_sentence_transformers_vectors() -> None:
    every = texts()
    onnx = Embedder(runtime="onnx").encode(every)
    torch = Embedder(runtime="torch").encode(every)
    assert onnx.shape == torch.shape == (len(every), 384)
    assert float(np.min(np.sum(onnx * torch, axis=1))) > 0.9999
    assert np.allclose(np.linalg.norm(onnx, axis=1), 1.0, atol=1e-5)


def test_the_int8_runtime_stays_close_to_the_float_vectors() -> None:
    every = texts()
    full = Embedder(runtime="onnx").encode(every)
    int8 = Embedder(runtime="onnx-int8").encode(every)
    assert int8.shape == full.shape
    similarity = np.sum(full * int8, axis=1)
    assert float(np.min(similarity)) > 0.98 and float(np.mean(similarity)) > 0.99
    assert float(np.max(similarity)) < 0.99999  # another network indeed, not the float one again
    assert np.allclose(np.linalg.norm(int8, axis=1), 1.0, atol=1e-5)


@pytest.mark.parametrize("runtime", ["onnx", "onnx-int8"])
def test_a_text_gets_the_same_vector_alone_or_padded_in_a_batch(runtime: str) -> None:
    model = Embedder(runtime=runtime)
    batch = ["hi", "How do I convert a list of strings to integers in Python without a loop?", "ok then"]
    together = model.encode(batch)
    alone = np.vstack([model.encode([t]) for t in batch])
    assert np.allclose(together, alone, atol=1e-5)


def test_both_runtimes_agree_on_what_fits() -> None:
    onnx, torch = Embedder(runtime="onnx"), Embedder(runtime="torch")
    words = "the quick brown fox jumps over a lazy dog again and again".split()
    for n in (10, 200, 240, 250, 254, 255, 256, 300, 2000):
        text = " ".join(words[i % len(words)] for i in range(n))
        assert onnx.fits(text) == torch.fits(text), n
    assert onnx.fits("short") and not onnx.fits("word " * 300)


def test_the_model_is_exported_once(monkeypatch: pytest.MonkeyPatch) -> None:
    Embedder(runtime="onnx")  # exported by now, by this test or an earlier one
    import torch

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("exported again")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    file = embedder_module._exported(embedder_module.model_path(), 1)
    assert file.exists() and file.suffix == ".onnx"


def test_the_model_is_quantized_once(monkeypatch: pytest.MonkeyPatch) -> None:
    Embedder(runtime="onnx-int8")  # quantized by now, by this test or an earlier one
    from onnxruntime import quantization

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("quantized again")

    monkeypatch.setattr(quantization, "quantize_dynamic", refuse)
    file = embedder_module._quantized(embedder_module.model_path(), 1)
    assert file.exists() and file != embedder_module._exported(embedder_module.model_path(), 1)


def test_an_unknown_runtime_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="onnx, onnx-int8, torch"):
        Embedder(runtime="tensorrt")


async def test_the_wait_for_an_embedding_is_estimated_from_the_texts_ahead() -> None:
    """What a lookup reads to give up at once rather than wait its budget out: nothing ahead,
    no wait; the texts queued, times the recent time per text."""
    model = Embedder(runtime="onnx")
    assert model.wait_s() == 0.0
    await model.embed("a first question")  # one batch: a time per text to go by
    assert model.wait_s() == 0.0
    queued = [asyncio.ensure_future(model.embed(f"question number {i}")) for i in range(10)]
    await asyncio.sleep(0)  # all ten queued, the first batch running
    assert model.wait_s() > 0.0
    await asyncio.gather(*queued)
    assert model.wait_s() == 0.0
