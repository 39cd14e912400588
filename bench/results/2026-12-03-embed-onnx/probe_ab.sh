#!/bin/bash
# usage: probe_ab.sh RUNTIME LABEL -> a sim mesh with --embed-runtime RUNTIME; semantic-hit probe idle
# (gateway and Envoy), then through Envoy with 50 users running (cache off), then stops.
RUNTIME=$1; LABEL=$2
here=$(cd "$(dirname "$0")" && pwd); repo=$(cd "$here/../../.." && pwd); cd "$repo"
RUN=/tmp/probe-run-$LABEL; rm -rf $RUN; mkdir -p $RUN
.venv/bin/python -m commands.cli up --engine sim --workers 4 --sim-speed 0.25 --embed-runtime $RUNTIME \
  --run-dir $RUN --gateway-port 50070 > $RUN/up.log 2>&1 &
UP=$!
for i in $(seq 120); do sleep 1; grep -q "curl" $RUN/up.log && break; done
echo "$LABEL idle: $(.venv/bin/python $here/probe_semantic.py 127.0.0.1:50070 150)"
echo "$LABEL idle: $(.venv/bin/python $here/probe_semantic.py 127.0.0.1:8080 150)"
.venv/bin/meshserve bench --dataset-name random --num-prompts 100000 --max-concurrency 50 --random-input-len 64 \
  --random-output-len 64 --cache off > $RUN/bench.log 2>&1 &
B=$!
sleep 8
echo "$LABEL load: $(.venv/bin/python $here/probe_semantic.py 127.0.0.1:8080 150)"
echo "$LABEL load: $(.venv/bin/python $here/probe_semantic.py 127.0.0.1:8080 150)"
kill -TERM $B; wait $B
kill -INT $UP; wait $UP
