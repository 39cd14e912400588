#!/bin/bash
cd /work/main
R=/work/main/bench/results/2026-12-05-session22/token-reuse
run() { flock /tmp/meshserve-bench.lock .venv/bin/python bench/routing.py $R/$1-r$2 --tree $3 --rounds 1 --first-round $((60+$2)) --scenarios prefix --policies kv-aware --variant "kv-embedded=kv-aware --router embedded" > $R/$1-r$2.log 2>&1; }
mkdir -p $R
run before 1 /tmp/before22
run after 1 /work/main
run after 2 /work/main
run before 2 /tmp/before22
echo done > $R/DONE
