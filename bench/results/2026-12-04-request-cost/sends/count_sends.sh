#!/usr/bin/env bash
# Count the gateway's and Envoy's send syscalls per request under the request_cost load (TREE=...).
set -euo pipefail
TREE=${TREE:-/work/main}; OUT=$1; mkdir -p $OUT; cd $TREE; export PYTHONPATH=$TREE
/work/main/.venv/bin/python -m commands.cli up --engine sim --workers 1 --run-dir $OUT/run > $OUT/up.log 2>&1 &
UP=$!; trap 'kill -INT $UP; wait $UP || true' EXIT
until grep -q "meshserve is up" $OUT/up.log; do sleep 1; done
W="wrk -t1 -c32 -s /work/main/bench/request_cost.lua http://127.0.0.1:8080"
$W -d3s > /dev/null
gw=$(pgrep -f "commands.cli serve gateway" | head -1)
timeout -s INT 12 strace -c -f -e trace=sendto,sendmsg,write,writev -p $gw -o $OUT/gw.strace > /dev/null 2>&1 &
ST=$!
$W -d10s > $OUT/wrk.txt
wait $ST || true
n=$(grep -oE "^ +[0-9]+ requests" $OUT/wrk.txt | awk '{print $1}')
echo "requests $n"; awk -v n=$n '/sendto|sendmsg|write|writev/ && $4 ~ /^[0-9]+$/ {printf "%s %.2f per request\n", $NF, $4/n}' $OUT/gw.strace
