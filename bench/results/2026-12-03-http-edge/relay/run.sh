#!/bin/bash
# usage: [UPARGS="--openai-edge http"] [PERF=1] run.sh TREE LABEL  -- sim mesh, 600 req x 300 conc, 64->256 via Envoy OpenAI edge
TREE=$1; LABEL=$2; OUT=/tmp/gwb/$LABEL; rm -rf $OUT; mkdir -p $OUT
cd $TREE  # a meshserve source tree; the vllm CLI from /work/main/.venv (bench/peer.py sets it up)
/work/main/.venv/bin/python -m commands.cli up --engine sim --workers 1 --run-dir $OUT/run --port 8080 $UPARGS > $OUT/up.log 2>&1 &
UP=$!
for i in $(seq 120); do curl -sf localhost:8080/v1/models >/dev/null && break; sleep 1; done
GW=$(pgrep -f "serve gateway" | head -1); WK=$(pgrep -f "serve worker" | head -1); EN=$(pgrep -x envoy | head -1)
[ -z "$EN" ] && EN=$(pgrep -f "envoy.*-c" | head -1)
cpu() { awk '{print $14+$15}' /proc/$1/stat; }
V=/work/main/.venv/bin/vllm
ARGS="bench serve --backend openai-chat --base-url http://127.0.0.1:8080 --endpoint /v1/chat/completions --model meshserve-tiny --tokenizer /root/.cache/meshserve/models/meshserve-tiny-v1 --dataset-name random --random-input-len 64 --ignore-eos --disable-tqdm"
HF_HUB_OFFLINE=1 VLLM_LOGGING_LEVEL=WARNING $V $ARGS --random-output-len 32 --num-prompts 40 --max-concurrency 40 --seed 1 > $OUT/warm.txt 2>&1
g0=$(cpu $GW); w0=$(cpu $WK); e0=$(cpu $EN)
if [ -n "$PERF" ]; then (sleep 5; perf record -g -F 499 -p $GW -o $OUT/perf.data -- sleep 10 > /dev/null 2>&1) & fi
HF_HUB_OFFLINE=1 VLLM_LOGGING_LEVEL=WARNING $V $ARGS --random-output-len 256 --num-prompts 600 --max-concurrency 300 --seed 7 --save-result --result-dir $OUT --result-filename res.json > $OUT/bench.txt 2>&1
g1=$(cpu $GW); w1=$(cpu $WK); e1=$(cpu $EN)
python3 - $OUT/res.json $((g1-g0)) $((w1-w0)) $((e1-e0)) $LABEL <<'PY'
import json,sys
r=json.load(open(sys.argv[1])); g,w,e=[int(x)/100 for x in sys.argv[2:5]]
tok=r["total_output_tokens"]
print(f"{sys.argv[5]}: {r['output_throughput']:.0f} tok/s TTFT p50 {r['median_ttft_ms']:.0f} ms; CPU-s gateway {g:.2f} worker {w:.2f} envoy {e:.2f}; gateway us/token {g/tok*1e6:.1f} envoy {e/tok*1e6:.1f} failed {r['failed']}")
PY
kill -INT $UP; wait $UP
