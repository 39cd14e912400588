#!/usr/bin/env bash
# Tracing on vs off on the sim fleet at 300 users: the same workload on a mesh started with
# tracing (spans exported to the local receiver) and without, alternated ROUNDS times (each run
# its own mesh). Prints, per round, the on/off ratios of output throughput and of the mesh's CPU
# seconds per request (steadier on a shared machine), then their medians.
#   RATIO=0.1 ROUNDS=3 bench/tracing_overhead.sh [OUT_DIR]    (RATIO: sampling ratio, default 1.0)
source "$(dirname "$0")/usage.sh"  # -h, --help
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-/tmp/meshserve-bench/tracing_overhead}
RATIO=${RATIO:-1.0}
ROUNDS=${ROUNDS:-3}
mkdir -p "$OUT"
source bench/lib.sh
USERS=(--max-concurrency 300 --random-input-len 128 --random-output-len 64 --num-prompts 1200 --num-warmups 20)
seed=1
for round in $(seq 1 "$ROUNDS"); do
  for mode in off on; do
    flag=--tracing; [[ $mode == off ]] && flag=--no-tracing
    up "tracing-$mode" --engine sim --workers 4 $flag --trace-sampling-ratio "$RATIO"
    bench "tracing-$RATIO-$mode-$round" --target 127.0.0.1:8080 "${USERS[@]}" --seed $seed
    down
    seed=$((seed + 1))
  done
done
.venv/bin/python - "$OUT" "$RATIO" "$ROUNDS" <<'PY'
import json, statistics, sys
out, ratio, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def cpu_ms_per_request(d):  # warm-ups included: the CPU figure covers them too
    return 1e3 * d["mesh_cpu_s"] / (d["completed"] + d["failed"] + d["num_warmups"])
keys = ["output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "failed"]
print(f"{'run':<12}" + "".join(f"{k:>19}" for k in keys) + f"{'CPU ms/request':>16}")
tput, cpu = [], []
for r in range(1, rounds + 1):
    runs = {m: json.load(open(f"{out}/tracing-{ratio}-{m}-{r}.json")) for m in ("off", "on")}
    for m, d in runs.items():
        print(f"{m + ' #' + str(r):<12}" + "".join(f"{d[k]:>19.1f}" for k in keys) + f"{cpu_ms_per_request(d):>16.2f}")
    tput.append(runs["on"]["output_throughput"] / runs["off"]["output_throughput"])
    cpu.append(cpu_ms_per_request(runs["on"]) / cpu_ms_per_request(runs["off"]))
    print(f"{'on/off #' + str(r):<12} throughput {tput[-1]:.3f}, CPU per request {cpu[-1]:.3f}")
print(f"median on/off: throughput {statistics.median(tput):.3f}, CPU per request {statistics.median(cpu):.3f}")
PY
