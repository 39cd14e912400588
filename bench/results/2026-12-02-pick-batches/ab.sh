#!/bin/bash
# Hot-scenario kv-aware runs, the tree before the router-views change and after, alternated.
OUT=/work/main/bench/results/2026-12-02-pick-batches/hot
for r in 0 1; do
  for t in before after; do
    tree=/work/main; [ $t = before ] && tree=/tmp/before-picks
    /work/main/.venv/bin/python /work/main/bench/routing.py $OUT/$t --rounds 1 --first-round $r --scenarios hot --policies kv-aware --tree $tree > /tmp/rp/routing-$t-$r.log 2>&1
    echo "$t round $r done rc=$?"
  done
done
