"""Routing benchmark: every policy on the same KV-bound sim fleet, back to back, one seed per run.

For each scenario and each policy (in an order that rotates round to round) it starts
`meshserve up --engine sim --workers 4 --routing POLICY` with the scenario's sim parameters,
runs `meshserve bench` through Envoy, reads each worker's own prefix-cache counters, stops the
mesh and writes one JSON per run (with its per-request timings, for `meshserve plot`) plus
summary.md (medians over rounds, ratios to round-robin).

    .venv/bin/python bench/routing.py OUT_DIR [--rounds 1] [--scenarios prefix,slow,hot]
        [--policies round-robin,prefix-affinity,kv-aware,...] [--tree DIR]
        [--variant "kv-bound1.5=kv-aware --load-bound 1.5" ...]

--tree runs the mesh and the load generator from another source tree (a `git worktree` of the
commit to measure), so the working tree can change while it runs. A --variant is a label, the
policy and extra `meshserve up` flags, run as one more policy.

Scenarios:
  prefix  prefix_repetition: 16 prefixes of 1,000 words (~86 blocks each), 64-word suffixes,
          32 output tokens, 1,200 requests at 300 concurrent; 1,000 KV blocks per worker, about
          a third of the 1,370-block prefix working set beside the running requests' own blocks.
  slow    the same fleet and workload, the fourth worker 2x slower (--sim-speed 1 1 1 0.5).
  hot     one prefix carries half the traffic (the other half spread over the other 15).
  multi   multi_turn: 100 users x 5 turns, a shared 100-word system prompt, 40-word questions,
          32-token answers; each turn sends the whole conversation so far (~550 tokens by the
          fifth), so a user's history is worth keeping on one engine.
  multi-history  the same conversations, each user's first question opening with 1,000 words of
          its own (production-stack's --user-history-prompt: ~1,400 tokens every turn repeats),
          on engines of 4,000 KV blocks and a 4,096-token context (a fifth turn can pass 2,048):
          ~115 blocks a user by the fifth turn, so an engine holds
          the histories of about a third of the users. Every user's first turn is ~1,500 prompt
          tokens no cache holds: 2.4 s of the fleet's prefill when they all start at once, a burst
          that every policy pays; multi-history-ramp lets them join over 5 s instead.
  multi-large  the same conversations on engines 4x slower per token (--sim-speed 0.25: prefill
          0.24 ms a token, ~33 ms a step at 25 sequences, a larger model than the sim's 8B
          default), so the engines' time, not the mesh's CPU on a small machine, is most of TTFT.

Each run also records the engines' own mean TTFT (the workers' vllm:time_to_first_token_seconds:
queueing and prefill, which routing controls) beside the client's, and ``worker_samples``: four
times a second, each worker's running and waiting requests, KV-cache usage and preemptions (a
worker whose cache is full with few requests running holds too many distinct prefixes).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from meshserve.loadgen.mesh import by_name, cli, meshserve_up, policy_runs, samples, tree_env
from meshserve.loadgen.results import TIMINGS, save_result
from meshserve.services.config import ROUTING_POLICIES

REPO = Path(__file__).resolve().parent.parent

PORT, ADMIN_PORT = 8380, 9981
# The services' ports lie below Linux's ephemeral range (32768-60999): a run's many short
# connections (the load sampler's scrapes among them) can hold a port in that range as their own
# end when the next run's services bind theirs (seen once: the router's 50352 "in use").
FLEET = ["--engine", "sim", "--workers", "4", "--sim-num-kv-blocks", "1000", "--no-tracing",
         "--port", str(PORT), "--admin-port", str(ADMIN_PORT), "--gateway-port", "30351",
         "--router-port", "30352", "--cache-port", "30353", "--worker-port", "30361",
         "--redis-port", "6389", "--trace-port", "4397"]
PREFIX_BENCH = ["--dataset-name", "prefix_repetition", "--prefix-repetition-num-prefixes", "16",
                "--prefix-repetition-prefix-len", "1000", "--prefix-repetition-suffix-len", "64",
                "--prefix-repetition-output-len", "32", "--num-prompts", "1200",
                "--max-concurrency", "300"]


@dataclass(frozen=True)
class Scenario:
    name: str
    up: list[str] = field(default_factory=list)
    bench: list[str] = field(default_factory=list)


MULTI_BENCH = ["--dataset-name", "multi_turn", "--multi-turn-num-users", "100", "--multi-turn-num-turns", "5",
               "--multi-turn-system-prompt-len", "100", "--multi-turn-question-len", "40",
               "--multi-turn-output-len", "32"]

# Each user brings 1,000 words of its own (production-stack's user history prompt), on engines
# whose KV cache holds about a third of the users' histories each.
HISTORY_FLEET = ["--sim-num-kv-blocks", "4000", "--max-model-len", "4096"]
HISTORY_BENCH = [*MULTI_BENCH, "--multi-turn-user-history-len", "1000"]

SCENARIOS = {
    "prefix": Scenario("prefix", [], PREFIX_BENCH),
    "slow": Scenario("slow", ["--sim-speed", "1", "1", "1", "0.5"], PREFIX_BENCH),
    "hot": Scenario("hot", [], [*PREFIX_BENCH, "--prefix-repetition-hot-share", "0.5"]),
    "multi": Scenario("multi", [], MULTI_BENCH),
    "multi-large": Scenario("multi-large", ["--sim-speed", "0.25"], MULTI_BENCH),
    "multi-ramp": Scenario("multi-ramp", [], [*MULTI_BENCH, "--multi-turn-ramp-up", "0.5"]),
    "multi-large-ramp": Scenario("multi-large-ramp", ["--sim-speed", "0.25"], [*MULTI_BENCH, "--multi-turn-ramp-up", "2"]),
    "multi-history": Scenario("multi-history", HISTORY_FLEET, HISTORY_BENCH),
    "multi-history-ramp": Scenario("multi-history-ramp", HISTORY_FLEET, [*HISTORY_BENCH, "--multi-turn-ramp-up", "5"]),
}
HEADLINE = ["output_throughput", "median_ttft_ms", "p99_ttft_ms", "mean_ttft_ms", "failed"]


DETAIL_SERIES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:num_preemptions_total")
WORKER_SERIES = ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
                 "vllm:time_to_first_token_seconds_sum", "vllm:time_to_first_token_seconds_count")
GATEWAY_SERIES = ("meshserve_gateway_time_to_first_token_seconds_sum", "meshserve_gateway_time_to_first_token_seconds_count")


def worker_stats(metrics_urls: list[str], series: tuple[str, ...] = WORKER_SERIES) -> dict[str, float]:
    """The sums of ``series`` over the services at ``metrics_urls``: by default the workers' own
    prefix-cache counters (prompt tokens queried and hit), preemptions (KV cache full) and
    time-to-first-token histograms (from the engine's arrival to its first token)."""
    out = dict.fromkeys(series, 0.0)
    for url in metrics_urls:
        sums = by_name(url)
        for name in out:
            out[name] += sums.get(name, 0.0)
    return out


def mean_ms(delta: dict[str, float], histogram: str) -> float:
    """The mean of ``histogram``'s observations in ``delta`` (its _sum and _count), in ms; 0 for none."""
    count = delta[f"{histogram}_count"]
    return 1000 * delta[f"{histogram}_sum"] / count if count else 0.0


class LoadSampler(threading.Thread):
    """Samples each worker's outstanding requests (running + waiting, its own gauges) 4 times a
    second while the benchmark runs."""

    def __init__(self, metrics_urls: list[str]) -> None:
        super().__init__(daemon=True)
        self.urls = metrics_urls
        self.samples: list[list[float]] = []
        # Each sample's time and, per worker, DETAIL_SERIES (saved with the run: which worker
        # queued, how full its KV cache was, when it preempted).
        self.detail: list[dict] = []
        self.stop = threading.Event()

    def run(self) -> None:
        started = time.monotonic()
        while not self.stop.wait(0.25):
            row, detail = [], []
            for url in self.urls:
                try:
                    found = samples(url)
                except OSError:  # the mesh is stopping
                    return
                series = {name: sum(v for k, v in found.items() if k.startswith(name)) for name in DETAIL_SERIES}
                row.append(series["vllm:num_requests_running"] + series["vllm:num_requests_waiting"])
                detail.append([round(series[name], 3) for name in DETAIL_SERIES])
            self.samples.append(row)
            self.detail.append({"t_s": round(time.monotonic() - started, 2), "workers": detail})

    def imbalance(self) -> float:
        """The busiest worker's mean outstanding requests over the fleet's mean (1: balanced),
        over the samples when the fleet held at least one request per worker."""
        busy = [r for r in self.samples if sum(r) >= len(r)]
        if not busy:
            return 0.0
        means = [statistics.mean(col) for col in zip(*busy)]
        return max(means) / statistics.mean(means)


def pick_quantile_ms(metrics_url: str, histogram: str = "meshserve_router_pick_seconds", q: float = 0.99) -> float:
    """A quantile of a pick-time histogram (the bound of the bucket holding it), in ms: the
    router's own pick time, or the gateway's wait for its answer (meshserve_gateway_pick_seconds)."""
    buckets = [(float(key.split('le="')[1].split('"')[0]), count)
               for key, count in samples(metrics_url).items() if key.startswith(f"{histogram}_bucket")]
    if not buckets or not buckets[-1][1]:
        return 0.0
    total = buckets[-1][1]
    return 1000 * next(bound for bound, count in buckets if count >= q * total)


def pick_mean_ms(metrics_url: str, histogram: str = "meshserve_router_pick_seconds") -> float:
    """The mean of a pick-time histogram (its sum over its count), in ms: finer than its buckets."""
    found = samples(metrics_url)
    count = found.get(f"{histogram}_count", 0.0)
    return 1000 * found[f"{histogram}_sum"] / count if count else 0.0


def run_one(out: Path, scenario: Scenario, label: str, up_args: list[str], seed: int, tree: Path) -> dict:
    run_dir = out / "runs" / f"{scenario.name}-{label}-s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    logs = tempfile.mkdtemp(prefix=f"routing-{scenario.name}-{label}-")  # the mesh's logs stay out of results
    with meshserve_up([*FLEET, *scenario.up, *up_args], logs, tree) as mesh:
        metrics = mesh.worker_metrics()
        router_metrics = mesh.metrics("router")
        gateway_metrics = mesh.metrics("gateway")
        before = worker_stats(metrics)
        gateway_before = worker_stats([gateway_metrics], GATEWAY_SERIES)
        result_file = run_dir / "bench.json"
        sampler = LoadSampler(metrics)
        sampler.start()
        subprocess.run([*cli(tree), "bench", "--target", f"127.0.0.1:{PORT}",
                        *scenario.bench, "--seed", str(seed), "--disable-tqdm", "--label", label,
                        "--save-result", str(result_file.resolve()), "--plot", f"{logs}/bench.png"],
                       check=True, stdout=subprocess.DEVNULL,
                       cwd=tree, env=tree_env(tree))
        sampler.stop.set()
        sampler.join()
        after = worker_stats(metrics)
        gateway_after = worker_stats([gateway_metrics], GATEWAY_SERIES)
        result = json.loads(result_file.read_text())
        result["load_imbalance"] = sampler.imbalance()
        result["worker_samples"] = {"series": list(DETAIL_SERIES), "samples": sampler.detail}
        result["router_pick_p99_ms"] = pick_quantile_ms(router_metrics)
        result["router_pick_mean_ms"] = pick_mean_ms(router_metrics)
        result["gateway_pick_mean_ms"] = pick_mean_ms(gateway_metrics, "meshserve_gateway_pick_seconds")
        for q in (50, 90, 99):
            result[f"gateway_pick_p{q}_ms"] = pick_quantile_ms(gateway_metrics, "meshserve_gateway_pick_seconds", q / 100)
        delta = {k: after[k] - before[k] for k in WORKER_SERIES}
        queries = delta["vllm:prefix_cache_queries_total"]
        result["engine_prefix_hit_rate"] = delta["vllm:prefix_cache_hits_total"] / queries if queries else 0.0
        # What routing controls (queueing and prefill in the engines) apart from the mesh's own
        # time before and after them, which on a small machine is most of a client's TTFT.
        result["engine_mean_ttft_ms"] = mean_ms(delta, "vllm:time_to_first_token_seconds")
        result["engine_preemptions"] = delta["vllm:num_preemptions_total"]
        # The gateway's own TTFT (from its handler to the first token it sent): the client's less
        # this is Envoy's and the load generator's part, this less the engines' the mesh's.
        gateway_delta = {k: gateway_after[k] - gateway_before[k] for k in GATEWAY_SERIES}
        result["gateway_mean_ttft_ms"] = mean_ms(gateway_delta, "meshserve_gateway_time_to_first_token_seconds")
        save_result(result, result_file, timings=True)  # `meshserve plot` draws runs side by side
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--first-round", type=int, default=0, help="number the rounds from here (new seeds)")
    parser.add_argument("--scenarios", default="prefix,slow,hot")
    parser.add_argument("--policies", default=",".join(p for p in ROUTING_POLICIES if p != "session-affinity"))
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=POLICY [FLAGS]")
    parser.add_argument("--tree", type=Path, default=REPO, help="source tree to run (default: this one)")
    args = parser.parse_args()
    scenarios = [SCENARIOS[s] for s in args.scenarios.split(",")]
    runs = policy_runs(args.policies, args.variant)
    policies = list(runs)
    tree = args.tree.resolve()
    rows: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.first_round, args.first_round + args.rounds):
        for scenario in scenarios:
            seed = 1000 * r + len(scenario.name)
            order = policies[r % len(policies):] + policies[: r % len(policies)]
            for policy in order:
                started = time.monotonic()
                result = run_one(args.out, scenario, policy, runs[policy], seed, tree)
                rows.setdefault((scenario.name, policy), []).append(result)
                print(f"round {r + 1} {scenario.name:<7} {policy:<16} "
                      + " ".join(f"{k} {result[k]:.1f}" for k in HEADLINE)
                      + f" hit {result['engine_prefix_hit_rate']:.2f} imbalance {result['load_imbalance']:.2f}"
                      + f" engine mean TTFT {result['engine_mean_ttft_ms']:.1f} ms"
                      + f" preemptions {result['engine_preemptions']:.0f}"
                      + f" pick p99 {result['router_pick_p99_ms']:.2f} ms, mean {result['router_pick_mean_ms']:.3f} ms"
                      + f" (gateway p50 / p90 / p99 {result['gateway_pick_p50_ms']:.1f} / "
                        f"{result['gateway_pick_p90_ms']:.1f} / {result['gateway_pick_p99_ms']:.1f},"
                        f" mean {result['gateway_pick_mean_ms']:.1f})"
                      + f" ({time.monotonic() - started:.0f}s)",
                      flush=True)
    # The runs' summaries; their per-request timings stay in each run's own file.
    brief = {f"{s}/{p}": [{k: v for k, v in r.items() if k != TIMINGS} for r in v] for (s, p), v in rows.items()}
    (args.out / "rows.json").write_text(json.dumps(brief, indent=1))
    (args.out / "summary.md").write_text(summary(rows, scenarios, policies))
    print(summary(rows, scenarios, policies))
    return 0


