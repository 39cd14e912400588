"""The workloads of the load generator: prompts of vLLM's datasets (random, prefix_repetition),
repeated questions, multi-turn conversations, and their arrival times."""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

# Random prompts are words drawn from this list. Each word (after a space) is one token for the
# project's tiny model and for common BPE tokenizers, so N words make about N prompt tokens.
VOCABULARY = (
    "the and to is in of on it be that at light no two model with every you ten was cat one worker "
    "cache capital from text again slow same back batch can let for four new nine token its stream "
    "words rain client answer blocks train there are add after away old out other by but pass plus "
    "night red today eight once seven prompt now rock time sixteen leaves keeper wind blue small "
    "which language lamp lived before upon tell talk take their said sail sun sat sent set west went "
    "when will well waves walk whether or over open if cold came like luck length far fix five may "
    "man mark much put next never read too town into go gold goes eat even each ones twenty twice "
    "twelve stays store story word world begin river runs range sea see second seventy yellow clear "
    "clouds climbed lights not noon high hold hard hundred front does dark rose roof soon sixty "
    "least value village key this against winter black letter forty message green"
).split()


@dataclass
class BenchRequest:
    """One prompt of the benchmark and the length it asks for."""

    prompt: str
    prompt_len: int  # approximate: the number of words
    output_len: int


def sample_lengths(mean: int, range_ratio: float, n: int, rng: random.Random) -> list[int]:
    """Lengths uniform in [mean * (1 - ratio), mean * (1 + ratio)], like vLLM's random dataset."""
    low = max(1, math.floor(mean * (1 - range_ratio)))
    high = max(low, math.ceil(mean * (1 + range_ratio)))
    return [rng.randint(low, high) for _ in range(n)]


def random_requests(
    n: int,
    input_len: int,
    output_len: int,
    range_ratio: float,
    rng: random.Random,
    prefix_len: int = 0,
    distinct: int = 0,
) -> list[BenchRequest]:
    """``n`` prompts of random words, sharing ``prefix_len`` leading words; with ``distinct``,
    only that many different requests, repeated in turn (a burst of identical requests)."""
    prefix = rng.choices(VOCABULARY, k=prefix_len)
    count = min(n, distinct) if distinct > 0 else n
    input_lens = sample_lengths(input_len, range_ratio, count, rng)
    output_lens = sample_lengths(output_len, range_ratio, count, rng)
    requests = []
    for in_len, out_len in zip(input_lens, output_lens):
        words = prefix + rng.choices(VOCABULARY, k=in_len)
        requests.append(BenchRequest(" ".join(words), len(words), out_len))
    return [requests[i % count] for i in range(n)]


def prefix_repetition_requests(
    n: int, num_prefixes: int, prefix_len: int, suffix_len: int, output_len: int, rng: random.Random,
    hot_share: float = 0.0,
) -> list[BenchRequest]:
    """vLLM's ``prefix_repetition`` dataset: ``num_prefixes`` random prefixes of ``prefix_len``
    words, each request one of them (in equal shares) plus its own ``suffix_len`` random words,
    in random order. Routing decides whether a prefix is computed once per engine or per request.
    With ``hot_share``, that fraction of the requests share the first prefix (a hot system
    prompt) and the rest spread over the others."""
    prefixes = [rng.choices(VOCABULARY, k=prefix_len) for _ in range(num_prefixes)]
    num_hot = round(n * hot_share)
    others = list(range(1, num_prefixes)) if num_hot and num_prefixes > 1 else list(range(num_prefixes))
    requests = []
    for i in range(n):
        which = 0 if i < num_hot else others[(i - num_hot) % len(others)]
        words = prefixes[which] + rng.choices(VOCABULARY, k=suffix_len)
        requests.append(BenchRequest(" ".join(words), len(words), output_len))
    rng.shuffle(requests)
    return requests


# Paraphrase pairs of the repeats dataset: the held-out set of the semantic cache's tests.
DEFAULT_PAIRS = Path(__file__).resolve().parent.parent / "tests" / "data" / "semantic_pairs_holdout.jsonl"


