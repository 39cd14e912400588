"""``meshserve bench``: an async gRPC load generator in the manner of ``vllm bench serve``.

It streams random prompts to the mesh's public ``Inference/Generate`` (through Envoy or the
gateway) or to one worker's ``Worker/Generate``, measures TTFT, TPOT, ITL and end-to-end latency
per request, prints vLLM's summary table and can save vLLM's JSON result keys.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import logging
import math
import random
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from services import config
from services.gen import meshserve_pb2 as pb
from services.gen import meshserve_pb2_grpc as pb_grpc
from services.server import CHANNEL_OPTIONS

log = logging.getLogger(__name__)

# Many HTTP/2 servers and proxies allow about this many concurrent streams per connection (100 is
# the RFC's recommended minimum), so the bench opens one connection per this many streams.
STREAMS_PER_CHANNEL = 100

METRIC_HEADERS = {
    "ttft": "Time to First Token",
    "tpot": "Time per Output Token (excl. 1st token)",
    "itl": "Inter-token Latency",
    "e2el": "End-to-end Latency",
}

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

GENERATED = "generated"  # an answer generated for the request itself (no cache_kind)

# How a refused user waits before its next request (replaced in tests).
backoff = asyncio.sleep

# Opens one Generate stream (the call starts when this is called).
OpenStream = Callable[[], AsyncIterable[pb.GenerateResponse]]


@dataclass
class BenchRequest:
    """One prompt of the benchmark and the length it asks for."""

    prompt: str
    prompt_len: int  # approximate: the number of words
    output_len: int


@dataclass
class RequestResult:
    """What one request measured; times are seconds from ``time.perf_counter``."""

    success: bool = False
    prompt_len: int = 0  # prompt tokens from the final usage, else the approximate length asked
    output_tokens: int = 0
    ttft: float = 0.0
    latency: float = 0.0  # send to the end of the stream, or to the error of a failed request
    itl: list[float] = field(default_factory=list)
    start_time: float = 0.0
    error_code: str = ""  # gRPC status code name, e.g. "UNAVAILABLE"
    error: str = ""
    retry_after: float = 0.0  # seconds, from a refusal's 'retry-after' metadata
    answer: str = GENERATED  # how it was answered: GENERATED, or the chunks' cache_kind
    digest: str = ""  # of the answer's token ids: equal answers, equal digests (runs compared)
    splice_gaps: list[float] = field(default_factory=list)  # a migrated stream: its pause at each splice


# ---------------------------------------------------------------------------------------------
# Workload: prompts and arrival times
# ---------------------------------------------------------------------------------------------


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


def workload(args: argparse.Namespace, n: int) -> list[BenchRequest]:
    """The ``n`` requests of ``--dataset-name``, fixed by ``--seed``."""
    rng = random.Random(args.seed)
    if args.dataset_name == "repeats":
        return repeats_requests(n, args.repeats_share, args.repeats_paraphrase_share, args.repeats_pairs,
                                args.random_output_len, rng)
    if args.dataset_name == "prefix_repetition":
        return prefix_repetition_requests(
            n, args.prefix_repetition_num_prefixes, args.prefix_repetition_prefix_len,
            args.prefix_repetition_suffix_len, args.prefix_repetition_output_len, rng,
            args.prefix_repetition_hot_share,
        )
    return random_requests(n, args.random_input_len, args.random_output_len, args.random_range_ratio,
                           rng, args.random_prefix_len, args.random_distinct_prompts)


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


# Opens one turn of a conversation: (the chat so far, request id, max_tokens) -> its stream.
OpenTurn = Callable[[list[pb.ChatMessage], str, int], OpenStream]


async def run_conversations(
    conversations: Sequence[Conversation], open_turn: OpenTurn, think_time: float = 0.0,
    on_done: Callable[[], None] = lambda: None, id_prefix: str = "chat", ramp_up: float = 0.0,
) -> tuple[list[RequestResult], float]:
    """Every user a closed loop: a turn sends the whole conversation so far (system prompt,
    earlier questions and the answers the mesh gave) plus the next question, after the previous
    answer arrived and ``think_time`` seconds. The users start at once, or one after another
    evenly over ``ramp_up`` seconds (as users join a service; turns of equal length started
    together stay in lockstep, every turn a burst). Results in (user, turn) order."""

    async def user(u: int, conv: Conversation) -> list[RequestResult]:
        if ramp_up and u:
            await backoff(u * ramp_up / len(conversations))  # this user joins
        history = [pb.ChatMessage(role="system", content=conv.system)]
        words = len(conv.system.split())
        results = []
        for t, question in enumerate(conv.questions):
            history.append(pb.ChatMessage(role="user", content=question))
            words += len(question.split())
            answer: list[str] = []
            results.append(await measure(open_turn(list(history), f"{id_prefix}-u{u}-t{t}", conv.output_len),
                                         words, answer))
            on_done()
            history.append(pb.ChatMessage(role="assistant", content="".join(answer)))
            words += conv.output_len
            if think_time and t + 1 < len(conv.questions):
                await backoff(think_time)  # the user reads and types
        return results

    start = time.perf_counter()
    per_user = await asyncio.gather(*(user(u, c) for u, c in enumerate(conversations)))
    return [r for rs in per_user for r in rs], time.perf_counter() - start


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


# ---------------------------------------------------------------------------------------------
# Measuring one request
# ---------------------------------------------------------------------------------------------


async def measure(open_stream: OpenStream, prompt_len: int, text: list[str] | None = None) -> RequestResult:
    """Streams one request and times it; only timestamps and counts are taken per chunk (and the
    text pieces, into ``text``, when given: a conversation sends the answer back)."""
    result = RequestResult(prompt_len=prompt_len)
    usage: pb.Usage | None = None
    token_ids = 0
    answer = hashlib.blake2b(digest_size=8)
    worker = ""
    start = last = last_chunk = time.perf_counter()
    result.start_time = start
    try:
        async for chunk in open_stream():
            now = time.perf_counter()
            if chunk.worker != worker:  # the gateway moved the stream to another worker
                if worker and chunk.worker:
                    result.splice_gaps.append(now - last_chunk)
                worker = chunk.worker
            last_chunk = now
            answer.update(np.asarray(chunk.token_ids, dtype=np.int32).tobytes())
            if chunk.text:
                if text is not None:
                    text.append(chunk.text)
                if result.ttft == 0.0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
            token_ids += len(chunk.token_ids)
            if chunk.cache_kind:
                result.answer = chunk.cache_kind
            if chunk.HasField("usage"):
                usage = chunk.usage
        result.latency = time.perf_counter() - start
    except grpc.aio.AioRpcError as e:
        result.latency = time.perf_counter() - start
        result.error_code, result.error = e.code().name, e.details() or ""
        result.retry_after = _retry_after(e)
        return result
    except Exception as e:  # a client-side failure still counts as a failed request
        result.latency = time.perf_counter() - start
        result.error_code, result.error = type(e).__name__, str(e)
        return result
    if usage is not None and usage.prompt_tokens:
        result.prompt_len = usage.prompt_tokens
    result.output_tokens = token_ids
    if usage is not None and usage.completion_tokens:
        result.output_tokens = usage.completion_tokens
    result.digest = answer.hexdigest()
    result.success = True
    return result


def _retry_after(error: grpc.aio.AioRpcError) -> float:
    for key, value in error.trailing_metadata() or ():
        if key == "retry-after":
            with contextlib.suppress(ValueError):
                return max(0.0, float(value))
    return 0.0


# ---------------------------------------------------------------------------------------------
# Summarising
# ---------------------------------------------------------------------------------------------


def _pkey(p: float) -> str:
    return str(int(p)) if int(p) == p else str(p)


def summarize(
    results: Sequence[RequestResult],
    duration: float,
    percentile_metrics: Sequence[str] = ("ttft", "tpot", "itl", "e2el"),
    percentiles: Sequence[float] = (99.0,),
) -> dict[str, Any]:
    """The benchmark's result under vLLM's key names (``completed``, ``mean_ttft_ms``, ...).

    TPOT of a request is ``(e2e - ttft) / (output_tokens - 1)``; requests with one output token
    have none. Failed requests count in ``failed`` and ``errors`` (by gRPC status code), and their
    time from send to the error in ``*_error_ms`` (all of them) and ``error_ms_by_code``; they are
    in no other metric.
    """
    ok = [r for r in results if r.success]
    failed = [r for r in results if not r.success]
    output_lens = [r.output_tokens if r.success else 0 for r in results]
    total_input = sum(r.prompt_len for r in ok)
    total_output = sum(output_lens)
    samples: dict[str, list[float]] = {
        "ttft": [r.ttft for r in ok],
        "tpot": [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1],
        "itl": [gap for r in ok for gap in r.itl],
        "e2el": [r.latency for r in ok],
    }
    result: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(results) - len(ok),
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(ok) / duration if duration > 0 else 0.0,
        "output_throughput": total_output / duration if duration > 0 else 0.0,
        "total_token_throughput": (total_input + total_output) / duration if duration > 0 else 0.0,
        "max_output_tokens_per_s": _peak_chunks_per_second(ok),
        "max_concurrent_requests": _peak_concurrency(ok),
    }
    for name in percentile_metrics:
        result |= _stats_ms(samples[name], percentiles, f"_{name}_ms")
    # Failed requests: how fast they failed (a refusal under overload should take milliseconds).
    result |= _stats_ms([r.latency for r in failed], percentiles, "_error_ms")
    # How the successful requests were answered, and the TTFT of each kind (a cache hit or a
    # coalesced request against one generated for itself).
    result["answers"] = dict(Counter(r.answer for r in ok))
    result["ttft_ms_by_answer"] = {
        kind: _stats_ms([r.ttft for r in ok if r.answer == kind], percentiles) for kind in sorted(result["answers"])
    }
    # Streams the gateway moved to another worker mid-stream, and the pause each splice cost.
    result["migrated"] = sum(1 for r in ok if r.splice_gaps)
    result |= _stats_ms([g for r in ok for g in r.splice_gaps], percentiles, "_splice_gap_ms")
    result["errors"] = dict(Counter(r.error_code for r in failed))
    result["error_ms_by_code"] = {
        code: _stats_ms([r.latency for r in failed if r.error_code == code], percentiles)
        for code in sorted(result["errors"])
    }
    result["error_samples"] = {r.error_code: r.error for r in reversed(failed)}
    result["input_lens"] = [r.prompt_len for r in results]
    result["output_lens"] = output_lens
    result["ttfts"] = [r.ttft for r in results]
    result["itls"] = [r.itl for r in results]
    result["answer_digests"] = [r.digest for r in results]  # "" for a failed request
    result["splices"] = [len(r.splice_gaps) for r in results]  # times each stream moved to another worker
    result[TIMINGS] = _timings(results)
    return result


# What --save-detailed adds to the saved result: one entry per request (MBs for a large run).
TIMINGS = "timings"  # the compact per-request timings `meshserve plot` reads; --plot alone keeps them
PER_REQUEST_FIELDS = ("input_lens", "output_lens", "ttfts", "itls", "answer_digests", "splices", TIMINGS)

# An ITL CDF needs no more points than this (a plot is ~500 pixels wide), where a long run has
# hundreds of thousands of gaps: the saved ones are this many evenly spaced order statistics.
MAX_SAVED_ITLS = 2_000


def _ms(seconds: Any) -> list[float]:
    """Milliseconds rounded to 0.1 ms: about 5 characters each in the saved JSON."""
    return np.round(np.asarray(seconds, dtype=float) * 1000, 1).tolist()


def _timings(results: Sequence[RequestResult]) -> dict[str, Any]:
    """Each request's send time (from the first send), TTFT, latency, output tokens and success as
    parallel lists, and the successful requests' inter-token gaps, sorted and thinned to at most
    ``MAX_SAVED_ITLS`` (``itl_count`` says how many there were): enough to plot a run again."""
    origin = min((r.start_time for r in results), default=0.0)
    gaps = np.sort([gap for r in results if r.success for gap in r.itl])
    count = len(gaps)
    if count > MAX_SAVED_ITLS:
        gaps = gaps[np.linspace(0, count - 1, MAX_SAVED_ITLS).round().astype(int)]
    return {
        "start_ms": _ms([r.start_time - origin for r in results]),
        "ttft_ms": _ms([r.ttft for r in results]),
        "latency_ms": _ms([r.latency for r in results]),
        "output_tokens": [r.output_tokens if r.success else 0 for r in results],
        "success": [r.success for r in results],
        "itl_ms": _ms(gaps),
        "itl_count": count,
    }


# A list of numbers or booleans as json.dumps(indent=2) writes it: one item per line.
_SCALAR_LIST = re.compile(r"\[\n\s+([^\[\]{}\"]*?)\n\s*\]")


def save_result(result: dict[str, Any], path: Path, detailed: bool = False, timings: bool = False) -> None:
    """Writes the result as indented JSON: the summary, and all ``PER_REQUEST_FIELDS`` when
    ``detailed`` (as vllm bench serve: only when asked) or just the compact ``timings``. Lists of
    numbers go on one line each: timings are thousands of numbers, and results get committed."""
    kept = set(PER_REQUEST_FIELDS) if detailed else {TIMINGS} if timings else set()
    saved = {k: v for k, v in result.items() if k not in PER_REQUEST_FIELDS or k in kept}
    text = _SCALAR_LIST.sub(lambda m: "[" + " ".join(m.group(1).split()) + "]", json.dumps(saved, indent=2))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")


def _stats_ms(seconds: Sequence[float], percentiles: Sequence[float], suffix: str = "") -> dict[str, float]:
    """Mean, median, std and ``p<N>`` of ``seconds`` in ms, keyed ``<stat><suffix>``; zeros if empty."""
    values = np.asarray(seconds or [0.0]) * 1000
    stats = {
        f"mean{suffix}": float(np.mean(values)),
        f"median{suffix}": float(np.median(values)),
        f"std{suffix}": float(np.std(values)),
    }
    for p in percentiles:
        stats[f"p{_pkey(p)}{suffix}"] = float(np.percentile(values, p))
    return stats


def _peak_chunks_per_second(ok: Sequence[RequestResult]) -> float:
    """Most streamed text chunks in any one wall-clock second (vLLM's peak output throughput)."""
    if not ok:
        return 0.0
    origin = min(r.start_time for r in ok)
    buckets: Counter[int] = Counter()
    for r in ok:
        t = r.start_time + r.ttft
        buckets[int(t - origin)] += 1
        for gap in r.itl:
            t += gap
            buckets[int(t - origin)] += 1
    return float(max(buckets.values()))


def _peak_concurrency(ok: Sequence[RequestResult]) -> int:
    events = sorted([(r.start_time, 1) for r in ok] + [(r.start_time + r.latency, -1) for r in ok])
    peak = current = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def format_summary(
    result: dict[str, Any], percentile_metrics: Sequence[str], percentiles: Sequence[float]
) -> str:
    """vLLM's summary table."""
    lines = ["{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="=")]

    def row(label: str, value: Any, fmt: str = "{:<10}") -> None:
        lines.append("{:<40} ".format(label) + fmt.format(value))

    row("Successful requests:", result["completed"])
    row("Failed requests:", result["failed"])
    if result.get("max_concurrency") is not None:
        row("Maximum request concurrency:", result["max_concurrency"])
    if result.get("request_rate") is not None:
        row("Request rate configured (RPS):", result["request_rate"], "{:<10.2f}")
    row("Benchmark duration (s):", result["duration"], "{:<10.2f}")
    row("Total input tokens:", result["total_input_tokens"])
    row("Total generated tokens:", result["total_output_tokens"])
    row("Request throughput (req/s):", result["request_throughput"], "{:<10.2f}")
    row("Output token throughput (tok/s):", result["output_throughput"], "{:<10.2f}")
    row("Peak output token throughput (tok/s):", result["max_output_tokens_per_s"], "{:<10.2f}")
    row("Peak concurrent requests:", result["max_concurrent_requests"], "{:<10.2f}")
    row("Total Token throughput (tok/s):", result["total_token_throughput"], "{:<10.2f}")
    for name in percentile_metrics:
        lines.append("{s:{c}^{n}}".format(s=METRIC_HEADERS[name], n=50, c="-"))
        short = name.upper()
        row(f"Mean {short} (ms):", result[f"mean_{name}_ms"], "{:<10.2f}")
        row(f"Median {short} (ms):", result[f"median_{name}_ms"], "{:<10.2f}")
        for p in percentiles:
            row(f"P{_pkey(p)} {short} (ms):", result[f"p{_pkey(p)}_{name}_ms"], "{:<10.2f}")
    if set(result.get("answers", {})) - {GENERATED}:
        lines.append("{s:{c}^{n}}".format(s="Answered by (TTFT ms)", n=50, c="-"))
        for kind, count in sorted(result["answers"].items()):
            ttft = result["ttft_ms_by_answer"][kind]
            tails = ", ".join(f"p{_pkey(p)} {ttft[f'p{_pkey(p)}']:.2f}" for p in percentiles)
            row(f"{kind}:", f"{count} (median {ttft['median']:.2f}, {tails})", "{}")
    if result.get("migrated"):
        lines.append("{s:{c}^{n}}".format(s="Migrated mid-stream", n=50, c="-"))
        row("Streams moved to another worker:", result["migrated"])
        row("Median pause at the splice (ms):", result["median_splice_gap_ms"], "{:<10.2f}")
        for p in percentiles:
            row(f"P{_pkey(p)} pause at the splice (ms):", result[f"p{_pkey(p)}_splice_gap_ms"], "{:<10.2f}")
    if result["errors"]:
        lines.append("{s:{c}^{n}}".format(s="Time to Error (failed requests)", n=50, c="-"))
        row("Mean time to error (ms):", result["mean_error_ms"], "{:<10.2f}")
        row("Median time to error (ms):", result["median_error_ms"], "{:<10.2f}")
        for p in percentiles:
            row(f"P{_pkey(p)} time to error (ms):", result[f"p{_pkey(p)}_error_ms"], "{:<10.2f}")
        lines.append("{s:{c}^{n}}".format(s="Failures by status code", n=50, c="-"))
        for code, count in sorted(result["errors"].items()):
            by_code = result["error_ms_by_code"][code]
            tails = ", ".join(f"p{_pkey(p)} {by_code[f'p{_pkey(p)}']:.2f}" for p in percentiles)
            row(f"{code}:", f"{count} (time to error ms: median {by_code['median']:.2f}, {tails})", "{}")
            lines.append(f"  e.g. {result['error_samples'][code][:200]}")
    lines.append("=" * 50)
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Running
# ---------------------------------------------------------------------------------------------


_positive_int = config.at_least(int, 1)
_non_negative_float = config.at_least(float, 0.0)
_non_negative_int = config.at_least(int, 0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    target.add_argument("--target", default="127.0.0.1:8080", help="HOST:PORT to load (default: Envoy)")
    target.add_argument(
        "--service",
        choices=["inference", "worker"],
        default="inference",
        help="inference: the mesh's public Inference/Generate; worker: one worker's Worker/Generate",
    )
    target.add_argument("--num-channels", type=_positive_int, default=None,
                        help="gRPC connections to spread streams over "
                        f"(default: one per {STREAMS_PER_CHANNEL} concurrent streams)")
    target.add_argument("--timeout", type=float, default=600.0, help="per-request deadline, seconds")
    target.add_argument("--model", default="", help="model name to send (must match the served one)")

    load = parser.add_argument_group("load")
    load.add_argument("--num-prompts", type=_positive_int, default=1000, help="number of requests")
    load.add_argument("--max-concurrency", type=_positive_int, default=None,
                      help="most requests in flight at once (default: no limit)")
    load.add_argument("--request-rate", type=float, default=float("inf"),
                      help="requests per second, Poisson arrivals; inf sends all at once")
    load.add_argument("--burstiness", type=float, default=1.0,
                      help="gamma shape of inter-arrival times: 1 is Poisson, <1 burstier, >1 more regular")
    load.add_argument("--num-warmups", type=int, default=0, help="untimed requests sent before the benchmark")
    load.add_argument("--seed", type=int, default=0, help="seed of the prompts and arrival times")
    load.add_argument("--honor-retry-after", action="store_true",
                      help="a refused user waits the refusal's retry-after before its next request "
                           "(as the OpenAI SDK does); default: it sends the next one at once")

    parser.add_argument("--dataset-name", default="random",
                        choices=["random", "prefix_repetition", "multi_turn", "repeats"],
                        help="the prompts: random words, shared prefixes plus random suffixes, or "
                             "conversations (closed loop: each turn after the previous answer)")
    data = parser.add_argument_group("random dataset")
    data.add_argument("--random-input-len", type=_positive_int, default=1024,
                      help="prompt length in words (about one token each)")
    data.add_argument("--random-output-len", type=_positive_int, default=128, help="max_tokens per request")
    data.add_argument("--random-range-ratio", type=float, default=0.0,
                      help="lengths are uniform in [len * (1 - r), len * (1 + r)], 0 <= r < 1")
    data.add_argument("--random-distinct-prompts", type=int, default=0,
                      help="only this many different requests, sent in turn (0: every request differs); "
                           "1 with --allow-cache: a burst of identical requests, coalesced by the gateway")
    data.add_argument("--random-prefix-len", type=int, default=0,
                      help="words of a prefix shared by every prompt")

    rep = parser.add_argument_group("prefix_repetition dataset (vLLM's flag names)")
    rep.add_argument("--prefix-repetition-num-prefixes", type=_positive_int, default=10,
                     help="distinct prefixes, each shared by an equal share of the requests")
    rep.add_argument("--prefix-repetition-prefix-len", type=_positive_int, default=256, help="words per prefix")
    rep.add_argument("--prefix-repetition-suffix-len", type=_positive_int, default=256,
                     help="random words after the prefix, per request")
    rep.add_argument("--prefix-repetition-output-len", type=_positive_int, default=128, help="max_tokens per request")
    rep.add_argument("--prefix-repetition-hot-share", type=float, default=0.0,
                     help="fraction of the requests that share the first prefix (a hot prompt; not in vLLM)")
    turns = parser.add_argument_group("multi_turn dataset (--num-prompts, --max-concurrency and the "
                                      "request rate do not apply: the users are the load)")
    turns.add_argument("--multi-turn-num-users", type=_positive_int, default=100, help="concurrent users")
    turns.add_argument("--multi-turn-num-turns", type=_positive_int, default=5, help="turns per conversation")
    turns.add_argument("--multi-turn-system-prompt-len", type=_non_negative_int, default=200,
                       help="words of the system prompt all users share")
    turns.add_argument("--multi-turn-question-len", type=_positive_int, default=32, help="words per question")
    turns.add_argument("--multi-turn-user-history-len", type=_non_negative_int, default=0,
                       help="words of each user's own history before its first question, repeated in every turn "
                            "(production-stack's --user-history-prompt; 0: none)")
    turns.add_argument("--multi-turn-output-len", type=_positive_int, default=32, help="max_tokens per answer")
    turns.add_argument("--multi-turn-think-time", type=_non_negative_float, default=0.0,
                       help="seconds a user waits between an answer and the next question")
    turns.add_argument("--multi-turn-ramp-up", type=_non_negative_float, default=0.0,
                       help="seconds over which the users join, one after another (0: all at once)")
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    sampling.add_argument("--top-p", type=float, default=None, help="nucleus sampling top-p")
    sampling.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                          help="generate exactly the requested output length")
    sampling.add_argument("--stream-interval", type=_positive_int, default=None,
                          help="tokens per streamed chunk after the first (default: the worker's)")
    sampling.add_argument("--allow-cache", action="store_true",
                          help="let the mesh answer from its response cache (default: skip_cache=true)")
    sampling.add_argument("--cache", choices=["off", "exact", "semantic"], default=None,
                          help="the requests' cache mode (implies --allow-cache unless off)")
    reps = parser.add_argument_group("repeats dataset (questions asked again, some in other words)")
    reps.add_argument("--repeats-share", type=float, default=0.2, help="fraction of requests that repeat an earlier one")
    reps.add_argument("--repeats-paraphrase-share", type=float, default=0.5,
                      help="fraction of the repeats in other words (the rest word for word)")
    reps.add_argument("--repeats-pairs", type=Path, default=DEFAULT_PAIRS,
                      help="labelled pairs (JSON lines a, b, label) the questions and paraphrases come from")

    output = parser.add_argument_group("output")
    output.add_argument("--save-result", nargs="?", const=True, default=None, metavar="FILE",
                        help="save the JSON result (to FILE, or --result-filename, or a generated name)")
    output.add_argument("--save-detailed", action="store_true",
                        help="also save the per-request lists (input_lens, output_lens, ttfts, itls, ...)")
    output.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                        help="plot this run to FILE.png (TTFT and ITL CDFs, throughput and requests in "
                             "flight over time); a saved result keeps its timings, for `meshserve plot`")
    output.add_argument("--result-filename", default=None, help="file name of the saved result")
    output.add_argument("--result-dir", default=None, help="folder of the saved result")
    output.add_argument("--metadata", nargs="*", default=[], metavar="KEY=VALUE",
                        help="extra KEY=VALUE pairs recorded in the JSON result")
    output.add_argument("--label", default=None, help="name of this run, recorded and used in the file name")
    output.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el",
                        help="comma-separated metrics to report percentiles of (ttft, tpot, itl, e2el)")
    output.add_argument("--metric-percentiles", default="99",
                        help="comma-separated percentiles, e.g. 50,90,99")
    output.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _parse_metadata(items: Sequence[str]) -> dict[str, str]:
    metadata = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--metadata expects KEY=VALUE, got {item!r}")
        metadata[key] = value
    return metadata


