#!/usr/bin/env bash
# What the mesh adds on the request path: one sim worker, the same 300-user workload sent to
# the worker directly and through Envoy -> gateway (cache off), alternated twice, each run with
# its own prompts (a different --seed) so no run inherits another's prefix-cache hits.
#   bench/mesh_overhead.sh [OUT_DIR]
#   env: BENCH_ARGS  extra `meshserve bench` flags for every run, e.g. "--stream-interval 8"
source "$(dirname "$0")/usage.sh"  # -h, --help
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/meshserve-bench/mesh_overhead}
mkdir -p "$OUT"
source bench/lib.sh
up overhead --engine sim --workers 1
USERS=(--max-concurrency 300 --random-input-len 128 --random-output-len 64 --num-prompts 600)
seed=1
for round in 1 2; do
  for path in direct mesh; do
    if [[ $path == direct ]]; then target=(--service worker --target 127.0.0.1:50061); else target=(--target 127.0.0.1:8080); fi
    # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
    bench "overhead-$path-$round" "${target[@]}" "${USERS[@]}" --seed $seed ${BENCH_ARGS:-}
    seed=$((seed + 1))
  done
done
down
.venv/bin/python - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
keys = ["median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "median_tpot_ms", "output_throughput", "failed"]
print(f"{'run':<22}" + "".join(f"{k:>18}" for k in keys))
for r in (1, 2):
    for p in ("direct", "mesh"):
        d = json.load(open(f"{out}/overhead-{p}-{r}.json"))
        print(f"{p + ' #' + str(r):<22}" + "".join(f"{d[k]:>18.1f}" for k in keys))
PY
