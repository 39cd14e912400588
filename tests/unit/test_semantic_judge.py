"""The semantic cache's learned judge: the committed weights are what
`python -m meshserve.cache_service.train_judge` fits to the labelled pairs, the certain guards
refuse before it, and the matcher asks it instead of the thresholds when told to."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshserve.cache_service import judge as judge_module
from meshserve.cache_service import train_judge
from meshserve.cache_service.judge import JUDGE, Judge, shipped
from meshserve.cache_service.matcher import SIMILARITY, Matcher, default_matcher, matcher_for
from meshserve.services.config import CacheConfig


def test_the_committed_judge_is_what_the_pairs_give() -> None:
    assert train_judge.main(["--check"]) == 0


def test_the_judge_reads_back_as_written_and_refuses_other_features() -> None:
    judge = shipped()
    assert Judge.from_json(judge.to_json()) == judge
    assert len(judge.weights) == len(judge.mean) == len(judge.scale) == len(judge_module.FEATURES)
    other = judge.to_json().replace('"similarity_squared"', '"similarity_cubed"')
    with pytest.raises(ValueError, match="other features"):
        Judge.from_json(other)


@pytest.mark.parametrize(
    ("query", "stored", "similarity", "refusal"),
    [
        ("Convert 5 km to miles", "Convert 50 km to miles", 0.99, "number"),
        ("Give me a pasta recipe with garlic.", "Give me a pasta recipe without garlic.", 0.99, "negation"),
        ("What is the capital of Austria?", "What is the capital of Australia?", 0.99, "entity"),
        ("What does 'ETA' mean?", "What does 'ETD' mean?", 0.99, "quoted"),
        ("Sort the list in ascending order", "Sort the list in descending order", 0.97, JUDGE),
        ("How do I convert decimal to binary?", "How do I convert binary to decimal?", 0.99, JUDGE),
        ("How do I revese a linked list?", "How do I reverse a linked list?", 0.95, ""),
        ("how to boil an egg", "How do I boil an egg?", 0.93, ""),
        ("how to boil an egg", "How do I boil an egg?", 0.55, SIMILARITY),
    ],
)
def test_the_judge_refuses_what_the_certain_guards_or_its_score_refuse(
        query: str, stored: str, similarity: float, refusal: str) -> None:
    matcher = replace(default_matcher(), judge=shipped())
    assert matcher.refusal(query, stored, similarity) == refusal


def test_the_matcher_asks_the_judge_only_when_told() -> None:
    assert default_matcher().judge is None
    assert matcher_for(CacheConfig(semantic_judge=True)).judge == shipped()
    judged = Matcher(0.7, 0.9, 0.95, shipped())
    assert judged.threshold == shipped().floor  # the candidates it looks at
    assert Matcher(0.7, 0.9, 0.95).threshold == 0.7