def _check_args(args: argparse.Namespace) -> tuple[list[str], list[float], dict[str, str]]:
    if not 0 <= args.random_range_ratio < 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {args.random_range_ratio}")
    if args.request_rate <= 0:
        raise ValueError(f"--request-rate must be positive, got {args.request_rate}")
    if args.burstiness <= 0:
        raise ValueError(f"--burstiness must be positive, got {args.burstiness}")
    metrics = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    unknown = set(metrics) - set(METRIC_HEADERS)
    if unknown:
        raise ValueError(f"--percentile-metrics: unknown {sorted(unknown)}; use {list(METRIC_HEADERS)}")
    percentiles = [float(p) for p in args.metric_percentiles.split(",") if p.strip()]
    if any(not 0 <= p <= 100 for p in percentiles):
        raise ValueError(f"--metric-percentiles must be in [0, 100], got {args.metric_percentiles}")
    return metrics, percentiles, _parse_metadata(args.metadata)


def _to_proto(req: BenchRequest, request_id: str, args: argparse.Namespace) -> pb.GenerateRequest:
    msg = pb.GenerateRequest(
        prompt=req.prompt,
        max_tokens=req.output_len,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        skip_cache=not (args.allow_cache or args.cache),
        cache=args.cache or "",
        request_id=request_id,
        model=args.model,
    )
    if args.top_p is not None:
        msg.top_p = args.top_p
    if args.stream_interval is not None:
        msg.stream_interval = args.stream_interval
    return msg


