#!/usr/bin/env bash
# The variants of run.py one after another, ROUNDS times, each in a fresh process (its vLLM
# processes killed after it: every VLLM:: process of the machine, so run nothing beside it), one
# JSON line per run in OUT/results.txt, each run's log beside it.
# VARIANTS: ';'-separated, each "[ENV=VALUE ...] plain|mesh [KEY=VALUE ...]".
#   ab.sh OUT ROUNDS   (under flock /tmp/meshserve-bench.lock, from anywhere)
set -uo pipefail
OUT=$1; ROUNDS=${2:-2}
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$HERE/../../../.."
mkdir -p "$OUT"
MODEL=$(.venv/bin/meshserve make-model | tail -1)
VARIANTS=${VARIANTS:-"plain;mesh;mesh engine_core_cpus=vllm engine_priority=normal kv_events=false"}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=WARNING
i=0
for _ in $(seq "$ROUNDS"); do
  IFS=';' read -ra list <<< "$VARIANTS"
  for v in "${list[@]}"; do
    i=$((i + 1))
    read -ra words <<< "$v"
    envs=(); while [[ ${words[0]} == *=* ]]; do envs+=("${words[0]}"); words=("${words[@]:1}"); done
    env "${envs[@]}" timeout 240 .venv/bin/python "$HERE/run.py" "${words[0]}" "$MODEL" 40 "${words[@]:1}" \
      > "$OUT/run-$i.log" 2>&1
    echo "rc=$? ${envs[*]} $(grep '"variant"' "$OUT/run-$i.log")" | tee -a "$OUT/results.txt"
    pkill -9 -f "VLLM::" || true
  done
done
