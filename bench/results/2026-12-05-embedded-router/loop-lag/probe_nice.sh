#!/bin/bash
# usage: probe_nice.sh LABEL MODE   MODE: none | client | client+sim
LABEL=$1; MODE=$2
cd /work/main
RUN=/tmp/probe-run-$LABEL; rm -rf $RUN; mkdir -p $RUN
.venv/bin/python -m commands.cli up --engine sim --workers 4 --sim-speed 0.25 --run-dir $RUN --gateway-port 50070 $EXTRA > $RUN/up.log 2>&1 &
UP=$!
for i in $(seq 120); do sleep 1; grep -q "curl" $RUN/up.log && break; done
if [ "$MODE" = "client+sim" ]; then
  for p in $(pgrep -f "serve worker"); do renice -n 10 -p $p >/dev/null; done
fi
NICE=0; [ "$MODE" != none ] && NICE=19
nice -n $NICE .venv/bin/meshserve bench --dataset-name random --num-prompts 100000 --max-concurrency 50 --random-input-len 64 --random-output-len 64 --cache off > $RUN/bench.log 2>&1 &
B=$!
sleep 8
echo "$LABEL $MODE: $(.venv/bin/python bench/results/2026-12-03-cache-stores/probe.py 127.0.0.1:8080 1000)"
kill -TERM $B; wait $B 2>/dev/null
grep -E "tok/s|throughput" $RUN/bench.log | head -3
ps -eo pid,ni,pcpu,args | grep -E "meshserve|envoy|valkey" | grep -v grep | cut -c1-150 > $RUN/ps.txt
kill -INT $UP; wait $UP
