#!/bin/bash
# py-spy of the gateway (router embedded) during the prefix workload
OUT=$1; mkdir -p $OUT; cd /work/main
.venv/bin/meshserve up --engine sim --workers 4 --sim-num-kv-blocks 1000 --no-tracing --routing kv-aware --router embedded --run-dir $OUT/run > $OUT/up.log 2>&1 &
UP=$!
until grep -q "meshserve is up" $OUT/up.log; do kill -0 $UP || exit 1; sleep 1; done
.venv/bin/meshserve bench --dataset-name prefix_repetition --prefix-repetition-num-prefixes 16 --prefix-repetition-prefix-len 1000 --prefix-repetition-suffix-len 64 --prefix-repetition-output-len 32 --num-prompts 2400 --max-concurrency 300 > $OUT/bench.log 2>&1 &
B=$!
sleep 5
/tmp/pyspy/bin/py-spy record -p $(pgrep -f "commands.cli serve gateway" | head -1) -r 200 -f raw -o $OUT/gateway.txt --nonblocking -d 10 > /dev/null 2>&1
wait $B
grep -E "Output token|Median TTFT|Successful" $OUT/bench.log
kill -INT $UP; wait $UP
