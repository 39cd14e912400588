#!/usr/bin/env bash
# procab.sh OUT TREE LABEL : one 300-user sim run on TREE, per-process CPU before/after the bench
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$(realpath -m "$1"); TREE=$(realpath "$2"); LABEL=$3
cd "$HERE/../../.."; ROOT=$PWD
mkdir -p "$OUT"
source bench/lib.sh
cli=commands.cli; [[ -f $TREE/commands/cli.py ]] || cli=services.cli
(cd "$TREE" && exec env PYTHONPATH="$TREE" "$ROOT/.venv/bin/python" -m "$cli" up --engine sim \
  --workers 4 --run-dir "$OUT/run-$LABEL") > "$OUT/up-$LABEL.log" 2>&1 &
UP_PID=$!
until grep -q "meshserve is up" "$OUT/up-$LABEL.log"; do
  kill -0 "$UP_PID" 2>/dev/null || { cat "$OUT/up-$LABEL.log"; exit 1; }
  sleep 1
done
.venv/bin/python "$HERE/cpu_by_proc.py" $UP_PID > "$OUT/cpu0-$LABEL.json"
"$MS" bench --disable-tqdm --label "$LABEL" --save-result "$OUT/$LABEL.json" --target 127.0.0.1:8080 --num-prompts 1200 --seed 0 "${USERS_300[@]}" > "$OUT/$LABEL.txt"
.venv/bin/python "$HERE/cpu_by_proc.py" $UP_PID > "$OUT/cpu1-$LABEL.json"
down
.venv/bin/python - "$OUT" "$LABEL" <<'PY'
import json, sys
out, label = sys.argv[1:]
a = json.load(open(f"{out}/cpu0-{label}.json")); b = json.load(open(f"{out}/cpu1-{label}.json"))
tot = 0
for k in b:
    d = b[k] - a.get(k, 0); tot += d
    print(f"{d:7.2f}  {k}")
print(f"{tot:7.2f}  TOTAL {label}")
PY
