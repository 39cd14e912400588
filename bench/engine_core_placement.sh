#!/usr/bin/env bash
# Reproduces docs/benchmarks.md "vLLM engine-core placement on a small machine": the same
# 300-user workload on the vLLM tiny model with the engine core moved onto its model workers'
# CPUs (`--engine-core-cpus shared`, the default on <= 4 CPUs) and where vLLM puts it (`vllm`),
# alternated ROUNDS times (each run its own mesh), then the longest stall of one 1,900-token
# stream under each placement.
#   bench/engine_core_placement.sh [OUT_DIR]     (default /tmp/meshserve-bench/engine_core_placement)
#   env: ROUNDS (3)
source "$(dirname "$0")/usage.sh"  # -h, --help
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/meshserve-bench/engine_core_placement}
mkdir -p "$OUT"
source bench/lib.sh

USERS=(--target 127.0.0.1:8080 --num-prompts 600 "${USERS_300[@]}")
for round in $(seq 1 "${ROUNDS:-3}"); do
  for placement in shared vllm; do
    up "$placement-$round" --engine vllm --workers 1 --enforce-eager --no-tracing --engine-core-cpus "$placement"
    bench "$placement-$round" --seed "$round" --metadata "engine_core_cpus=$placement" "${USERS[@]}"
    # One long stream alone: its longest gap between two tokens (a stall of the worker).
    bench "$placement-$round-stream" --seed "$round" --max-concurrency 1 --num-prompts 1 \
      --random-input-len 8 --random-output-len 1900 --target 127.0.0.1:8080 --metric-percentiles 100
    down
  done
done

.venv/bin/python - "$OUT" <<'PY'
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
for placement in ("shared", "vllm"):
    runs = [json.loads(p.read_text()) for p in sorted(out.glob(f"{placement}-[0-9].json"))]
    streams = [json.loads(p.read_text()) for p in sorted(out.glob(f"{placement}-*-stream.json"))]
    tput = [r["output_throughput"] for r in runs]
    ttft = ", ".join(f"{r['median_ttft_ms']:.0f}" for r in runs)
    gaps = ", ".join(f"{s['p100_itl_ms']:.0f}" for s in streams)
    print(f"{placement}: output tok/s {', '.join(f'{t:.0f}' for t in tput)} (median {statistics.median(tput):.0f}); "
          f"median TTFT {ttft} ms; failed {sum(r['failed'] for r in runs)}; "
          f"longest gap in a 1,900-token stream {gaps} ms")
PY
echo "results in $OUT"
