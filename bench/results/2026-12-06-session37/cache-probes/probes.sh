#!/bin/bash
# usage: [NICE=1] probes.sh TREE LABEL [meshserve up flags...]
# A sim mesh (4 workers, --sim-speed 0.25) from TREE with the flags; 50 users generating (cache off,
# `meshserve bench`) through Envoy; then 1,000 exact hits and 2 x 150 semantic hits (paraphrases never
# asked before), one at a time, through Envoy. NICE=1: the load generator at niceness 19 and the sim
# workers at 10 (stand-ins for users on other machines and engines whose work is on GPUs).
TREE=$1; LABEL=$2; shift 2
cd $TREE
RUN=/tmp/probe-run-$LABEL; rm -rf $RUN; mkdir -p $RUN
/work/main/.venv/bin/python -m commands.cli up --engine sim --workers 4 --sim-speed 0.25 --run-dir $RUN --gateway-port 50070 "$@" > $RUN/up.log 2>&1 &
UP=$!
for i in $(seq 120); do sleep 1; grep -q "curl" $RUN/up.log && break; done
/work/main/.venv/bin/meshserve bench --dataset-name random --num-prompts 100000 --max-concurrency 50 --random-input-len 64 --random-output-len 64 --cache off > $RUN/bench.log 2>&1 &
B=$!
if [ -n "$NICE" ]; then renice -n 19 -p $B >/dev/null; for p in $(pgrep -f "serve worker"); do renice -n 10 -p $p > /dev/null; done; fi
sleep 8
echo "$LABEL exact: $(/work/main/.venv/bin/python /work/main/bench/results/2026-12-03-cache-stores/probe.py 127.0.0.1:8080 1000)"
for k in 1 2; do echo "$LABEL semantic: $(/work/main/.venv/bin/python /work/main/bench/results/2026-12-03-embed-onnx/probe_semantic.py 127.0.0.1:8080 150)"; done
kill -TERM $B; wait $B 2>/dev/null
kill -INT $UP; wait $UP