def repeats_requests(
    n: int, share: float, paraphrase_share: float, pairs_file: Path, output_len: int, rng: random.Random,
) -> list[BenchRequest]:
    """Questions people ask, about ``share`` of them again: of those, ``paraphrase_share`` in
    other words (the paraphrase of a labelled pair), the rest word for word. A repeat comes after
    the question it repeats. Questions are the pairs' first prompts, then numbered variants
    ("Question 7: ...") when ``n`` needs more distinct ones."""
    pairs = [json.loads(line) for line in pairs_file.read_text().splitlines() if line.strip()]
    paraphrases = {p["a"]: p["b"] for p in pairs if p["label"] == "paraphrase"}
    questions = list(dict.fromkeys(p["a"] for p in pairs))
    rng.shuffle(questions)
    num_repeats = round(n * share)
    num_paraphrased = min(round(num_repeats * paraphrase_share), len(paraphrases))
    firsts = [q for q in questions if q in paraphrases][:num_paraphrased]
    others = [q for q in questions if q not in firsts]
    i = 0
    while len(firsts) < n - num_repeats:
        firsts.append(others[i % len(others)] if i < len(others) else f"Question {i}: {others[i % len(others)]}")
        i += 1
    prompts = list(firsts)
    rng.shuffle(prompts)
    order = {q: k for k, q in enumerate(prompts)}
    later: list[tuple[int, str]] = []
    for k in range(num_repeats):
        if k < num_paraphrased:
            source = firsts[k]
            text = paraphrases[source]
        else:
            source = rng.choice(firsts)
            text = source
        later.append((order[source], text))
    # Each repeat lands at a random place after its source.
    out = list(prompts)
    for position, text in sorted(later, reverse=True):
        out.insert(rng.randint(position + 1, len(out)), text)
    return [BenchRequest(q, len(q.split()), output_len) for q in out[:n]]


@dataclass
class Conversation:
    """One user of the multi_turn dataset: a system prompt and the questions of its turns."""

    system: str
    questions: list[str]
    output_len: int


def multi_turn_conversations(
    num_users: int, num_turns: int, system_len: int, question_len: int, output_len: int, rng: random.Random,
    history_len: int = 0,
) -> list[Conversation]:
    """Users sharing one system prompt of ``system_len`` words, each with ``num_turns`` questions
    of ``question_len`` random words (production-stack's multi-round QA, closed loop). With
    ``history_len``, each user's first question opens with that many words of its own (the
    document or the earlier chat it brings: production-stack's user history prompt), which every
    later turn repeats."""
    system = " ".join(rng.choices(VOCABULARY, k=system_len))

    def questions() -> list[str]:
        asked = [" ".join(rng.choices(VOCABULARY, k=question_len)) for _ in range(num_turns)]
        if history_len:
            asked[0] = " ".join(rng.choices(VOCABULARY, k=history_len)) + "\n\n" + asked[0]
        return asked

    return [Conversation(system, questions(), output_len) for _ in range(num_users)]


def model_choices(n: int, names: list[str], popularity: str, rng: random.Random, exponent: float = 1.0) -> list[str]:
    """The model (base model or LoRA adapter) each of ``n`` requests names: ``uniform``, or ``zipf``
    (the k-th name asked in proportion to 1 / k^exponent: the first is the most popular)."""
    if popularity == "uniform":
        weights = [1.0] * len(names)
    elif popularity == "zipf":
        weights = [1.0 / (k ** exponent) for k in range(1, len(names) + 1)]
    else:
        raise ValueError(f"popularity must be uniform or zipf, got {popularity!r}")
    return rng.choices(names, weights=weights, k=n)


def arrival_offsets(n: int, request_rate: float, rng: random.Random, burstiness: float = 1.0) -> list[float]:
    """Send times (seconds from the start) of ``n`` requests arriving at ``request_rate`` per second.

    Gaps follow a gamma distribution with shape ``burstiness`` and mean ``1 / request_rate``, as in
    vLLM: burstiness 1 is a Poisson process, lower is burstier, higher is more regular. An infinite
    rate sends everything at once.
    """
    if math.isinf(request_rate):
        return [0.0] * n
    theta = 1.0 / (request_rate * burstiness)
    offsets, t = [], 0.0
    for _ in range(n):
        offsets.append(t)
        t += rng.gammavariate(burstiness, theta)
    return offsets
