#!/usr/bin/env bash
# Against the peers: the same vLLM engine served by `vllm serve` alone, by vllm-router in front of
# it, and by meshserve, measured with vLLM's own `vllm bench serve` (bench/peer.py has the details).
#   bench/peer.sh [OUT_DIR] [peer.py flags, e.g. --rounds 3 --workloads short,long,c1]
source "$(dirname "$0")/usage.sh"  # -h, --help
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/meshserve-bench/peer}
shift || true
exec .venv/bin/python bench/peer.py "$OUT" "$@"
