# Sourced by run.sh, ab.sh and engine_itl.sh (OUT set): moves to the repository's root and makes
# OUT there; the tiny model, the engine settings bench/peer.py gives every stack, and `vllm serve`
# on 8100 (its pid in VLLM, log OUT/vllm.log); then `ready`, `mesh` and `one_mesh` below.
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # absolute: a mesh may start from another tree
MODEL=$(.venv/bin/meshserve make-model | tail -1)
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_LOGGING_LEVEL=WARNING
FLAGS=$(.venv/bin/python -c "import sys; sys.path.insert(0, '.'); from bench.peer import ENGINE_FLAGS; print(' '.join(ENGINE_FLAGS))")
setsid .venv/bin/vllm serve "$MODEL" --served-model-name meshserve-tiny --host 127.0.0.1 --port 8100 $FLAGS \
  > "$OUT/vllm.log" 2>&1 &
VLLM=$!

# Waits until every URL given answers.
ready() {
  for url in "$@"; do
    until curl -sf "$url" > /dev/null; do sleep 1; done
  done
}

# Starts `meshserve up --engine vllm --workers 1` on the model as NAME (run dir OUT/NAME-run, log
# OUT/NAME-up.log), with FLAGS after it (other ports), under `env ENV` (may be empty), from the
# source tree MESH_DIR if set (e.g. a worktree), else this one: mesh NAME ENV FLAGS...
mesh() {
  local name=$1 env=$2 root=$PWD
  shift 2
  # shellcheck disable=SC2086  # ENV is NAME=VALUE words for env
  (cd "${MESH_DIR:-$root}" && exec setsid env PYTHONPATH="$PWD" $env "$root/.venv/bin/meshserve" up --engine vllm \
    --workers 1 --model "$MODEL" --enforce-eager --run-dir "$OUT/$name-run" "$@" > "$OUT/$name-up.log" 2>&1) &
}

# `vllm serve` and one mesh (NAME mesh, port 8080, MESH_FLAGS after it if set), both stopped when
# the script exits; returns once both answer.
one_mesh() {
  # shellcheck disable=SC2086  # MESH_FLAGS is words
  mesh mesh "" --port 8080 ${MESH_FLAGS:-}
  MESH=$!
  trap 'kill -INT -- -$MESH 2>/dev/null; kill -TERM -- -$VLLM 2>/dev/null; wait' EXIT
  ready http://127.0.0.1:8100/health http://127.0.0.1:8080/v1/models
}