def summary(rows: dict[tuple[str, str], list[dict]], scenarios: list[Scenario], policies: list[str]) -> str:
    keys = [*HEADLINE, "gateway_mean_ttft_ms", "engine_mean_ttft_ms", "engine_prefix_hit_rate", "load_imbalance"]
    lines = []
    for scenario in scenarios:
        lines += [f"### {scenario.name}", "",
                  "| policy | output tok/s | median TTFT ms | p99 TTFT ms | mean TTFT ms | gateway mean TTFT ms | "
                  "engine mean TTFT ms | "
                  "failed | engine prefix hit rate | busiest worker / mean | p99 TTFT / round-robin | "
                  "mean TTFT / round-robin | engine mean TTFT / round-robin | tok/s / round-robin |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        med = {p: {k: statistics.median(r.get(k, 0.0) for r in rows[(scenario.name, p)]) for k in keys}
               for p in policies if (scenario.name, p) in rows}
        base = med.get("round-robin")
        for p, m in med.items():
            ratios = " | ".join(
                f"{m[k] / base[k]:.2f}" if base and base[k] else "-"
                for k in ("p99_ttft_ms", "mean_ttft_ms", "engine_mean_ttft_ms", "output_throughput")
            )
            lines.append(f"| {p} | {m['output_throughput']:,.0f} | {m['median_ttft_ms']:,.0f} | "
                         f"{m['p99_ttft_ms']:,.0f} | {m['mean_ttft_ms']:,.0f} | {m['gateway_mean_ttft_ms']:,.0f} | "
                         f"{m['engine_mean_ttft_ms']:,.0f} | "
                         f"{m['failed']:.0f} | {m['engine_prefix_hit_rate']:.2f} | {m['load_imbalance']:.2f} | "
                         f"{ratios} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
