#!/usr/bin/env bash
# Router at scale, the router of BEFORE (a worktree) and of this tree alternated ROUNDS times, with the
# same simulated fleet and callers (this tree's bench/router_scale.py, --router-tree):
#   flock /tmp/meshserve-bench.lock bench/results/2026-12-03-router-one-stream/ab.sh BEFORE ROUNDS [INTERVAL_S]
# (OUT=DIR writes the figures there instead of beside this script.)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../../.." && pwd)
before=$1; rounds=${2:-2}; interval=${3:-0.1}; out=${OUT:-$here}; mkdir -p "$out"
for r in $(seq "${FIRST:-1}" "$rounds"); do
  for side in ${ORDER:-after before}; do
    tree=$repo; [ "$side" = before ] && tree=$before
    "$repo/.venv/bin/python" "$repo/bench/router_scale.py" --workers 256 --streams 4 --depth 16 --batches \
      --seconds 10 --report-interval-s "$interval" --router-tree "$tree" \
      --out "$out/$side-$interval-$r.json" > /dev/null 2>&1
    python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[2], sys.argv[3], round(d['picks_per_s']), 'picks/s p50', round(d['p50_ms'],1), 'p99', round(d['p99_ms'],1), 'fleet msgs/s', round(d['fleet_messages_per_s']), 'cpu', round(d['router_cpu_s_per_s'],2))" "$out/$side-$interval-$r.json" "$side" "$r"
  done
done
