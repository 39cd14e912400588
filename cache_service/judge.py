"""The semantic cache's learned judge: whether a stored prompt's answer answers a new prompt, from
the two prompts' cosine and how their words differ, as a logistic regression fitted to labelled
pairs (``data/judge.json``, written by ``python -m meshserve.cache_service.train_judge``).

The guards that are certain (numbers, negation, quoted text, script, language, names) refuse
before it. What the other guards say (an opposite, a marked word only one prompt has, a connector
followed by another word) and what the content words of the two prompts are (the same, one adding
words, each with words the other lacks, how many, how many of them marked) are its features
beside the cosine: each such difference moves the similarity a hit needs, by how much the labelled
pairs showed. The decision threshold is the score above every near miss it was fitted to.
"""

from __future__ import annotations

import importlib.resources
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass

from meshserve.cache_service import guards

JUDGE = "judge"  # the refusal of a pair the judge scores below its threshold
# Guards whose word is final: what they tell apart is another question whatever the cosine.
CERTAIN = ("number", "negation", "quoted", "script", "language", "entity")
SOFT = ("opposite", "lexicon", "order")  # guards the judge weighs instead


def features(query: str, stored: str, similarity: float, told: Sequence[str] = ()) -> list[float]:
    """The judge's inputs for a pair, in the order of FEATURES; ``told`` the guards that tell the
    two prompts apart (``guards.telling``)."""
    words_q, words_s = guards._profile(query)[0], guards._profile(stored)[0]
    content_q, content_s = guards._content(words_q), guards._content(words_s)
    only_q, only_s = guards._unexplained(content_q, content_s), guards._unexplained(content_s, content_q)
    kind = guards.difference(query, stored)
    n_q, n_s = len(set(content_q)) or 1, len(set(content_s)) or 1
    shared = set(content_q) & set(content_s)
    added, swapped = float(kind == guards.ADDED), float(kind == guards.SWAPPED)
    return [
        similarity,
        added,
        swapped,
        len(only_q),
        len(only_s),
        len(only_q) / n_q + len(only_s) / n_s,
        min(len(only_q), len(only_s)),
        abs(len(words_q) - len(words_s)) / max(len(words_q), len(words_s), 1),
        *(float(g in told) for g in SOFT),
        float(any(guards._marked(w) for w in only_q | only_s)),
        min(n_q, n_s),
        max(n_q, n_s),
        len(shared) / len(set(content_q) | set(content_s) | {""}),
        float(not only_q and not only_s),
        similarity * similarity,
        similarity * added,
        similarity * swapped,
    ]


FEATURES = (
    "similarity", "added", "swapped", "unexplained_query", "unexplained_stored", "unexplained_share",
    "unexplained_both", "length_difference", *(f"guard_{g}" for g in SOFT), "unexplained_marked",
    "content_min", "content_max", "content_jaccard", "content_same", "similarity_squared",
    "similarity_if_added", "similarity_if_swapped",
)


@dataclass(frozen=True)
class Judge:
    """A logistic regression over standardised FEATURES; a pair is answered when its score
    exceeds ``threshold`` and its cosine reaches ``floor``."""

    weights: tuple[float, ...]
    bias: float
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    threshold: float
    floor: float  # the lowest cosine it answers: candidates below it are not looked at

    def score(self, x: Sequence[float]) -> float:
        terms = zip(self.weights, x, self.mean, self.scale, strict=True)
        return self.bias + math.fsum(w * (v - m) / s for w, v, m, s in terms)

    def refusal(self, query: str, stored: str, similarity: float) -> str:
        """"" when ``stored``'s answer answers ``query``; else a certain guard's name or JUDGE."""
        told = tuple(guards.telling(query, stored))
        certain = next((g for g in told if g in CERTAIN), "")
        if certain:
            return certain
        return "" if self.score(features(query, stored, similarity, told)) > self.threshold else JUDGE

    def to_json(self) -> str:
        return json.dumps({"features": list(FEATURES), "weights": list(self.weights), "bias": self.bias,
                           "mean": list(self.mean), "scale": list(self.scale), "threshold": self.threshold,
                           "floor": self.floor}, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> Judge:
        d = json.loads(text)
        if tuple(d["features"]) != FEATURES:
            raise ValueError(f"the judge was fitted to other features: {d['features']}")
        return cls(tuple(d["weights"]), d["bias"], tuple(d["mean"]), tuple(d["scale"]), d["threshold"],
                   d["floor"])


def shipped() -> Judge:
    """The judge in the package (``data/judge.json``)."""
    return Judge.from_json(importlib.resources.files(__package__).joinpath("data", "judge.json").read_text())
