#!/bin/bash
# c1 on an idle sim mesh: CPU per token of each process (probe.py through Envoy, N requests x 32 tokens)
OUT=$1; shift; N=${N:-150}
mkdir -p $OUT; cd /work/main
.venv/bin/meshserve up --engine sim --workers 1 --sim-itl-base-ms 2 --sim-prefill-ms-per-token 0.02 --run-dir $OUT/run --gateway-http-port 8091 "$@" > $OUT/up.log 2>&1 &
UP=$!
until grep -q "meshserve is up" $OUT/up.log; do kill -0 $UP || exit 1; sleep 1; done
cpu() { for s in gateway router worker cache traces; do p=$(pgrep -f "commands.cli serve $s" | head -1) || continue; awk -v s=$s '{print s, ($14 + $15) / 100}' /proc/$p/stat; done
  awk '{print "envoy", ($14 + $15) / 100}' /proc/$(pgrep -f "_bin/envoy" | head -1)/stat; }
.venv/bin/python bench/results/2026-12-05-session22/c1-sim/probe.py 10 envoy=http://127.0.0.1:8080/v1/chat/completions > /dev/null
cpu | sort > $OUT/before
if [ -n "$SPY" ]; then /tmp/pyspy/bin/py-spy record -p $(pgrep -f "commands.cli serve $SPY" | head -1) -r 500 -f raw -o $OUT/$SPY.txt --nonblocking -d 15 >/dev/null 2>&1 & fi
.venv/bin/python bench/results/2026-12-05-session22/c1-sim/probe.py $N envoy=http://127.0.0.1:8080/v1/chat/completions | tee $OUT/probe.txt
cpu | sort > $OUT/after
join $OUT/before $OUT/after | awk -v n=$N '{printf "%-8s %6.0f us/token\n", $1, ($3-$2)*1e6/(n*32)}' | tee $OUT/cpu.txt
kill -INT $UP; wait $UP
