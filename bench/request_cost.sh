#!/usr/bin/env bash
# What one request costs each process of the mesh, beyond its tokens: `meshserve up --engine sim
# --workers 1` (from TREE, default this tree), wrk sending streaming chat requests of 2 tokens
# (32 connections, 5 s warm-up, then 20 s measured), CPU seconds of each service read from /proc
# around the measured run, divided by the requests served. Steadier than throughput on a shared
# machine: each figure is one process's own CPU.
#   bench/request_cost.sh OUT_DIR [meshserve up flags]      (TREE=/path/to/other/tree for an A/B)
#   SPY=gateway bench/request_cost.sh ...    also records a py-spy profile of that service (raw)
#   ENGINE=vllm bench/request_cost.sh ...    on the real vLLM engine (the model's own tokenizer)
# Needs wrk (Debian's package) and, for SPY, py-spy on PATH.
source "$(dirname "$0")/usage.sh"  # -h, --help
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
TREE=${TREE:-$HERE}
OUT=$(realpath -m "$1"); shift
mkdir -p "$OUT"
command -v wrk >/dev/null || { echo "request_cost.sh needs wrk (apt-get install wrk)"; exit 1; }
cd "$TREE"
export PYTHONPATH=$TREE  # every service the launcher starts runs this tree
cli=meshserve.commands.cli; [[ -f meshserve/__init__.py ]] || cli=commands.cli  # a tree from before the package
"$HERE/.venv/bin/python" -m "$cli" up --engine "${ENGINE:-sim}" --workers 1 --run-dir "$OUT/run" "$@" > "$OUT/up.log" 2>&1 &
UP=$!
trap 'kill -INT $UP; wait $UP || true' EXIT
until grep -q "meshserve is up" "$OUT/up.log"; do kill -0 $UP 2>/dev/null || { cat "$OUT/up.log"; exit 1; }; sleep 1; done
WRK=(wrk -t1 -c32 -s "$HERE/bench/request_cost.lua" http://127.0.0.1:8080)
"${WRK[@]}" -d5s > "$OUT/warmup.txt"
cpu() {  # "service cpu-seconds" for every service running
  for s in gateway router worker cache traces; do
    p=$(pgrep -f "commands.cli serve $s" | head -1) || continue
    awk -v s=$s '{print s, ($14 + $15) / 100}' /proc/$p/stat
  done
  awk '{print "envoy", ($14 + $15) / 100}' /proc/$(pgrep -f "_bin/envoy" | head -1)/stat
}
cpu | sort > "$OUT/cpu-before"
if [[ -n ${SPY:-} ]]; then
  py-spy record -p "$(pgrep -f "commands.cli serve $SPY" | head -1)" -r 400 -f raw -o "$OUT/$SPY.txt" \
    --nonblocking -d 25 > /dev/null 2>&1 &
fi
"${WRK[@]}" -d20s > "$OUT/wrk.txt"
cpu | sort > "$OUT/cpu-after"
n=$(grep -oE "^ +[0-9]+ requests" "$OUT/wrk.txt" | awk '{print $1}')
bad=$(grep -oE "Non-2xx or 3xx responses: [0-9]+" "$OUT/wrk.txt" | awk '{print $NF}' || true)
{
  echo "requests $n, failed ${bad:-0}, $(grep Requests/sec "$OUT/wrk.txt" | awk '{print $2}') per second"
  join "$OUT/cpu-before" "$OUT/cpu-after" | awk -v n="$n" '{t += $3 - $2; printf "%-8s %7.0f us/request\n", $1, ($3 - $2) * 1e6 / n}
    END {printf "%-8s %7.0f us/request\n", "total", t * 1e6 / n}'
} | tee "$OUT/result.txt"
