#!/usr/bin/env bash
# Reproduces the figures in docs/benchmarks.md ("Overload: 10× the configured capacity"): one sim
# fleet whose gateway admits CAPACITY streams at once, loaded through Envoy first by CAPACITY
# concurrent users ("unloaded": everything admitted), then by 10x as many users with the same
# requests, then by arrivals at 10x the unloaded request rate. Saves the JSONs under $OUT, then
# prints each overload's p99 TTFT ratio to the unloaded one and its p99 refusal latency.
#   bench/overload.sh [OUT_DIR]        (default /tmp/meshserve-bench/overload)
#   env: CAPACITY (16), WORKERS (4), PROMPTS_1X (900), PROMPTS_10X_USERS (3000), PROMPTS_10X (20000)
source "$(dirname "$0")/usage.sh"  # -h, --help
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/meshserve-bench/overload}
C=${CAPACITY:-16}
WORKERS=${WORKERS:-4}
mkdir -p "$OUT"
source bench/lib.sh

SHAPE=(--target 127.0.0.1:8080 --random-input-len 128 --random-output-len 64 --num-warmups 10
       --metric-percentiles 50,90,99 --metadata "capacity=$C" "workers=$WORKERS")

# Tracing off: with it on, every refusal is also a span exported to the local receiver.
up sim$WORKERS-cap$C --engine sim --workers "$WORKERS" --gateway-max-in-flight "$C" --no-tracing
# (a) Unloaded: CAPACITY users, every request admitted.
bench overload-1x --max-concurrency "$C" --num-prompts "${PROMPTS_1X:-900}" "${SHAPE[@]}"
# (b) 10x the users (closed loop) who honour the refusal's retry-after, as the OpenAI SDK does.
bench overload-10x-users --max-concurrency $((10 * C)) --num-prompts "${PROMPTS_10X_USERS:-3000}" \
  --honor-retry-after "${SHAPE[@]}"
# (b') the same users without any backoff: a refused user sends its next request at once.
bench overload-10x-users-no-backoff --max-concurrency $((10 * C)) --num-prompts "${PROMPTS_10X:-20000}" "${SHAPE[@]}"
# (c) 10x the arrival rate (open loop): Poisson arrivals at 10x the rate (a) completed, for ~30 s.
RATE=$(.venv/bin/python -c "import json; print(round(10 * json.load(open('$OUT/overload-1x.json'))['request_throughput']))")
bench overload-10x-rate --request-rate "$RATE" --num-prompts $((RATE * 30)) "${SHAPE[@]}"
down

.venv/bin/python - "$OUT" <<'EOF'
import json, sys
one = json.load(open(f"{sys.argv[1]}/overload-1x.json"))
print(f"capacity {one['capacity']}, unloaded: {one['completed']} completed, refused {one['errors'] or 'none'}, "
      f"p99 TTFT {one['p99_ttft_ms']:.1f} ms")
for label in ("overload-10x-users", "overload-10x-users-no-backoff", "overload-10x-rate"):
    ten = json.load(open(f"{sys.argv[1]}/{label}.json"))
    refused = ten["error_ms_by_code"].get("RESOURCE_EXHAUSTED", {})
    print(f"{label}: {ten['completed']} completed, refused {ten['errors']}; p99 TTFT of admitted "
          f"{ten['p99_ttft_ms']:.1f} ms, ratio {ten['p99_ttft_ms'] / one['p99_ttft_ms']:.2f} (target <= 1.5); "
          f"refusal latency p99 {refused.get('p99', float('nan')):.1f} ms, "
          f"median {refused.get('median', float('nan')):.1f} ms (target p99 < 50)")
EOF
echo "results in $OUT"
