#!/usr/bin/env bash
# Router at scale, the tree before (BEFORE, a worktree) and this one alternated ROUNDS times:
#   flock /tmp/meshserve-bench.lock bench/results/2026-12-03-router-columns/ab.sh BEFORE ROUNDS
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../../.." && pwd)
before=$1; rounds=${2:-2}
for r in $(seq "${FIRST:-1}" "$rounds"); do
  for side in ${ORDER:-after before}; do
    tree=$repo; [ "$side" = before ] && tree=$before
    "$repo/.venv/bin/python" "$tree/bench/router_scale.py" --workers 256 --streams 4 --depth 16 --batches \
      --seconds 10 --out "$here/$side-batches-$r.json" | tr -d '\n'; echo
  done
done
