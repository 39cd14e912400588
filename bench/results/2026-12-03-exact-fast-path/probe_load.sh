#!/bin/bash
# usage: probe_load.sh TREE LABEL -> sim mesh from TREE; 50 users (cache off) + probe through Envoy and direct
TREE=$1; LABEL=$2
cd $TREE
RUN=/tmp/probe-run-$LABEL; rm -rf $RUN; mkdir -p $RUN
/work/main/.venv/bin/python -m commands.cli up --engine sim --workers 4 --sim-speed 0.25 --run-dir $RUN --gateway-port 50070 > $RUN/up.log 2>&1 &
UP=$!
for i in $(seq 120); do sleep 1; grep -q "curl" $RUN/up.log && break; done
for T in 127.0.0.1:8080 127.0.0.1:50070; do
/work/main/.venv/bin/meshserve bench --dataset-name random --num-prompts 100000 --max-concurrency 50 --random-input-len 64 --random-output-len 64 --cache off > $RUN/bench.log 2>&1 &
B=$!
sleep 8
echo "$LABEL load: $(/work/main/.venv/bin/python /work/main/bench/results/2026-12-03-cache-stores/probe.py $T 1000)"
kill -TERM $B; wait $B
done
kill -INT $UP; wait $UP
