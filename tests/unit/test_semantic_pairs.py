"""The semantic cache's matching rule on labelled prompt pairs, at the default settings: the real
embedding model, the guards and the judge, as the cache service runs them (``Matcher``).

The figures that count are the test half's (``semantic_eval_test.jsonl``), a set never looked at
while the threshold, the guards or the judge were chosen: at most 0.5% of its near misses may be
answered, at least 60% of its paraphrases must be. The tuning half's figures, and the older sets'
(the guards' first development set and its hold-out), are printed beside them (``pytest -s``).
tests/data/README.md says how the pairs were written and split.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from meshserve.cache_service import evaluation, guards
from meshserve.cache_service.embedder import Embedder
from meshserve.cache_service.matcher import default_matcher
from meshserve.services.config import CacheConfig

DATA = Path(__file__).parent.parent / "data"
TEST_HALF, TUNING_HALF = "semantic_eval_test.jsonl", "semantic_eval_tune.jsonl"
MAX_FALSE_HIT_RATE = 0.005
MIN_PARAPHRASE_HIT_RATE = 0.60
NEAR_MISS_KINDS = {"number", "entity", "unit", "language", "programming_language", "direction", "scope", "format",
                   "negation", "opposite", "lookalike", "date_time"}


@cache
def measured(name: str) -> evaluation.Report:
    pairs = evaluation.load(DATA / name)
    similarity = evaluation.similarities(pairs, Embedder(runtime=CacheConfig.embed_runtime))
    return evaluation.report(evaluation.judge(pairs, similarity, default_matcher()))


def totals(name: str, rep: evaluation.Report) -> str:
    return (f"{name}: false hits {rep.false_hits}/{rep.near_misses} = {rep.false_hit_rate:.2%}, "
            f"paraphrase hits {rep.paraphrase_hits}/{rep.paraphrases} = {rep.paraphrase_hit_rate:.1%}")


def test_the_test_half_has_every_kind_of_near_miss() -> None:
    pairs = evaluation.load(DATA / TEST_HALF)
    assert len(pairs) >= 500
    kinds = {p.category for p in pairs if p.label == evaluation.NEAR_MISS}
    assert kinds == NEAR_MISS_KINDS
    assert all(sum(p.category == kind for p in pairs) >= 20 for kind in kinds)
    # The halves share no prompt: nothing of the test half was seen while tuning.
    tuning = {t for p in evaluation.load(DATA / TUNING_HALF) for t in (p.a, p.b)}
    assert not tuning & {t for p in pairs for t in (p.a, p.b)}


OLDER_SETS = ("semantic_pairs.jsonl", "semantic_pairs_holdout.jsonl")
OLDER_MAX_FALSE_HIT_RATE, OLDER_MIN_PARAPHRASE_HIT_RATE = 0.005, 0.50


def test_the_older_sets_keep_their_bounds() -> None:
    """The guards' development set and its hold-out: at most 0.5% false hits, at least half of the
    paraphrases answered (the bounds the cache has held since it had a semantic stage)."""
    for name in OLDER_SETS:
        rep = measured(name)
        print(totals(name, rep))
        assert rep.false_hit_rate <= OLDER_MAX_FALSE_HIT_RATE, name
        assert rep.paraphrase_hit_rate >= OLDER_MIN_PARAPHRASE_HIT_RATE, name


# The target on questions never looked at while tuning is not met yet (1.53% false hits, 57.9% of
# paraphrases on the test half: docs/benchmarks.md, "Semantic cache: which questions it answers").
# strict: the day a better judge meets it this test turns red, and the marker must go.
@pytest.mark.xfail(strict=True, reason="the test half's bounds are not met by today's judge")
def test_default_settings_answer_paraphrases_and_almost_no_near_miss() -> None:
    test, tuning = measured(TEST_HALF), measured(TUNING_HALF)
    print(f"\n{evaluation.markdown(test, 'test half')}\n\n{evaluation.markdown(tuning, 'tuning half')}\n")
    print(totals("test half", test))
    print(totals("tuning half", tuning))
    false_hits = [f"{k.category}: {k.hits}" for k in test.kinds if k.label == evaluation.NEAR_MISS and k.hits]
    assert test.false_hit_rate <= MAX_FALSE_HIT_RATE, false_hits
    assert test.paraphrase_hit_rate >= MIN_PARAPHRASE_HIT_RATE


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
        ("Sort the list in ascending order", "Sort the list in descending order", "opposite"),
        ("How do I reverse a singly linked list?", "How do I reverse a doubly linked list?", "opposite"),
        ("What are the symptoms of hyperthyroidism?", "What are the symptoms of hypothyroidism?", "opposite"),
        ("How do I mute a participant?", "How do I unmute a participant?", "opposite"),
        ("Which is the fastest land animal?", "Which is the slowest land animal?", "opposite"),
        ("How do I convert decimal to binary?", "How do I convert binary to decimal?", "order"),
        ("How do I revese a linked list?", "How do I reverse a linked list?", ""),
        ("What is the tallest mountain?", "世界で一番高い山は何ですか？", "script"),
        ("What is the tallest mountain in the world?", "Quelle est la montagne la plus haute du monde ?", "language"),
    ],
)
def test_each_guard(a: str, b: str, guard: str) -> None:
    assert guards.differs(a, b) == guard
    assert guards.differs(b, a) == guard
