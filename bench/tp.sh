#!/usr/bin/env bash
# Tensor parallelism through the mesh on this CPU machine: the 300-user workload on one vLLM
# worker with --tensor-parallel-size 1 and 2 (the tiny model, eager), a fresh mesh per run,
# alternated ROUNDS times, each run with its own prompts (--seed).
#   bench/tp.sh [OUT_DIR]     (default /tmp/meshserve-bench/tp)
#   env: ROUNDS (2)
source "$(dirname "$0")/usage.sh"  # -h, --help
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/meshserve-bench/tp}
mkdir -p "$OUT"
source bench/lib.sh

for round in $(seq 1 "${ROUNDS:-2}"); do
  for tp in 1 2; do
    up "tp$tp-$round" --engine vllm --workers 1 --tensor-parallel-size "$tp" --enforce-eager
    bench "tp$tp-$round" --target 127.0.0.1:8080 --num-prompts 600 --seed "$((round * 10 + tp))" "${USERS_300[@]}"
    down
  done
done

.venv/bin/python - "$OUT" "${ROUNDS:-2}" <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
keys = ["completed", "failed", "output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "mesh_cpu_s"]
print(f"{'run':<10}" + "".join(f"{k:>20}" for k in keys))
for r in range(1, rounds + 1):
    for tp in (1, 2):
        d = json.load(open(f"{out}/tp{tp}-{r}.json"))
        print(f"{'tp' + str(tp) + ' #' + str(r):<10}" + "".join(f"{d[k]:>20.1f}" for k in keys))
PY
