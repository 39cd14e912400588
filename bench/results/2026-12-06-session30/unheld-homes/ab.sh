#!/bin/bash
# Alternate: tree C (kv-aware: unheld prompts to the less loaded of two homes) and tree A (HEAD), same seeds per round.
cd /work/main
for r in "$@"; do
  if [ $((r % 2)) -eq 0 ]; then order="C A"; else order="A C"; fi
  for t in $order; do
    if [ $t = C ]; then
      flock /tmp/meshserve-bench.lock .venv/bin/python bench/routing.py /tmp/s30/unheld/C --tree /tmp/rtreeC --rounds 1 --first-round $r --scenarios prefix,multi --policies kv-aware 2>&1 | grep "^round" | sed 's/kv-aware   /kv-unheld2/'
    else
      flock /tmp/meshserve-bench.lock .venv/bin/python bench/routing.py /tmp/s30/unheld/A --tree /tmp/rtree --rounds 1 --first-round $r --scenarios prefix,multi --policies kv-aware,prefix-affinity 2>&1 | grep "^round"
    fi
  done
done
