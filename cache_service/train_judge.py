"""Fits the semantic cache's judge (``cache_service/data/judge.json``) to the labelled pairs it may
learn from: the tuning half of ``tests/data/semantic_eval_*.jsonl`` and the two older sets (never
the test half).

    python -m meshserve.cache_service.train_judge [--check] [--cv]

--check fails if the committed judge differs from what the pairs give; --cv prints the
cross-validated false hits and paraphrase hits (pairs that share a prompt in the same fold), the
figures the features, the regularisation and the threshold rule were chosen by. Deterministic: the
embedding model on the CPU, a Newton fit, weights rounded.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshserve.cache_service import evaluation, guards
from meshserve.cache_service.judge import CERTAIN, Judge, features

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
OUT = ROOT / "cache_service" / "data" / "judge.json"
TRAINING = ("semantic_eval_tune.jsonl", "semantic_pairs.jsonl", "semantic_pairs_holdout.jsonl")
FLOOR = 0.60     # the lowest cosine the judge answers (no paraphrase below it is worth the risk)
C = 1.0          # inverse L2 strength on the standardised features
MARGIN = 1e-3    # the threshold's distance above the highest-scoring near miss
FOLDS, REPEATS = 5, 5
DIGITS = 6


@dataclass(frozen=True)
class Training:
    pairs: list[evaluation.Pair]
    x: np.ndarray     # features, a row a pair
    y: np.ndarray     # a paraphrase?
    seen: np.ndarray  # judged at all: no certain guard refuses it and its cosine reaches FLOOR


def training_set() -> Training:
    """The pairs the judge learns from, as the judge sees them."""
    from meshserve.cache_service.embedder import Embedder  # noqa: PLC0415 (loads the model)

    pairs = [p for name in TRAINING for p in evaluation.load(DATA / name)]
    similarity = evaluation.similarities(pairs, Embedder())
    x, seen = [], []
    for p, s in zip(pairs, similarity, strict=True):
        told = tuple(guards.telling(p.b, p.a))
        x.append(features(p.b, p.a, float(s), told))
        seen.append(s >= FLOOR and not any(g in CERTAIN for g in told))
    return Training(pairs, np.array(x), np.array([p.label == evaluation.PARAPHRASE for p in pairs]), np.array(seen))


def fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
    """L2-regularised logistic regression by Newton's method: weights, bias, mean, scale."""
    mean, scale = x.mean(0), x.std(0)
    scale[scale == 0] = 1.0
    z = np.hstack([(x - mean) / scale, np.ones((len(x), 1))])
    penalty = np.full(z.shape[1], 1.0 / C)
    penalty[-1] = 0.0  # the bias is not shrunk
    w = np.zeros(z.shape[1])
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-z @ w))
        grad = z.T @ (p - y) + penalty * w
        hess = (z * (p * (1 - p))[:, None]).T @ z + np.diag(penalty)
        step = np.linalg.solve(hess, grad)
        w -= step
        if np.abs(step).max() < 1e-10:
            break
    return w[:-1], float(w[-1]), mean, scale


def train(x: np.ndarray, y: np.ndarray, seen: np.ndarray) -> Judge:
    """The judge fitted to the pairs it sees, its threshold above every near miss among them."""
    w, b, mean, scale = fit(x[seen], y[seen].astype(float))
    r = lambda v: tuple(float(f"{t:.{DIGITS}g}") for t in v)  # noqa: E731
    judge = Judge(r(w), float(f"{b:.{DIGITS}g}"), r(mean), r(scale), 0.0, FLOOR)
    worst = max(judge.score(row) for row in x[seen & ~y])
    threshold = float(np.ceil((worst + MARGIN) * 10**4) / 10**4)
    return Judge(judge.weights, judge.bias, judge.mean, judge.scale, threshold, FLOOR)


def groups_of(pairs: Sequence[evaluation.Pair]) -> np.ndarray:
    """Pairs linked by a shared prompt, numbered: they go to one fold together."""
    parent: dict[str, str] = {}

    def root(t: str) -> str:
        while parent.setdefault(t, t) != t:
            t = parent[t]
        return t

    for p in pairs:
        parent[root(p.a)] = root(p.b)
    numbers: dict[str, int] = {}
    return np.array([numbers.setdefault(root(p.a), len(numbers)) for p in pairs])


def cross_validate(data: Training) -> tuple[float, float]:
    """Mean false hits and paraphrase hits over REPEATS shuffles of FOLDS grouped folds, each
    fold's pairs judged by a judge trained on the others."""
    x, y, seen = data.x, data.y, data.seen
    groups = groups_of(data.pairs)
    totals = []
    for repeat in range(REPEATS):
        fold = np.random.RandomState(repeat).permutation(groups.max() + 1)[groups] % FOLDS
        hit = np.zeros(len(y), bool)
        for k in range(FOLDS):
            judge = train(x[fold != k], y[fold != k], seen[fold != k])
            for i in np.where((fold == k) & seen)[0]:
                hit[i] = judge.score(x[i]) > judge.threshold
        totals.append(((hit & ~y).sum(), (hit & y).sum()))
    fh, ph = np.mean(totals, axis=0)
    return float(fh), float(ph)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="fail if the committed judge is not what the pairs give")
    parser.add_argument("--cv", action="store_true", help="print the cross-validated figures")
    args = parser.parse_args(argv)
    data = training_set()
    if args.cv:
        fh, ph = cross_validate(data)
        near, para = int((~data.y).sum()), int(data.y.sum())
        print(f"cross-validated ({REPEATS}x{FOLDS} folds, {len(data.pairs)} pairs): false hits {fh:.1f}/{near} = "
              f"{fh / near:.2%}, paraphrase hits {ph:.1f}/{para} = {ph / para:.1%}")
    text = train(data.x, data.y, data.seen).to_json()
    if args.check:
        if OUT.read_text() != text:
            print(f"{OUT} is not what the pairs give: run python -m meshserve.cache_service.train_judge",
                  file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
