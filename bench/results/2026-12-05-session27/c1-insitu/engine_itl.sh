#!/usr/bin/env bash
# One user: the client's TTFT and ITL next to what each stack's vLLM engine reports of the same
# requests (its own `vllm:time_to_first_token_seconds` and `vllm:inter_token_latency_seconds`,
# read from its metrics before and after each run; vLLM times tokens with the engine core's
# output timestamps). Where the two ITLs agree, a stack's token path adds nothing per token and a
# gap to the other stack is in its engine's steps. `vllm serve` on 8100 and `meshserve up --engine
# vllm --workers 1` on 8080, started once and idle between runs; ROUNDS alternated runs of N
# requests one at a time (64 -> 32 tokens, one seed per round) against each.
#   engine_itl.sh OUT ROUNDS N
set -euo pipefail
OUT=$1; ROUNDS=${2:-6}; N=${3:-40}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/stacks.sh"  # from the repository root: MODEL, `vllm serve` (VLLM), mesh, ready, one_mesh
one_mesh
.venv/bin/python - "$OUT" "$ROUNDS" "$N" "$MODEL" "$HERE" <<'PY' | tee "$OUT/results.txt"
import json, statistics, sys, urllib.request
sys.path.insert(0, sys.argv[5])
import c1

out, rounds, n, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
targets = json.load(open(f"{out}/mesh-run/prometheus-targets.json"))
worker = next(t["targets"][0] for t in targets if t["labels"]["name"] == "worker-0")
stacks = {"vllm": (8100, "http://127.0.0.1:8100/metrics"), "mesh": (8080, f"http://{worker}/metrics")}
SERIES = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds")


def scrape(url: str) -> dict[str, float]:
    """Each series' _sum and _count, over all its label sets."""
    got: dict[str, float] = {}
    for line in urllib.request.urlopen(url).read().decode().splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith(("_sum", "_count")) and name.rsplit("_", 1)[0] in SERIES:
            got[name] = got.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return got


rows: dict[str, list[tuple[float, ...]]] = {}
for rnd in range(rounds):
    for name in list(stacks) if rnd % 2 == 0 else list(stacks)[::-1]:
        port, metrics = stacks[name]
        before = scrape(metrics)
        r = c1.run(port, out, f"{name}-{rnd}", n, model, 3000 + rnd)
        after = scrape(metrics)
        d = {k: after[k] - before.get(k, 0.0) for k in after}
        engine = [1000 * d[f"{s}_sum"] / max(1.0, d[f"{s}_count"]) for s in SERIES]
        row = (r["mean_ttft_ms"], engine[0], r["mean_itl_ms"], engine[1], r["median_ttft_ms"], r["median_tpot_ms"])
        rows.setdefault(name, []).append(row)
        print(f"round {rnd} {name:5s} mean TTFT client {row[0]:6.2f} engine {row[1]:6.2f} | mean ITL client "
              f"{row[2]:5.2f} engine {row[3]:5.2f} | median TTFT {row[4]:6.2f} TPOT {row[5]:5.2f}", flush=True)
print("medians over rounds:")
for name, rs in rows.items():
    m = [statistics.median(r[i] for r in rs) for i in range(6)]
    print(f"{name:5s} mean TTFT client {m[0]:6.2f} engine {m[1]:6.2f} | mean ITL client {m[2]:5.2f} engine "
          f"{m[3]:5.2f} | median TTFT {m[4]:6.2f} TPOT {m[5]:5.2f}")
json.dump(rows, open(f"{out}/rows.json", "w"))
PY