def turn_opener(stubs: Sequence[Any], args: argparse.Namespace) -> OpenTurn:
    """Opens conversation turns as chat requests, spread over the channels' stubs."""
    turns = 0

    def open_turn(messages: list[pb.ChatMessage], request_id: str, output_len: int) -> OpenStream:
        nonlocal turns
        msg = _to_proto(BenchRequest("", 0, output_len), request_id, args)
        msg.ClearField("prompt")
        msg.messages.extend(messages)
        msg.user = request_id.rsplit("-t", 1)[0]  # the conversation: session-affinity's key
        turns += 1
        return partial(stubs[turns % len(stubs)].Generate, msg, timeout=args.timeout)

    return open_turn


async def _run_all(
    streams: Sequence[tuple[OpenStream, int]],
    offsets: Sequence[float],
    max_concurrency: int | None,
    on_done: Callable[[], None] = lambda: None,
    honor_retry_after: bool = False,
) -> tuple[list[RequestResult], float]:
    """Opens each (stream, prompt length) at its offset, at most ``max_concurrency`` at once.
    With ``honor_retry_after``, a refused request's user waits the refusal's retry-after before
    it sends its next request, as the OpenAI SDK and well-behaved clients do.

    Returns the results in request order and the duration from the first send to the last end.
    """
    semaphore = asyncio.Semaphore(max_concurrency or len(streams) or 1)

    async def one(open_stream: OpenStream, prompt_len: int) -> RequestResult:
        async with semaphore:
            result = await measure(open_stream, prompt_len)
            on_done()
            if honor_retry_after and result.retry_after:
                await backoff(result.retry_after)  # the user backs off, holding its place
        return result

    start = time.perf_counter()
    tasks: list[asyncio.Task[RequestResult]] = []
    for (open_stream, prompt_len), offset in zip(streams, offsets):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(open_stream, prompt_len)))
    results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


