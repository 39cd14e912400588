#!/usr/bin/env bash
# One user, measured inside running stacks (as bench/results/2026-12-02-c1-insitu): `vllm serve`
# on 8100 and `meshserve up --engine vllm --workers 1` on 8080, both started once with peer.py's
# engine settings, idle between runs; insitu.py alternates short `vllm bench serve` runs (N
# requests one at a time, 64 -> 32 tokens, one seed per round) against each.
#   run.sh OUT ROUNDS N
set -euo pipefail
OUT=$1; ROUNDS=${2:-8}; N=${3:-40}
cd "$(dirname "$0")/../../../.."
mkdir -p "$OUT"
MODEL=$(.venv/bin/meshserve make-model | tail -1)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=WARNING
FLAGS=$(.venv/bin/python -c "import sys; sys.path.insert(0, '.'); from bench.peer import ENGINE_FLAGS; print(' '.join(ENGINE_FLAGS))")
setsid .venv/bin/vllm serve "$MODEL" --served-model-name meshserve-tiny --host 127.0.0.1 --port 8100 $FLAGS \
  > "$OUT/vllm.log" 2>&1 &
VLLM=$!
setsid .venv/bin/meshserve up --engine vllm --workers 1 --model "$MODEL" --enforce-eager --run-dir "$OUT/mesh-run" \
  --port 8080 > "$OUT/mesh-up.log" 2>&1 &
MESH=$!
trap 'kill -INT -- -$MESH 2>/dev/null; kill -TERM -- -$VLLM 2>/dev/null; wait' EXIT
for url in http://127.0.0.1:8100/health http://127.0.0.1:8080/v1/models; do
  until curl -sf "$url" > /dev/null; do sleep 1; done
done
.venv/bin/python bench/results/2026-12-02-c1-insitu/insitu.py "$OUT" "$ROUNDS" "$N" vllm,mesh | tee "$OUT/results.txt"
