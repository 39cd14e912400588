#!/usr/bin/env bash
# One user, measured inside running stacks (as bench/results/2026-12-02-c1-insitu): `vllm serve`
# on 8100 and `meshserve up --engine vllm --workers 1` on 8080, both started once with peer.py's
# engine settings, idle between runs; insitu.py alternates short `vllm bench serve` runs (N
# requests one at a time, 64 -> 32 tokens, one seed per round) against each.
#   [VARIANTS=vllm,mesh,normal+vllm,...] run.sh OUT ROUNDS N   (insitu.py's variants)
set -euo pipefail
OUT=$1; ROUNDS=${2:-8}; N=${3:-40}
source "$(dirname "$0")/stacks.sh"  # from the repository root: MODEL, `vllm serve` (VLLM), mesh, ready
mesh mesh "" --port 8080
MESH=$!
trap 'kill -INT -- -$MESH 2>/dev/null; kill -TERM -- -$VLLM 2>/dev/null; wait' EXIT
ready http://127.0.0.1:8100/health http://127.0.0.1:8080/v1/models
.venv/bin/python ${INSITU:-bench/results/2026-12-02-c1-insitu/insitu.py} "$OUT" "$ROUNDS" "$N" "${VARIANTS:-vllm,mesh}" | tee "$OUT/results.txt"
