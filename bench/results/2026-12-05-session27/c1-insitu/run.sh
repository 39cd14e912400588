#!/usr/bin/env bash
# One user, measured inside running stacks (as bench/results/2026-12-02-c1-insitu): `vllm serve`
# on 8100 and `meshserve up --engine vllm --workers 1` on 8080, both started once with peer.py's
# engine settings, idle between runs; insitu.py alternates short `vllm bench serve` runs (N
# requests one at a time, 64 -> 32 tokens, one seed per round) against each.
#   [VARIANTS=vllm,mesh,normal+vllm,low+shared+r1,...] run.sh OUT ROUNDS N   (insitu.py's variants)
set -euo pipefail
OUT=$1; ROUNDS=${2:-8}; N=${3:-40}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/stacks.sh"  # from the repository root: MODEL, `vllm serve` (VLLM), mesh, ready, one_mesh
one_mesh
.venv/bin/python bench/results/2026-12-02-c1-insitu/insitu.py "$OUT" "$ROUNDS" "$N" "${VARIANTS:-vllm,mesh}" "$MODEL" | tee "$OUT/results.txt"
