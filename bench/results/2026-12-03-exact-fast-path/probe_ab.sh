#!/bin/bash
# usage: probe_ab.sh TREE LABEL  -> starts a sim mesh from TREE, probes idle direct+envoy, stops
TREE=$1; LABEL=$2
cd $TREE
RUN=/tmp/probe-run-$LABEL; rm -rf $RUN; mkdir -p $RUN
/work/main/.venv/bin/python -m commands.cli up --engine sim --workers 4 --sim-speed 0.25 --run-dir $RUN --gateway-port 50070 > $RUN/up.log 2>&1 &
UP=$!
for i in $(seq 120); do sleep 1; grep -q "curl" $RUN/up.log && break; done
GW=127.0.0.1:50070
ENVOY=127.0.0.1:8080
echo "$LABEL gw=$GW"
for r in 1 2; do
/work/main/.venv/bin/python /work/main/bench/results/2026-12-03-cache-stores/probe.py $GW 1000
/work/main/.venv/bin/python /work/main/bench/results/2026-12-03-cache-stores/probe.py $ENVOY 1000
done
kill -INT $UP; wait $UP
