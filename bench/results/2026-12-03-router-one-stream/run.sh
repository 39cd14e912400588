#!/usr/bin/env bash
# usage: [COMBINED=1] flock /tmp/meshserve-bench.lock bench/results/2026-12-03-router-one-stream/run.sh (COMBINED: ask for KV events on the load stream)
# meshserve up (sim, 4 workers), 300 users through Envoy; count worker 1's fleet messages meanwhile.
cd "$(dirname "$0")/../../.."
.venv/bin/meshserve up --engine sim --workers 4 --no-tracing > /tmp/up.log 2>&1 &
up=$!
for i in $(seq 120); do curl -sf localhost:8080/v1/models >/dev/null 2>&1 && break; sleep 1; done
sleep 2
.venv/bin/python bench/results/2026-12-03-router-one-stream/count.py 127.0.0.1:50061 5 $COMBINED  # idle
.venv/bin/meshserve bench --dataset-name random --num-prompts 2400 --max-concurrency 300 --random-input-len 64 --random-output-len 64 > /tmp/bench.log 2>&1 &
b=$!
sleep 6
.venv/bin/python bench/results/2026-12-03-router-one-stream/count.py 127.0.0.1:50061 8 $COMBINED  # busy
wait $b; tail -3 /tmp/bench.log
kill -INT $up; wait $up
