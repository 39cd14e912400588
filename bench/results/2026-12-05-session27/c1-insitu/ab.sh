#!/usr/bin/env bash
# One user, two meshes and `vllm serve` side by side (started once, idle between runs): mesh A
# with the environment as it is, mesh B with B_ENV (e.g. "GRPC_EXPERIMENTS=..."), alternated
# rounds of N requests one at a time (64 -> 32 tokens, one seed per round) against each. With
# B_DIR, mesh B runs from that source tree (e.g. a worktree of another commit); B_FLAGS: more
# `meshserve up` flags for mesh B.
#   [B_ENV="NAME=VALUE"] [B_DIR=/tmp/tree] [B_FLAGS="--no-kv-events"] ab.sh OUT ROUNDS N
set -euo pipefail
OUT=$1; ROUNDS=${2:-6}; N=${3:-40}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/stacks.sh"  # from the repository root: MODEL, `vllm serve` (VLLM), mesh, ready
mesh a "" --port 8080
A=$!
MESH_DIR=${B_DIR:-} mesh b "${B_ENV:-}" --port 8081 --admin-port 9911 --gateway-port 50451 --gateway-http-port 50450 --router-port 50452 \
  --cache-port 50453 --worker-port 50461 --redis-port 6399 --trace-port 4417 ${B_FLAGS:-}
B=$!
trap 'kill -INT -- -$A -$B 2>/dev/null; kill -TERM -- -$VLLM 2>/dev/null; wait' EXIT
ready http://127.0.0.1:8100/health http://127.0.0.1:8080/v1/models http://127.0.0.1:8081/v1/models
.venv/bin/python - "$OUT" "$ROUNDS" "$N" "$MODEL" "$HERE" <<'PY' | tee "$OUT/results.txt"
import json, statistics, sys
sys.path.insert(0, sys.argv[5])
import c1
out, rounds, n, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
stacks = {"vllm": 8100, "a": 8080, "b": 8081}
rows: dict[str, list[tuple[float, float]]] = {}
for rnd in range(rounds):
    names = list(stacks)[rnd % 3:] + list(stacks)[:rnd % 3]
    for name in names:
        r = c1.run(stacks[name], out, f"{name}-{rnd}", n, model, 2000 + rnd)
        rows.setdefault(name, []).append((r["median_ttft_ms"], r["median_tpot_ms"]))
        print(f"round {rnd} {name:5s} TTFT {r['median_ttft_ms']:6.2f}  TPOT {r['median_tpot_ms']:5.2f}", flush=True)
print("medians:")
for name, rs in rows.items():
    print(f"{name:5s} TTFT {statistics.median(r[0] for r in rs):6.2f}  TPOT {statistics.median(r[1] for r in rs):5.2f}")
json.dump(rows, open(f"{out}/rows.json", "w"))
PY
