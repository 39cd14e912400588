#!/usr/bin/env bash
# Reproduces docs/benchmarks.md "Stream interval: fewer, larger chunks": the 300-user workload through the whole mesh
# with every token its own chunk (stream_interval 1, the default) and with 8 tokens per chunk
# after the first (`meshserve bench --stream-interval 8`), alternated ROUNDS times in one mesh:
# first a sim worker (the mesh's own cost), then the vLLM tiny model. Every run has its own
# prompts (--seed): a run on the previous run's prompts would hit the prefix cache.
#   bench/stream_interval.sh [OUT_DIR]     (default /tmp/meshserve-bench/stream_interval)
#   env: ROUNDS (3)
source "$(dirname "$0")/usage.sh"  # -h, --help
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/meshserve-bench/stream_interval}
mkdir -p "$OUT"
source bench/lib.sh

USERS=(--target 127.0.0.1:8080 --num-prompts 600 "${USERS_300[@]}")
for engine in sim vllm; do
  up "$engine" --engine "$engine" --workers 1
  for round in $(seq 1 "${ROUNDS:-3}"); do
    for interval in 1 8; do
      bench "$engine-si$interval-$round" --seed "$((round * 10 + interval))" --stream-interval "$interval" "${USERS[@]}"
    done
  done
  down
done

.venv/bin/python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def row(values, fmt):
    return ", ".join(format(v, fmt) for v in values)
for engine in ("sim", "vllm"):
    for interval in (1, 8):
        runs = [json.loads(p.read_text()) for p in sorted(out.glob(f"{engine}-si{interval}-*.json"))]
        cpu = [1e3 * r["mesh_cpu_s"] / (r["completed"] + r["num_warmups"]) for r in runs]
        print(f"{engine} stream_interval {interval}: "
              f"output tok/s {row([r['output_throughput'] for r in runs], '.0f')}; "
              f"median TTFT {row([r['median_ttft_ms'] for r in runs], '.0f')} ms; "
              f"median TPOT {row([r['median_tpot_ms'] for r in runs], '.1f')} ms; "
              f"mesh CPU/request {row(cpu, '.1f')} ms; failed {sum(r['failed'] for r in runs)}")
PY
echo "results in $OUT"
