#!/bin/bash
LABEL=$1; USERS=${2:-50}
cd /work/main
RUN=/tmp/probe-run-$LABEL; rm -rf $RUN; mkdir -p $RUN
.venv/bin/python -m commands.cli up --engine sim --workers 4 --sim-speed 0.25 --run-dir $RUN --gateway-port 50070 $EXTRA > $RUN/up.log 2>&1 &
UP=$!
for i in $(seq 120); do sleep 1; grep -q "curl" $RUN/up.log && break; done
.venv/bin/meshserve bench --dataset-name random --num-prompts 100000 --max-concurrency $USERS --random-input-len 64 --random-output-len 64 --cache off > $RUN/bench.log 2>&1 &
B=$!
sleep 6; if [ -n "$RENICE" ]; then for p in $(pgrep -f "$RENICE"); do renice -n ${RNICE:--10} -p $p >/dev/null; done; fi
.venv/bin/python /tmp/exp/lag.py $RUN 10
for T in 127.0.0.1:8080 127.0.0.1:50070; do .venv/bin/python /tmp/exp/ttft_hist.py $RUN .venv/bin/python bench/results/2026-12-03-cache-stores/probe.py $T 1000; done
kill -TERM $B; wait $B 2>/dev/null
kill -INT $UP; wait $UP
