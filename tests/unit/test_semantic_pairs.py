"""The semantic cache's matching rule on labelled prompt pairs, at the default settings: the real
embedding model and the guards, as the cache service runs them.

``semantic_pairs.jsonl`` is the set the guards were developed on; ``semantic_pairs_holdout.jsonl``
was written apart from them (its first measurement is in docs/benchmarks.md). Bounds:
at most 0.5% of near misses may match, at least 50% of paraphrases must.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from meshserve.cache_service import guards
from meshserve.cache_service.embedder import Embedder
from meshserve.services.config import CacheConfig

DATA = Path(__file__).parent.parent / "data"
MAX_FALSE_HIT_RATE = 0.005
MIN_PARAPHRASE_HIT_RATE = 0.50


@cache
def embedder(runtime: str = CacheConfig.embed_runtime) -> Embedder:
    return Embedder(runtime=runtime)


def matches(pairs: list[dict[str, str]], threshold: float, runtime: str = CacheConfig.embed_runtime) -> list[bool]:
    """Whether the cache would answer b with a's entry: similarity and every guard."""
    a = embedder(runtime).encode([p["a"] for p in pairs])
    b = embedder(runtime).encode([p["b"] for p in pairs])
    similarity = np.sum(a * b, axis=1)
    return [bool(s >= threshold) and not guards.differs(p["b"], p["a"]) for p, s in zip(pairs, similarity)]


@pytest.mark.parametrize("runtime", ["onnx", "onnx-int8"])  # the default threshold on either network
@pytest.mark.parametrize("name", ["semantic_pairs.jsonl", "semantic_pairs_holdout.jsonl"])
def test_default_settings_match_paraphrases_and_almost_no_near_miss(name: str, runtime: str) -> None:
    pairs = [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]
    hit = matches(pairs, CacheConfig.semantic_threshold, runtime)
    near = [(p, h) for p, h in zip(pairs, hit) if p["label"] == "near_miss"]
    para = [(p, h) for p, h in zip(pairs, hit) if p["label"] == "paraphrase"]
    assert len(near) >= 100 and len(para) >= 80
    false_hits = [p for p, h in near if h]
    false_rate = len(false_hits) / len(near)
    para_rate = sum(h for _, h in para) / len(para)
    print(f"{name} ({runtime}): false hits {len(false_hits)}/{len(near)} = {false_rate:.2%} "
          f"{dict(Counter(p['category'] for p in false_hits))}; paraphrase hits {para_rate:.1%}")
    assert false_rate <= MAX_FALSE_HIT_RATE, [f"{p['a']} | {p['b']}" for p in false_hits]
    assert para_rate >= MIN_PARAPHRASE_HIT_RATE


@pytest.mark.parametrize(
    ("a", "b", "guard"),
    [
        ("Convert 5 km to miles", "Convert 50 km to miles", "number"),
        ("Convert five km to miles", "Convert 5 kilometres to miles", ""),
        ("Give me a pasta recipe with garlic.", "Give me a pasta recipe without garlic.", "negation"),
        ("Why isn't my code working?", "Why is my code not working?", ""),
        ("What does 'ETA' mean?", "What does 'ETD' mean?", "quoted"),
        ("What is the capital of Austria?", "What is the capital of Australia?", "entity"),
        ("WHAT IS THE CAPITAL OF FRANCE", "what is the capital of france", ""),
        ("Write a Python function to reverse a string", "Write a Rust function to reverse a string", "entity"),
        ("write a python function to reverse a string", "write a rust function to reverse a string", "lexicon"),
        ("Sort the list in ascending order", "Sort the list in descending order", "lexicon"),
        ("How do I convert decimal to binary?", "How do I convert binary to decimal?", "order"),
        ("How do I revese a linked list?", "How do I reverse a linked list?", ""),
        ("What is the tallest mountain?", "世界で一番高い山は何ですか？", "script"),
        ("What is the tallest mountain in the world?", "Quelle est la montagne la plus haute du monde ?", "language"),
    ],
)
def test_each_guard(a: str, b: str, guard: str) -> None:
    assert guards.differs(a, b) == guard
    assert guards.differs(b, a) == guard
