#!/usr/bin/env bash
# One user: the client's TTFT and ITL next to what each stack's vLLM engine reports of the same
# requests (its own `vllm:time_to_first_token_seconds` and `vllm:inter_token_latency_seconds`,
# read from its metrics before and after each run; vLLM times tokens with the engine core's
# output timestamps). Where the two ITLs agree, a stack's token path adds nothing per token and a
# gap to the other stack is in its engine's steps. `vllm serve` on 8100 and `meshserve up --engine
# vllm --workers 1` on 8080, started once and idle between runs; ROUNDS alternated runs of N
# requests one at a time (64 -> 32 tokens, one seed per round) against each.
# DIRECT=1 adds a third run per round: the mesh's one worker straight over gRPC with `meshserve
# bench --service worker` (no Envoy, gateway or router on the path). If its engine steps as fast
# as `vllm serve`'s then, the mesh's slower steps come from the relay beside it; if not, from
# the worker's engine itself. MESH_FLAGS: more `meshserve up` flags (stacks.sh).
#   [DIRECT=1] engine_itl.sh OUT ROUNDS N
set -euo pipefail
OUT=$1; ROUNDS=${2:-6}; N=${3:-40}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/stacks.sh"  # from the repository root: MODEL, `vllm serve` (VLLM), mesh, ready, one_mesh
one_mesh
.venv/bin/python - "$OUT" "$ROUNDS" "$N" "$MODEL" "$HERE" <<'PY' | tee "$OUT/results.txt"
import os, sys
sys.path.insert(0, sys.argv[5])
import c1

out, rounds, n, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
grpc_addr, metrics_port = open(f"{out}/mesh-run/worker-0.ready").read().split()[:2]
worker_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
stacks = {
    "vllm": ("http://127.0.0.1:8100/metrics", lambda label, seed: c1.run(8100, out, label, n, model, seed)),
    "mesh": (worker_metrics, lambda label, seed: c1.run(8080, out, label, n, model, seed)),
}
if os.environ.get("DIRECT") == "1":
    stacks["direct"] = (worker_metrics, lambda label, seed: c1.run_worker(grpc_addr, out, label, n, seed))
c1.against_engines(out, rounds, stacks)
PY
