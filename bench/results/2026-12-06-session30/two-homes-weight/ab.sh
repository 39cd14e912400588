#!/bin/bash
# Alternate: tree B (two homes) and tree A (HEAD: one home), same seeds per round.
cd /work/main
for r in "$@"; do
  if [ $((r % 2)) -eq 0 ]; then order="B A"; else order="A B"; fi
  for t in $order; do
    if [ $t = B ]; then
      flock /tmp/meshserve-bench.lock .venv/bin/python bench/routing.py /tmp/s30/home/B --tree /tmp/rtreeB --rounds 1 --first-round $r --scenarios prefix,multi --policies kv-aware,prefix-affinity --variant "kv-home2=kv-aware --kv-home-weight 0.5" 2>&1 | grep "^round"
    else
      flock /tmp/meshserve-bench.lock .venv/bin/python bench/routing.py /tmp/s30/home/A --tree /tmp/rtree --rounds 1 --first-round $r --scenarios prefix,multi --policies kv-aware --variant "kv-home1=kv-aware --kv-home-weight 0.5" 2>&1 | grep "^round"
    fi
  done
done
