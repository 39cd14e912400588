#!/bin/bash
# cold.sh LABEL: a fresh one-worker vLLM mesh from /work/main, the peer warm-up, one 600-request short run; first-wave Envoy waits
cd /work/main
pkill -INT -f "meshserve up --engine vllm"; sleep 12
(setsid .venv/bin/meshserve up --engine vllm --workers 1 --model /root/.cache/meshserve/models/meshserve-tiny-v1 --enforce-eager --run-dir /tmp/tr-run-$1 > /tmp/tr-up-$1.log 2>&1 &)
for i in $(seq 180); do curl -sf http://127.0.0.1:8080/v1/models >/dev/null && break; sleep 1; done
B="env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_LOGGING_LEVEL=WARNING .venv/bin/vllm bench serve --backend openai-chat --base-url http://127.0.0.1:8080 --endpoint /v1/chat/completions --model meshserve-tiny --tokenizer /root/.cache/meshserve/models/meshserve-tiny-v1 --dataset-name random --random-input-len 64 --ignore-eos --disable-tqdm --percentile-metrics ttft,tpot,itl,e2el"
$B --random-output-len 16 --num-prompts 40 --max-concurrency 20 --seed 99 > /dev/null 2>&1
echo "== $1"; $B --random-output-len 32 --num-prompts 600 --max-concurrency 300 --seed 1001 2>&1 | grep -E "Output token throughput|TTFT"
curl -s "http://127.0.0.1:9901/stats?filter=cluster.gateway_http.upstream_cx_(total|connect_ms)"
sleep 2
python3 - /tmp/tr-run-$1/envoy.log <<'PY'
import json,statistics as st,sys
rows=[]
for l in open(sys.argv[1]):
    if l.startswith('{'):
        try: r=json.loads(l)
        except Exception: continue
        if r.get('path','').startswith('/v1/chat/completions') and (r.get('request_id') or '').startswith('bench-'): rows.append(r)
rows.sort(key=lambda r:r['time'])
last=rows[-600:]
for name,part in (('first',last[:300]),('rest',last[300:])):
    for k in ('upstream_wait_ms','ttfb_ms'):
        v=[float(r[k]) for r in part if r.get(k) is not None]
        print(name,k,len(v),'mean',round(st.mean(v),1),'median',round(st.median(v),1),'p90',sorted(v)[int(.9*len(v))])
PY
