#!/usr/bin/env bash
# Reproduces the figures in docs/benchmarks.md ("300 concurrent users: before and after"): each scenario starts
# its own mesh with `meshserve up`, runs `meshserve bench`, saves the JSON under $OUT and stops it.
#   bench/baseline.sh [OUT_DIR]        (default /tmp/meshserve-bench/baseline)
source "$(dirname "$0")/usage.sh"  # -h, --help
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/meshserve-bench/baseline}
mkdir -p "$OUT"
source bench/lib.sh

# 1. Simulated fleet (4 workers, 8B-on-H100 latency model) through Envoy.
up sim4 --engine sim --workers 4
bench sim4-mesh --target 127.0.0.1:8080 --num-prompts 1200 "${USERS_300[@]}"
down

# (What the mesh adds on the request path: bench/mesh_overhead.sh.)

# 2. The real vLLM engine (continuous batching) on the project's tiny model, through the mesh.
up vllm1 --engine vllm --workers 1
bench vllm1-mesh --target 127.0.0.1:8080 --num-prompts 600 "${USERS_300[@]}"
down

# 3. The "before" picture: plain transformers generate, one request at a time, same 300 users.
up hf1 --engine transformers --workers 1
bench hf1-mesh --target 127.0.0.1:8080 --num-prompts 300 "${USERS_300[@]}"
down
echo "results in $OUT"
