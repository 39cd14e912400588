#!/usr/bin/env bash
# Tracing on vs off on the sim fleet at 300 users: the same workload on a mesh started with
# tracing (spans exported to the local receiver) and without, alternated twice.
#   RATIO=0.1 bench/tracing_overhead.sh [OUT_DIR]     (RATIO: trace sampling ratio, default 1.0)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-bench/results/$(date +%F)}
RATIO=${RATIO:-1.0}
mkdir -p "$OUT"
source bench/lib.sh
USERS=(--max-concurrency 300 --random-input-len 128 --random-output-len 64 --num-prompts 1200 --num-warmups 20)
seed=1
for round in 1 2; do
  for mode in off on; do
    flag=--tracing; [[ $mode == off ]] && flag=--no-tracing
    up "tracing-$mode" --engine sim --workers 4 $flag --trace-sampling-ratio "$RATIO"
    bench "tracing-$RATIO-$mode-$round" --target 127.0.0.1:8080 "${USERS[@]}" --seed $seed
    down
    seed=$((seed + 1))
  done
done
.venv/bin/python - "$OUT" "$RATIO" <<'PY'
import json, sys
out, ratio = sys.argv[1], sys.argv[2]
keys = ["output_throughput", "request_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "failed"]
print(f"{'run':<14}" + "".join(f"{k:>20}" for k in keys))
for r in (1, 2):
    runs = {m: json.load(open(f"{out}/tracing-{ratio}-{m}-{r}.json")) for m in ("off", "on")}
    for m, d in runs.items():
        print(f"{m + ' #' + str(r):<14}" + "".join(f"{d[k]:>20.1f}" for k in keys))
    print(f"{'on/off #' + str(r):<14}{runs['on']['output_throughput'] / runs['off']['output_throughput']:>20.3f}")
PY
