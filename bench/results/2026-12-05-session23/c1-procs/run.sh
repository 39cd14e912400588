#!/bin/bash
# meshserve up (vLLM, tiny model, one worker) -> c1 chat requests through Envoy, measured by MODE:
#   MODE=spy (the first run): py-spy on the worker's serving process and the gateway;
#   MODE=cpu (the second): cpu.py, each process's CPU seconds and context switches over the 100 requests.
set -u
OUT=/tmp/c1spy; cd /work/main
M=$(.venv/bin/meshserve make-model | tail -1)
.venv/bin/python -m commands.cli up --engine vllm --workers 1 --model $M --enforce-eager --run-dir $OUT/run --port 8080 > $OUT/up.log 2>&1 &
UP=$!
for i in $(seq 200); do curl -sf http://127.0.0.1:8080/v1/models >/dev/null && break; sleep 1; done
W=$(pgrep -f "serve worker" | head -1); G=$(pgrep -f "serve gateway" | head -1)
echo "worker $W gateway $G"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1
B=".venv/bin/vllm bench serve --backend openai-chat --base-url http://127.0.0.1:8080 --endpoint /v1/chat/completions --model meshserve-tiny --tokenizer $M --dataset-name random --random-input-len 64 --random-output-len 32 --max-concurrency 1 --ignore-eos --disable-tqdm"
$B --num-prompts 20 --seed 1 > $OUT/warm.txt 2>&1
HERE=$(dirname "$(readlink -f "$0")")
if [ "${MODE:-spy}" = spy ]; then
  /tmp/pyspy/bin/py-spy record -p $W -r 200 -d 14 -f raw -o $OUT/worker.raw --nonblocking --threads > $OUT/spy-w.log 2>&1 &
  /tmp/pyspy/bin/py-spy record -p $G -r 200 -d 14 -f raw -o $OUT/gateway.raw --nonblocking --threads > $OUT/spy-g.log 2>&1 &
  $B --num-prompts 100 --seed 2 > $OUT/c1.txt 2>&1
  wait %2 %3 2>/dev/null; sleep 2
else
  .venv/bin/python $HERE/cpu.py start
  $B --num-prompts 100 --seed 2 > $OUT/c1.txt 2>&1
  .venv/bin/python $HERE/cpu.py stop
fi
kill -INT $UP; wait $UP
grep -E "Median TTFT|Median TPOT|Mean ITL" $OUT/c1.txt
