#!/bin/bash
# per-thread CPU (user/sys ticks) of a service during a c1 probe on the idle sim mesh; strace -c of its main thread
OUT=$1; SVC=${SVC:-gateway}; N=${N:-100}; shift
mkdir -p $OUT; cd /work/main
.venv/bin/meshserve up --engine sim --workers 1 --sim-itl-base-ms 2 --sim-prefill-ms-per-token 0.02 --run-dir $OUT/run "$@" > $OUT/up.log 2>&1 &
UP=$!
until grep -q "meshserve is up" $OUT/up.log; do kill -0 $UP || exit 1; sleep 1; done
P=$(pgrep -f "commands.cli serve $SVC" | head -1)
snap() { for t in /proc/$P/task/*; do echo "$(basename $t) $(cat $t/comm | tr ' ' _) $(awk '{print $14, $15}' $t/stat)"; done | sort; }
.venv/bin/python bench/results/2026-12-05-session22/c1-sim/probe.py 10 envoy=http://127.0.0.1:8080/v1/chat/completions > /dev/null
snap > $OUT/t1
if [ -n "$STRACE" ]; then timeout 8 strace -c -p $P -o $OUT/strace.txt & fi
.venv/bin/python bench/results/2026-12-05-session22/c1-sim/probe.py $N envoy=http://127.0.0.1:8080/v1/chat/completions | tee $OUT/probe.txt
snap > $OUT/t2
python3 -c "
a = {l.split()[0]: l.split() for l in open('$OUT/t1')}; 
for l in open('$OUT/t2'):
    t, c, u, s = l.split(); _, _, u0, s0 = a.get(t, [t, c, u, s])
    du, ds = int(u) - int(u0), int(s) - int(s0)
    if du + ds: print(f'{t:8s} {c:18s} user {du:4d} sys {ds:4d} ticks')"
kill -INT $UP; wait $UP