async def _connect(channel: grpc.aio.Channel) -> None:
    """Waits until the channel is connected; a refused connection fails at once, not at the timeout."""
    state = channel.get_state(try_to_connect=True)
    while state != grpc.ChannelConnectivity.READY:
        if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            raise ConnectionError(f"connection failed ({state.name})")
        await channel.wait_for_state_change(state)
        state = channel.get_state(try_to_connect=True)


def _result_path(args: argparse.Namespace, date: str) -> Path:
    if isinstance(args.save_result, str):
        name = args.save_result
    elif args.result_filename:
        name = args.result_filename
    else:
        concurrency = f"-concurrency{args.max_concurrency}" if args.max_concurrency else ""
        name = f"{args.label or 'meshserve'}-{args.service}-{args.request_rate}qps{concurrency}-{date}.json"
    return Path(args.result_dir or ".") / name


def _run_info(args: argparse.Namespace, num_channels: int, date: str) -> dict[str, Any]:
    """What was run, recorded next to the measurements."""
    return {
        "date": date,
        "target": args.target,
        "service": args.service,
        "label": args.label,
        "num_prompts": args.num_prompts,
        # JSON has no infinity.
        "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",
        "burstiness": args.burstiness,
        "honor_retry_after": args.honor_retry_after,
        "max_concurrency": args.max_concurrency,
        "num_channels": num_channels,
        "dataset_name": args.dataset_name,
        **{k: getattr(args, k) for k in vars(args)
           if k.startswith(("prefix_repetition_", "multi_turn_")) and k.startswith(args.dataset_name)},
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio,
        "random_prefix_len": args.random_prefix_len,
        "temperature": args.temperature,
        "ignore_eos": args.ignore_eos,
        "stream_interval": args.stream_interval,
        "skip_cache": not (args.allow_cache or args.cache),
        "cache": args.cache or "",
        "num_warmups": args.num_warmups,
        "seed": args.seed,
    }


