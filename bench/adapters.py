"""Adapter-aware routing: many LoRA adapters on one sim fleet, the default policy (kv-aware, which
prefers a worker whose adapter slots hold the request's adapter) against round robin, alternated
round by round.

    .venv/bin/python bench/adapters.py OUT_DIR [--rounds 2] [--policies kv-aware,round-robin]
        [--num-prompts 2400] [--up "FLAGS"] [--tree DIR] [--variant "LABEL=POLICY [FLAGS]" ...]

Each run starts `meshserve up --engine sim --workers 4 --enable-lora --max-loras 2` with 8
adapters (--max-cpu-loras left at vLLM's default, --max-loras: the other adapters wait on disk)
and runs `meshserve bench` through Envoy: 300 concurrent users, random 128-token prompts,
64 output tokens, each request naming one adapter with Zipf popularity (the first adapter asked
in proportion to 1, the k-th to 1/k). A worker's two slots hold at most two adapters in its
running batch: a request whose adapter is in neither waits until one is idle, and bringing an
adapter in stalls a step (the sim's LoRA costs, docs/operations.md). Adapter loads are the
workers' meshserve_worker_adapter_loads_total over the run. Writes one JSON per run (the
bench's summary with its per-adapter breakdown, and the loads), rows.json and summary.md
(medians over rounds, ratios to round robin). A --variant is a label, a policy and extra
`meshserve up` flags, run as one more policy; --up adds flags to every run (`--sim-speed 0.25`:
engines 4x slower per token, a larger model than the sim's 8B default, so that the engines'
time and not the mesh's CPU on a small machine is what routing changes).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from meshserve.loadgen.mesh import by_name, cli, meshserve_up, policy_runs, tree_env

REPO = Path(__file__).resolve().parent.parent
PORT, ADMIN_PORT = 8480, 9982
ADAPTERS = [f"adapter{i}" for i in range(8)]
FLEET = ["--engine", "sim", "--workers", "4", "--no-tracing", "--enable-lora", "--max-loras", "2",
         "--lora-modules", *(f"{a}=/adapters/{a}" for a in ADAPTERS),
         "--port", str(PORT), "--admin-port", str(ADMIN_PORT), "--gateway-port", "30451",
         "--router-port", "30452", "--cache-port", "30453", "--worker-port", "30461",
         "--redis-port", "6489", "--trace-port", "4497"]
LOADS = "meshserve_worker_adapter_loads_total"
HEADLINE = ["output_throughput", "median_ttft_ms", "p99_ttft_ms", "completed", "failed", "adapter_loads"]
# What the default policy should reach against round robin (at most / at least these ratios).
TARGETS = {"adapter_loads": ("<=", 0.25), "p99_ttft_ms": ("<=", 0.5), "output_throughput": (">=", 1.3)}


def adapter_loads(metrics_urls: list[str]) -> float:
    return sum(by_name(url).get(LOADS, 0.0) for url in metrics_urls)


def run_one(out: Path, policy: str, up_args: list[str], num_prompts: int, seed: int, tree: Path) -> dict:
    logs = tempfile.mkdtemp(prefix=f"adapters-{policy}-")  # the mesh's logs stay out of results
    result_file = out / "runs" / f"{policy}-s{seed}.json"
    result_file.parent.mkdir(parents=True, exist_ok=True)
    with meshserve_up([*FLEET, *up_args], logs, tree) as mesh:
        metrics = mesh.worker_metrics()
        before = adapter_loads(metrics)
        subprocess.run([*cli(tree), "bench", "--target", f"127.0.0.1:{PORT}", "--num-prompts", str(num_prompts),
                        "--max-concurrency", "300", "--random-input-len", "128", "--random-output-len", "64",
                        "--lora-modules", ",".join(ADAPTERS), "--lora-popularity", "zipf",
                        "--seed", str(seed), "--disable-tqdm", "--label", policy,
                        "--save-result", str(result_file.resolve())],
                       check=True, stdout=subprocess.DEVNULL, cwd=tree, env=tree_env(tree))
        loads = adapter_loads(metrics) - before
    result = json.loads(result_file.read_text())
    result["policy"] = policy
    result["adapter_loads"] = loads
    result_file.write_text(json.dumps(result, indent=1) + "\n")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--policies", default="kv-aware,round-robin")
    parser.add_argument("--num-prompts", type=int, default=2400)
    parser.add_argument("--tree", type=Path, default=REPO, help="source tree to run (default: this one)")
    parser.add_argument("--variant", action="append", default=[], metavar="LABEL=POLICY [FLAGS]")
    parser.add_argument("--up", default="", metavar="FLAGS", help="more `meshserve up` flags for every run")
    args = parser.parse_args()
    runs = policy_runs(args.policies, args.variant)
    policies = list(runs)
    tree = args.tree.resolve()
    rows: dict[str, list[dict]] = {}
    for r in range(args.rounds):
        order = policies if r % 2 == 0 else policies[::-1]  # alternated: neither always runs first
        for policy in order:
            started = time.monotonic()
            result = run_one(args.out, policy, [*runs[policy], *shlex.split(args.up)], args.num_prompts, 1000 + r, tree)
            rows.setdefault(policy, []).append(result)
            print(f"round {r + 1} {policy:<12} " + " ".join(f"{k} {result[k]:.1f}" for k in HEADLINE)
                  + f" ({time.monotonic() - started:.0f}s)", flush=True)
    brief = {p: [{k: r[k] for k in (*HEADLINE, "mean_ttft_ms", "request_throughput") if k in r}
                 | {"adapters": r.get("adapters", {})} for r in v] for p, v in rows.items()}
    (args.out / "rows.json").write_text(json.dumps(brief, indent=1) + "\n")
    (args.out / "summary.md").write_text(summary(rows))
    print((args.out / "summary.md").read_text())
    return 0


def summary(rows: dict[str, list[dict]]) -> str:
    med = {p: {k: statistics.median(r[k] for r in v) for k in HEADLINE} for p, v in rows.items()}
    base = med.get("round-robin")
    lines = ["| policy | runs | adapter loads | p99 TTFT ms | median TTFT ms | output tok/s | failed | "
             "loads / RR | p99 TTFT / RR | tok/s / RR |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p, m in med.items():
        ratios = " | ".join(f"{m[k] / base[k]:.2f}" if base and base[k] else "-"
                            for k in ("adapter_loads", "p99_ttft_ms", "output_throughput"))
        lines.append(f"| {p} | {len(rows[p])} | {m['adapter_loads']:,.0f} | {m['p99_ttft_ms']:,.0f} | "
                     f"{m['median_ttft_ms']:,.0f} | {m['output_throughput']:,.0f} | {m['failed']:.0f} | {ratios} |")
    if base and "kv-aware" in med:
        lines.append("")
        for key, (op, bound) in TARGETS.items():
            ratio = med["kv-aware"][key] / base[key] if base[key] else float("nan")
            met = ratio <= bound if op == "<=" else ratio >= bound
            lines.append(f"- {key}: kv-aware / round-robin {ratio:.2f} (target {op} {bound}): "
                         f"{'met' if met else 'missed'}")
        lines.append(f"- failures: {med['kv-aware']['failed']:.0f} (target 0)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
