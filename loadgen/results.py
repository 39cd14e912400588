"""What a load-generator run measured: each request's result, the run's summary under vLLM's
JSON keys, its saved form (with the compact timings plots read) and vLLM's summary table."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

METRIC_HEADERS = {
    "ttft": "Time to First Token",
    "tpot": "Time per Output Token (excl. 1st token)",
    "itl": "Inter-token Latency",
    "e2el": "End-to-end Latency",
}

GENERATED = "generated"  # an answer generated for the request itself (no cache_kind)


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
    retries: int = 0  # times it was sent again after a refusal's retry-after (--honor-retry-after)
    answer: str = GENERATED  # how it was answered: GENERATED, or the chunks' cache_kind
    digest: str = ""  # of the answer's token ids: equal answers, equal digests (runs compared)
    splice_gaps: list[float] = field(default_factory=list)  # a migrated stream: its pause at each splice


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
    # Refusals a client honouring retry-after came back from (each request timed on its last try).
    result["retries"] = sum(r.retries for r in results)
    result["retried_requests"] = sum(1 for r in results if r.retries)
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
    if result.get("retries"):
        row("Sent again after a refusal (times):", result["retries"])
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

