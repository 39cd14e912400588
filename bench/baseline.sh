#!/usr/bin/env bash
# Reproduces the figures in docs/benchmarks.md ("300 concurrent users"): each scenario starts
# its own mesh with `meshserve up`, runs `meshserve bench`, saves the JSON under $OUT and stops it.
#   bench/baseline.sh [OUT_DIR]        (default bench/results/$(date +%F))
set -euo pipefail
cd "$(dirname "$0")/.."
MS=.venv/bin/meshserve
OUT=${1:-bench/results/$(date +%F)}
mkdir -p "$OUT"
UP_PID=""

up() {  # up LABEL ARGS... : start a mesh and wait until it says it is up
  local label=$1; shift
  "$MS" up --run-dir "$OUT/run-$label" "$@" > "$OUT/up-$label.log" 2>&1 &
  UP_PID=$!
  until grep -q "meshserve is up" "$OUT/up-$label.log"; do
    kill -0 "$UP_PID" 2>/dev/null || { cat "$OUT/up-$label.log"; exit 1; }
    sleep 1
  done
}
down() { kill -INT "$UP_PID"; wait "$UP_PID" || true; }
trap '[[ -n $UP_PID ]] && kill -INT $UP_PID 2>/dev/null || true' EXIT

bench() {  # bench LABEL ARGS...
  local label=$1; shift
  "$MS" bench --disable-tqdm --label "$label" --save-result "$OUT/$label.json" "$@" | tee "$OUT/$label.txt"
}

USERS=(--max-concurrency 300 --random-input-len 128 --random-output-len 64 --num-warmups 10)

# 1. Simulated fleet (4 workers, 8B-on-H100 latency model) through Envoy.
up sim4 --engine sim --workers 4
bench sim4-mesh --target 127.0.0.1:8080 --num-prompts 1200 "${USERS[@]}"
down

# (What the mesh adds on the request path: bench/mesh_overhead.sh.)

# 2. The real vLLM engine (continuous batching) on the project's tiny model, through the mesh.
up vllm1 --engine vllm --workers 1
bench vllm1-mesh --target 127.0.0.1:8080 --num-prompts 600 "${USERS[@]}"
down

# 3. The "before" picture: plain transformers generate, one request at a time, same 300 users.
up hf1 --engine transformers --workers 1
bench hf1-mesh --target 127.0.0.1:8080 --num-prompts 300 "${USERS[@]}"
down
UP_PID=""
echo "results in $OUT"
