#!/usr/bin/env bash
# c1 latency of the relay on an idle machine: sim worker, vllm bench serve one at a time
set -euo pipefail
OUT=$1; shift
mkdir -p $OUT
cd /work/main
.venv/bin/meshserve up --engine sim --workers 1 --sim-itl-base-ms 2 --sim-prefill-ms-per-token 0.02 --run-dir $OUT/run --gateway-http-port 8091 "$@" > $OUT/up.log 2>&1 &
UP=$!
trap 'kill -INT $UP; wait $UP || true' EXIT
until grep -q "meshserve is up" $OUT/up.log; do kill -0 $UP; sleep 1; done
M=$(ls -d /root/.cache/meshserve/models/meshserve-tiny-v1)
b() { .venv/bin/vllm bench serve --backend openai-chat --base-url http://127.0.0.1:$1 --endpoint ${4:-/v1/chat/completions} --model meshserve-tiny --tokenizer $M --dataset-name random --random-input-len 64 --random-output-len 32 --num-prompts ${N:-100} --max-concurrency 1 --ignore-eos --seed $2 --disable-tqdm --percentile-metrics ttft,tpot,itl --num-warmups 5 2>&1 | grep -E "Median (TTFT|TPOT|ITL)|P99 TTFT|Mean TTFT" | sed "s/^/$3 /"; }
for r in 1 2; do
  b 8080 $r envoy
  b 8091 $r gateway /v1/chat/completions:sse
done | tee $OUT/result.txt
.venv/bin/meshserve traces --slowest 3 --receiver 127.0.0.1:4317 > $OUT/traces.txt 2>&1 || true
for t in $(grep -oE "[0-9a-f]{32}" $OUT/traces.txt | head -3); do .venv/bin/meshserve trace $t --receiver 127.0.0.1:4317 >> $OUT/traces.txt 2>&1; done
