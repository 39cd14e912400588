#!/usr/bin/env bash
# Reproduces docs/benchmarks.md "vLLM engine priority on a small machine": the 300-user workload
# of bench/baseline.sh on the vLLM tiny model with the engine processes at normal priority and
# at low priority (`--engine-priority low`, the default on <= 4 CPUs), alternated ROUNDS times,
# each run its own mesh (the slow mode this fixes is decided early in a mesh's life).
#   bench/engine_priority.sh [OUT_DIR]     (default /tmp/meshserve-bench/engine_priority)
#   env: ROUNDS (4)
source "$(dirname "$0")/usage.sh"  # -h, --help
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/meshserve-bench/engine_priority}
mkdir -p "$OUT"
source bench/lib.sh

USERS=(--target 127.0.0.1:8080 --num-prompts 600 "${USERS_300[@]}")
for round in $(seq 1 "${ROUNDS:-4}"); do
  for priority in normal low; do
    up "$priority-$round" --engine vllm --workers 1 --engine-priority "$priority"
    bench "$priority-$round" --seed "$round" --metadata "engine_priority=$priority" "${USERS[@]}"
    down
  done
done

.venv/bin/python - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
for priority in ("normal", "low"):
    runs = [json.loads(p.read_text()) for p in sorted(out.glob(f"{priority}-[0-9]*.json"))]
    tput = [r["output_throughput"] for r in runs]
    ttft = [r["median_ttft_ms"] for r in runs]
    print(f"{priority}: output tok/s {', '.join(f'{t:.0f}' for t in tput)} (median {statistics.median(tput):.0f}); "
          f"median TTFT {', '.join(f'{t:.0f}' for t in ttft)} ms (median {statistics.median(ttft):.0f}); "
          f"failed {sum(r['failed'] for r in runs)}")
PY
echo "results in $OUT"
