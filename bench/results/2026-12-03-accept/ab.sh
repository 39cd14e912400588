#!/usr/bin/env bash
# A/B: gateway accept servers. Usage: ab.sh OUT ROUNDS
set -u
OUT=$1; ROUNDS=$2
cd /work/main
mkdir -p $OUT
for r in $(seq 1 $ROUNDS); do
  for v in one four; do
    if [ $v = one ]; then FLAGS=""; else FLAGS="--grpc-servers 4 --gateway-streams-per-connection 32"; fi
    RUN=$OUT/run-$v-$r; rm -rf $RUN; mkdir -p $RUN
    setsid .venv/bin/meshserve up --engine sim --workers 4 --no-tracing --port 8390 --admin-port 9991 \
      --gateway-port 50451 --router-port 50452 --cache-port 50453 --worker-port 50461 --trace-port 4497 \
      --redis-port 6399 --run-dir $RUN $FLAGS > $RUN/up.log 2>&1 &
    UP=$!
    for i in $(seq 90); do grep -q "meshserve is up" $RUN/up.log && break; sleep 1; done
    .venv/bin/meshserve bench --target 127.0.0.1:8390 --dataset-name random --num-prompts 1500 --max-concurrency 300 \
      --random-input-len 64 --random-output-len 32 --seed $((r*10)) --disable-tqdm --label $v \
      --save-result $OUT/$v-$r.json > $RUN/bench.log 2>&1
    python3 -c "
import json; d=json.load(open('$OUT/$v-$r.json'))
print('$v r$r', 'ok', d['completed'], 'failed', d['failed'], 'tok/s %.0f' % d['output_throughput'], 'TTFT p50 %.0f p99 %.0f' % (d['median_ttft_ms'], d['p99_ttft_ms']), 'TPOT p50 %.1f' % d['median_tpot_ms'])"
    GWM=$(grep "gateway metrics" $RUN/up.log | awk '{print $NF}')
    curl -s $GWM > $RUN/gateway.prom
    curl -s http://127.0.0.1:9991/stats | grep -E "cluster.gateway.*(upstream_cx_total|upstream_cx_active|upstream_rq_total)" > $RUN/envoy.stats
    python3 -c "
import json,re
d=json.load(open('$OUT/$v-$r.json'))
t=open('$RUN/gateway.prom').read()
s=float(re.search(r'^meshserve_gateway_time_to_first_token_seconds_sum (\S+)', t, re.M).group(1))
n=float(re.search(r'^meshserve_gateway_time_to_first_token_seconds_count (\S+)', t, re.M).group(1))
print('   client mean TTFT %.0f ms, gateway mean TTFT %.0f ms, gap %.0f ms' % (d['mean_ttft_ms'], 1000*s/n, d['mean_ttft_ms']-1000*s/n))"
    cat $RUN/envoy.stats | tr '\n' ' '; echo
    kill -INT -- -$UP 2>/dev/null; wait $UP 2>/dev/null
    sleep 2
  done
done
