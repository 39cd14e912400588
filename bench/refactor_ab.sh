#!/usr/bin/env bash
# A refactor must not change behaviour: the 300-user sim run of docs/benchmarks.md
# (4 sim workers through Envoy, 1200 requests, one seed) on the code of another source tree
# ("before", e.g. a worktree of an older commit) and on this one ("after"), alternated.
#   bench/refactor_ab.sh OUT_DIR BEFORE_TREE [ROUNDS]
source "$(dirname "$0")/usage.sh"  # -h, --help
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=$(realpath -m "$1"); BEFORE=$(realpath "$2"); ROUNDS=${3:-2}; ROOT=$PWD
mkdir -p "$OUT"
source bench/lib.sh
# The command line's module in the other tree, whatever its layout.
before_cli=meshserve.commands.cli
[[ -f $BEFORE/meshserve/__init__.py ]] || before_cli=commands.cli
[[ -f $BEFORE/meshserve/__init__.py || -f $BEFORE/commands/cli.py ]] || before_cli=services.cli
for round in $(seq "${FIRST_ROUND:-1}" $(( ${FIRST_ROUND:-1} + ROUNDS - 1 ))); do
  for side in ${ORDER:-after before}; do  # ORDER="before after" to start the other way round
    label=$side-$round
    if [[ $side == before ]]; then
      # From inside the other tree: `python -m` puts the working directory first on sys.path.
      (cd "$BEFORE" && exec env PYTHONPATH="$BEFORE" "$ROOT/.venv/bin/python" -m "$before_cli" up --engine sim \
        --workers 4 --run-dir "$OUT/run-$label") > "$OUT/up-$label.log" 2>&1 &
    else
      "$MS" up --engine sim --workers 4 --run-dir "$OUT/run-$label" > "$OUT/up-$label.log" 2>&1 &
    fi
    UP_PID=$!
    until grep -q "meshserve is up" "$OUT/up-$label.log"; do
      kill -0 "$UP_PID" 2>/dev/null || { cat "$OUT/up-$label.log"; exit 1; }
      sleep 1
    done
    bench "sim4-$label" --target 127.0.0.1:8080 --num-prompts 1200 --seed 0 "${USERS_300[@]}"
    down
  done
done
"$MS" compare "$OUT"/sim4-after-*.json "$OUT"/sim4-before-*.json | tee "$OUT/compare.txt"
