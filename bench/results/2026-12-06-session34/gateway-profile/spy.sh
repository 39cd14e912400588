#!/bin/bash
# sim mesh as shipped; vllm bench 1200 x 300; py-spy the gateway for 12 s mid-run
cd /work/main
(setsid .venv/bin/meshserve up --engine sim --workers 1 > /tmp/tr/spy-up.log 2>&1 &)
for i in $(seq 90); do grep -q "^Try:" /tmp/tr/spy-up.log && break; sleep 1; done
GW=$(grep -o "started gateway (pid [0-9]*" /tmp/tr/spy-up.log | grep -o "[0-9]*$")
B=".venv/bin/vllm bench serve --backend openai-chat --base-url http://127.0.0.1:8080 --endpoint /v1/chat/completions --model meshserve-tiny --tokenizer /root/.cache/meshserve/models/meshserve-tiny-v1 --dataset-name random --random-input-len 64 --random-output-len 32 --ignore-eos --disable-tqdm"
HF_HUB_OFFLINE=1 $B --num-prompts 40 --max-concurrency 40 --seed 1 > /dev/null 2>&1
(HF_HUB_OFFLINE=1 $B --num-prompts 2400 --max-concurrency 300 --seed 7 > /tmp/tr/spy-bench.txt 2>&1 &)
sleep 8
/tmp/pyspy/bin/py-spy record -p $GW -d 12 -r 100 -f raw -o /tmp/tr/gw.raw --nonblocking > /dev/null 2>&1
while pgrep -f "vllm bench serve" > /dev/null; do sleep 1; done
pkill -INT -f "meshserve up"; sleep 4
grep -E "Output token throughput|Median TTFT" /tmp/tr/spy-bench.txt
