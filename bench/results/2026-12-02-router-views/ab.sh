#!/bin/bash
# Alternates router_scale.py between the tree before and after (each its own router code).
OUT=/work/main/bench/results/2026-12-02-router-views
for r in 1 2 3; do
  for t in before after; do
    tree=/work/main; [ $t = before ] && tree=/tmp/before-router
    /work/main/.venv/bin/python $tree/bench/router_scale.py --workers 256 --streams 4 --depth 2 --seconds 10 --out $OUT/$t-256-$r.json > /tmp/rp/$t-$r.log 2>&1
    echo "$t $r $(python3 -c "import json;d=json.load(open('$OUT/$t-256-$r.json'));print(round(d['picks_per_s']), round(d['p50_ms'],1), round(d['p99_ms'],1), round(d['router_cpu_s_per_s'],2))")"
  done
done
