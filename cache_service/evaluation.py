"""The semantic cache's matching rule judged on labelled prompt pairs (``tests/data/``): which
pairs it would answer from the other's entry, rates by kind, and the similarity distributions.

A pair ``(a, b)`` is a hit when a lookup of ``b`` would be answered with the entry stored for
``a``: the same ``Matcher`` the cache service runs, on the same embeddings. A paraphrase's hit is
the cache doing its job; a near miss's is a false hit, a confident answer to another question.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from meshserve.cache_service.embedder import Embedder
from meshserve.cache_service.matcher import Matcher

PARAPHRASE = "paraphrase"
NEAR_MISS = "near_miss"
QUANTILES = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class Pair:
    a: str  # stored
    b: str  # looked up
    label: str  # PARAPHRASE or NEAR_MISS
    category: str
    source: str = ""


def load(path: Path) -> list[Pair]:
    pairs = [Pair(**json.loads(line)) for line in path.read_text().splitlines() if line.strip()]
    if any(p.label not in (PARAPHRASE, NEAR_MISS) for p in pairs):
        raise ValueError(f"{path}: a label is neither {PARAPHRASE} nor {NEAR_MISS}")
    return pairs


@dataclass(frozen=True)
class Judged:
    pair: Pair
    similarity: float
    refusal: str  # "" for a hit, else what refused it (Matcher.refusal)

    @property
    def hit(self) -> bool:
        return not self.refusal


def similarities(pairs: Sequence[Pair], embedder: Embedder) -> np.ndarray:
    """Cosine similarity of each pair's two prompts, each text embedded once."""
    texts = sorted({t for p in pairs for t in (p.a, p.b)})
    vectors = dict(zip(texts, embedder.encode(texts), strict=True))
    return np.array([float(np.dot(vectors[p.a], vectors[p.b])) for p in pairs])


def judge(pairs: Sequence[Pair], similarity: Iterable[float], matcher: Matcher) -> list[Judged]:
    return [Judged(p, s, matcher.refusal(p.b, p.a, s)) for p, s in zip(pairs, similarity, strict=True)]


@dataclass(frozen=True)
class Kind:
    """The pairs of one kind: how many the rule answered, and their similarities."""

    label: str
    category: str
    pairs: int
    hits: int
    similarity: tuple[float, ...]  # at QUANTILES
    refusals: dict[str, int] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.hits / self.pairs if self.pairs else 0.0


@dataclass(frozen=True)
class Report:
    near_misses: int
    false_hits: int
    paraphrases: int
    paraphrase_hits: int
    kinds: list[Kind]

    @property
    def false_hit_rate(self) -> float:
        return self.false_hits / self.near_misses if self.near_misses else 0.0

    @property
    def paraphrase_hit_rate(self) -> float:
        return self.paraphrase_hits / self.paraphrases if self.paraphrases else 0.0


def report(judged: Sequence[Judged]) -> Report:
    kinds = []
    for label, category in sorted({(j.pair.label, j.pair.category) for j in judged}, key=lambda k: (k[0] != PARAPHRASE, k)):
        mine = [j for j in judged if (j.pair.label, j.pair.category) == (label, category)]
        sims = np.array([j.similarity for j in mine])
        kinds.append(Kind(label, category, len(mine), sum(j.hit for j in mine),
                          tuple(float(q) for q in np.quantile(sims, QUANTILES)),
                          dict(Counter(j.refusal for j in mine if j.refusal).most_common())))
    near = [j for j in judged if j.pair.label == NEAR_MISS]
    para = [j for j in judged if j.pair.label == PARAPHRASE]
    return Report(len(near), sum(j.hit for j in near), len(para), sum(j.hit for j in para), kinds)


def markdown(rep: Report, title: str = "") -> str:
    """The report as a Markdown table: one row per kind, then the two totals."""
    quantiles = " / ".join(f"p{q * 100:.0f}" for q in QUANTILES)
    rows = [f"| {title or 'kind'} | pairs | hits | rate | similarity {quantiles} | refused by |",
            "| --- | ---: | ---: | ---: | --- | --- |"]
    for k in rep.kinds:
        refused = ", ".join(f"{name} {n}" for name, n in k.refusals.items())
        sims = " / ".join(f"{s:.3f}" for s in k.similarity)
        rows.append(f"| {k.category} | {k.pairs} | {k.hits} | {k.rate:.1%} | {sims} | {refused} |")
    rows.append(f"| **paraphrases** | {rep.paraphrases} | {rep.paraphrase_hits} | **{rep.paraphrase_hit_rate:.1%}** | | |")
    rows.append(f"| **near misses (false hits)** | {rep.near_misses} | {rep.false_hits} | **{rep.false_hit_rate:.2%}** | | |")
    return "\n".join(rows)
