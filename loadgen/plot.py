"""Saved load-generator results side by side in one PNG: TTFT and ITL CDFs, output throughput
and requests in flight over time."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from meshserve.loadgen.results import TIMINGS

# Fixed so every PNG is 1200 x 800 pixels.
FIGSIZE_IN = (12.0, 8.0)
DPI = 100


def plot_runs(runs: Sequence[tuple[str, dict[str, Any]]], path: Path) -> None:
    """Draws the (label, result) runs, each in its own colour, into one 2 x 2 figure at ``path``."""
    # A Figure without pyplot renders with Agg: headless, and no global backend or figure registry.
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGSIZE_IN, dpi=DPI, layout="constrained")
    (ttft_ax, itl_ax), (tput_ax, flight_ax) = fig.subplots(2, 2)
    ttfts, itls = [], []
    for i, (label, result) in enumerate(runs):
        t = {k: np.asarray(v) for k, v in result[TIMINGS].items()}
        ok = t["success"].astype(bool)
        style = {"color": f"C{i % 10}", "label": label}
        ttfts.append(t["ttft_ms"][ok])
        itls.append(t["itl_ms"])
        if ttfts[-1].size:
            ttft_ax.ecdf(ttfts[-1], **style)
        if itls[-1].size:
            itl_ax.ecdf(itls[-1], **style)
        tokens_per_s, edges = _throughput(t["start_ms"][ok], t["ttft_ms"][ok], t["latency_ms"][ok],
                                          t["output_tokens"][ok])
        tput_ax.stairs(tokens_per_s, edges, **style)
        flight_ax.step(*_in_flight(t["start_ms"], t["latency_ms"]), where="post", **style)
    ttft_ax.set(title="TTFT CDF", xlabel="ms", ylabel="fraction of requests")
    itl_ax.set(title="Inter-token latency CDF", xlabel="ms", ylabel="fraction of gaps")
    _log_x_if_wide(ttft_ax, ttfts)
    _log_x_if_wide(itl_ax, itls)
    tput_ax.set(title="Output throughput (1 s bins)", xlabel="s since the first request", ylabel="tokens/s")
    flight_ax.set(title="Requests in flight", xlabel="s since the first request", ylabel="requests")
    for ax in (ttft_ax, itl_ax, tput_ax, flight_ax):
        ax.grid(alpha=0.3)
    ttft_ax.legend(loc="lower right")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png", dpi=DPI)


def _throughput(start_ms: np.ndarray, ttft_ms: np.ndarray, latency_ms: np.ndarray,
                tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Tokens per 1 s bin, each request's tokens spread evenly from its first token to its end
    (the saved timings keep no per-token times). Returns the counts and the bin edges (s)."""
    first, end = (start_ms + ttft_ms) / 1000, (start_ms + latency_ms) / 1000
    times = np.concatenate([np.linspace(a, b, n) for a, b, n in zip(first, end, tokens)] or [np.zeros(0)])
    counts, edges = np.histogram(times, bins=np.arange(0.0, np.floor(times.max(initial=0.0)) + 2))
    return counts, edges


def _in_flight(start_ms: np.ndarray, latency_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Requests sent and not yet ended (failed ones too: they held a slot) after each send or end."""
    times = np.concatenate([start_ms, start_ms + latency_ms]) / 1000
    steps = np.concatenate([np.ones(len(start_ms)), -np.ones(len(start_ms))])
    order = np.argsort(times, kind="stable")
    return np.concatenate([[0.0], times[order]]), np.concatenate([[0.0], np.cumsum(steps[order])])


def _log_x_if_wide(ax: Any, values: Sequence[np.ndarray]) -> None:
    """A log x axis when the values span more than a factor of 20 (a p99 far out from the median)."""
    positive = np.concatenate([*values, np.zeros(0)])
    positive = positive[positive > 0]
    if positive.size and positive.max() / positive.min() > 20:
        ax.set_xscale("log")
