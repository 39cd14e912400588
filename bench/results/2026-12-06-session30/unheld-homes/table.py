"""Paired table of before (HEAD's kv-aware) and after (unheld prompts to two homes), per scenario and seed."""
import json
import statistics
from pathlib import Path

here = Path(__file__).parent
def load(side, scenario, policy, seed):
    f = here / side / "runs" / f"{scenario}-{policy}-s{seed}" / "bench.json"
    return json.loads(f.read_text()) if f.exists() else None

rows = []
print("| scenario | seed | before: tok/s; p99 / mean TTFT ms; hit | after | after / before: tok/s, p99, mean | prefix-affinity or round-robin (same seed) |")
print("|---|---|---|---|---|---|")
ratios = {}
for run in sorted((here / "after" / "runs").iterdir()):
    scenario, _, seed = run.name.partition("-kv-aware-s")
    b, a = load("before", scenario, "kv-aware", seed), load("after", scenario, "kv-aware", seed)
    other = load("before", scenario, "prefix-affinity", seed) or load("before", scenario, "round-robin", seed)
    def cell(d):
        return f"{d['output_throughput']:,.0f}; {d['p99_ttft_ms']:,.0f} / {d['mean_ttft_ms']:,.0f}; {d['engine_prefix_hit_rate']:.2f}"
    r = (a["output_throughput"] / b["output_throughput"], a["p99_ttft_ms"] / b["p99_ttft_ms"], a["mean_ttft_ms"] / b["mean_ttft_ms"])
    ratios.setdefault(scenario, []).append(r)
    print(f"| {scenario} | {seed} | {cell(b)} | {cell(a)} | ×{r[0]:.2f}, ×{r[1]:.2f}, ×{r[2]:.2f} | {other['label']}: {cell(other)} |")
print()
for scenario, rs in ratios.items():
    med = [statistics.median(x) for x in zip(*rs)]
    print(f"- {scenario}: medians after / before: tok/s ×{med[0]:.2f}, p99 TTFT ×{med[1]:.2f}, mean TTFT ×{med[2]:.2f} ({len(rs)} rounds)")
