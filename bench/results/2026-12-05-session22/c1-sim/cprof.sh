#!/usr/bin/env bash
set -euo pipefail
cd /work/main
OUT=$1; mkdir -p $OUT
.venv/bin/python -m commands.cli up --engine sim --workers 1 --sim-itl-base-ms 2 --sim-prefill-ms-per-token 0.02 --run-dir $OUT/run > $OUT/up.log 2>&1 &
UP=$!
trap 'kill -INT $UP; wait $UP || true' EXIT
until grep -q "meshserve is up" $OUT/up.log; do sleep 1; done
P=$(pgrep -f "commands.cli serve gateway" | head -1)
mapfile -d '' ARGS < /proc/$P/cmdline
ARGS=("${ARGS[@]:5}")  # drop python -m commands.cli serve gateway -> keep flags
for i in "${!ARGS[@]}"; do case "${ARGS[$i]}" in --port) ARGS[$((i+1))]=50951;; --http-port) ARGS[$((i+1))]=50950;; --metrics-port) ARGS[$((i+1))]=0;; --ready-file) ARGS[$((i+1))]="";; esac; done
.venv/bin/python -m cProfile -o $OUT/gw.prof -m commands.cli serve gateway "${ARGS[@]}" > $OUT/gw.log 2>&1 &
GW=$!
until curl -s -o /dev/null http://127.0.0.1:50950/health; do sleep 0.5; done
.venv/bin/python bench/results/2026-12-05-session22/c1-sim/probe.py 10 gw=http://127.0.0.1:50950/v1/chat/completions:sse > /dev/null
.venv/bin/python bench/results/2026-12-05-session22/c1-sim/probe.py ${N:-100} gw=http://127.0.0.1:50950/v1/chat/completions:sse
kill -INT $GW; wait $GW || true