async def run(args: argparse.Namespace) -> int:
    """The body of ``main``: connect, warm up, run the benchmark, print and save the result."""
    try:
        metrics, percentiles, metadata = _check_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    # 1. The workload, fixed by the seed; arrivals draw from their own stream so changing the
    #    rate does not change the prompts.
    conversations: list[Conversation] = []
    if args.dataset_name == "multi_turn":
        conversations = multi_turn_conversations(
            args.multi_turn_num_users, args.multi_turn_num_turns, args.multi_turn_system_prompt_len,
            args.multi_turn_question_len, args.multi_turn_output_len, random.Random(args.seed),
            args.multi_turn_user_history_len,
        )
        requests: list[BenchRequest] = []
        warmups: list[BenchRequest] = []
    else:
        requests = workload(args, args.num_prompts + args.num_warmups)
        warmups, requests = requests[: args.num_warmups], requests[args.num_warmups :]
    arrivals_rng = random.Random(f"arrivals-{args.seed}")
    offsets = arrival_offsets(len(requests), args.request_rate, arrivals_rng, args.burstiness)
    run_id = uuid.uuid4().hex[:8]

    # 2. Channels: separate connections (a local subchannel pool each; channels with equal
    #    arguments otherwise share one), so no HTTP/2 connection carries more streams than a
    #    proxy allows on one.
    concurrency = len(conversations) or args.max_concurrency or args.num_prompts
    num_channels = args.num_channels or max(1, math.ceil(concurrency / STREAMS_PER_CHANNEL))
    options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.aio.insecure_channel(args.target, options=options) for _ in range(num_channels)]
    stub_cls = pb_grpc.InferenceStub if args.service == "inference" else pb_grpc.WorkerStub
    stubs = [stub_cls(ch) for ch in channels]

    def streams(requests: Sequence[BenchRequest], id_prefix: str) -> list[tuple[OpenStream, int]]:
        out = []
        for i, r in enumerate(requests):
            msg, stub = _to_proto(r, f"{id_prefix}-{i}", args), stubs[i % num_channels]
            out.append((partial(stub.Generate, msg, timeout=args.timeout), r.prompt_len))
        return out

    try:
        try:
            connect = asyncio.gather(*(_connect(ch) for ch in channels))
            await asyncio.wait_for(connect, timeout=min(args.timeout, 10))
        except (TimeoutError, ConnectionError):
            print(f"error: cannot connect to {args.target}", file=sys.stderr)
            return 1

        # 3. Warm-up, untimed.
        if warmups:
            print(f"Warming up with {len(warmups)} requests...", file=sys.stderr)
            warm, _ = await _run_all(
                streams(warmups, f"bench-{run_id}-warmup"), [0.0] * len(warmups), args.max_concurrency
            )
            failed = [r for r in warm if not r.success]
            if failed:
                print(f"warning: {len(failed)} warm-up requests failed, e.g. {failed[0].error_code}: "
                      f"{failed[0].error}", file=sys.stderr)  # fmt: skip

        # 4. The benchmark.
        print(f"Target: {args.target} ({args.service}), request rate: {args.request_rate}, "
              f"burstiness: {args.burstiness}, max concurrency: {args.max_concurrency}, "
              f"channels: {num_channels}", file=sys.stderr)  # fmt: skip
        from tqdm import tqdm

        total = sum(len(c.questions) for c in conversations) or len(requests)
        with tqdm(total=total, disable=args.disable_tqdm) as pbar:
            if conversations:
                results, duration = await run_conversations(
                    conversations, turn_opener(stubs, args), args.multi_turn_think_time,
                    lambda: pbar.update(1), f"bench-{run_id}", args.multi_turn_ramp_up,
                )
            else:
                results, duration = await _run_all(
                    streams(requests, f"bench-{run_id}"), offsets, args.max_concurrency, lambda: pbar.update(1),
                    args.honor_retry_after,
                )
    finally:
        await asyncio.gather(*(ch.close() for ch in channels))

    # 5. Report.
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    result = summarize(results, duration, metrics, percentiles) | _run_info(args, num_channels, date)
    for key, value in metadata.items():
        if key in result:
            log.warning("--metadata %s would overwrite a recorded field; ignored", key)
        else:
            result[key] = value
    print(format_summary({**result, "request_rate": args.request_rate}, metrics, percentiles))
    if result["completed"] == 0:
        print("error: every request failed", file=sys.stderr)
    if args.save_result or args.result_filename:
        path = _result_path(args, date)
        # With --plot the timings are kept, so that `meshserve plot` can draw this run again.
        save_result(result, path, detailed=args.save_detailed, timings=args.plot is not None)
        print(f"Result saved to {path}", file=sys.stderr)
    if args.plot:
        from commands import plot  # imports matplotlib: only when asked

        plot.plot_runs([(args.label or args.plot.stem, result)], args.plot)
        print(f"Plot saved to {args.plot}", file=sys.stderr)
    return 0 if result["completed"] else 1
