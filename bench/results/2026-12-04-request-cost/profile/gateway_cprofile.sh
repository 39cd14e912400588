#!/usr/bin/env bash
# cProfile a second gateway (same router, cache, Redis as a running sim mesh), hit on its HTTP edge by wrk.
set -euo pipefail
cd /work/main
OUT=$1; mkdir -p $OUT
.venv/bin/python -m commands.cli up --engine sim --workers 1 --run-dir $OUT/run > $OUT/up.log 2>&1 &
UP=$!
trap 'kill -INT $UP; wait $UP || true' EXIT
until grep -q "meshserve is up" $OUT/up.log; do sleep 1; done
cmd=$(ps -o args= -p $(pgrep -f "commands.cli serve gateway" | head -1) | sed 's|^.*commands.cli serve gateway||; s/--port [0-9]*/--port 50951/; s/--http-port [0-9]*/--http-port 50950/; s|--ready-file [^ ]*||; s/--metrics-port [0-9]*/--metrics-port 0/')
echo "$cmd" > $OUT/cmd
.venv/bin/python -m cProfile -o $OUT/gw.prof -m commands.cli serve gateway $cmd > $OUT/gw.log 2>&1 &
GW=$!
until curl -s -o /dev/null http://127.0.0.1:50950/health; do sleep 0.5; done
sed 's|"/v1/chat/completions"|"/v1/chat/completions:sse"|' bench/request_cost.lua > $OUT/post.lua
wrk -t1 -c32 -d5s -s $OUT/post.lua http://127.0.0.1:50950 > $OUT/warm.txt
wrk -t1 -c32 -d20s -s $OUT/post.lua http://127.0.0.1:50950 > $OUT/wrk.txt
kill -INT $GW; wait $GW || true
grep -E "requests in|Non-2xx" $OUT/wrk.txt
