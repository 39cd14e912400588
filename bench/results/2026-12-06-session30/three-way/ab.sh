#!/bin/bash
# Rotate: A (HEAD), C (unheld -> two homes), D (only a spill -> two homes); same seeds per round.
cd /work/main
SC=${SC:-prefix,multi}
for r in "$@"; do
  case $((r % 3)) in 0) order="A C D";; 1) order="C D A";; 2) order="D A C";; esac
  for t in $order; do
    case $t in A) tree=/tmp/rtree;; C) tree=/tmp/rtreeC;; D) tree=/tmp/rtreeD;; esac
    flock /tmp/meshserve-bench.lock .venv/bin/python bench/routing.py /tmp/s30/three/$t --tree $tree --rounds 1 --first-round $r --scenarios $SC --policies kv-aware 2>&1 | grep "^round" | sed "s/kv-aware   /kv-aware-$t/" | cut -c1-200
  done
done
