#!/bin/bash
# usage: sw_ab.sh LABEL SWITCH_MS  (empty SWITCH_MS: Python's default 5 ms)
LABEL=$1; export MESH_SWITCH_MS=$2
cd /work/main
export PYTHONPATH=/work/main/bench/results/2026-12-05-session22/switch-interval:/work/main
RUN=/tmp/probe-run-$LABEL; rm -rf $RUN; mkdir -p $RUN
.venv/bin/python -m commands.cli up --engine sim --workers 4 --sim-speed 0.25 --run-dir $RUN --gateway-port 50070 > $RUN/up.log 2>&1 &
UP=$!
for i in $(seq 120); do sleep 1; grep -q "curl" $RUN/up.log && break; done
.venv/bin/meshserve bench --dataset-name random --num-prompts 100000 --max-concurrency 50 --random-input-len 64 --random-output-len 64 --cache off > $RUN/bench.log 2>&1 &
B=$!
sleep 6
echo "== $LABEL switch=${2:-default}"
.venv/bin/python bench/results/2026-12-05-embedded-router/loop-lag/lag.py $RUN 10
for T in 127.0.0.1:8080 127.0.0.1:50070; do echo "$T: $(.venv/bin/python bench/results/2026-12-03-cache-stores/probe.py $T 1000)"; done
kill -TERM $B; wait $B 2>/dev/null
grep -E "Output token throughput|Successful" $RUN/bench.log | head -3
kill -INT $UP; wait $UP
