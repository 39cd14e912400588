#!/bin/bash
LABEL=$1
cd /work/main
RUN=/tmp/probe-run-$LABEL; rm -rf $RUN; mkdir -p $RUN
.venv/bin/python -m commands.cli up --engine sim --workers 4 --sim-num-kv-blocks 1000 --routing kv-aware --run-dir $RUN $EXTRA > $RUN/up.log 2>&1 &
UP=$!
for i in $(seq 120); do sleep 1; grep -q "curl" $RUN/up.log && break; done
.venv/bin/python /tmp/exp/lag.py $RUN 4 > $RUN/lag.txt &
L=$!
.venv/bin/meshserve bench --dataset-name multi_turn --multi-turn-num-users 100 --multi-turn-num-turns 5 --multi-turn-system-prompt-len 100 --multi-turn-question-len 40 --multi-turn-output-len 32 --seed 7 --disable-tqdm > $RUN/bench.log 2>&1
wait $L
cat $RUN/lag.txt
grep -iE "throughput|TTFT|duration" $RUN/bench.log | head -8
kill -INT $UP; wait $UP
