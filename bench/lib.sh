# Shared by the bench/*.sh scripts (source it after setting OUT): start a mesh, wait until it is
# up, bench it, stop it. MS is the meshserve command; UP_PID the running `meshserve up`.
MS=.venv/bin/meshserve
UP_PID=""

up() {  # up LABEL ARGS... : start a mesh with `meshserve up ARGS` and wait until it says it is up
  local label=$1; shift
  "$MS" up --run-dir "$OUT/run-$label" "$@" > "$OUT/up-$label.log" 2>&1 &
  UP_PID=$!
  until grep -q "meshserve is up" "$OUT/up-$label.log"; do
    kill -0 "$UP_PID" 2>/dev/null || { cat "$OUT/up-$label.log"; exit 1; }
    sleep 1
  done
}

down() {  # stop the mesh `up` started (Ctrl-C: every service drains)
  kill -INT "$UP_PID"; wait "$UP_PID" || true; UP_PID=""
}

bench() {  # bench LABEL ARGS... : one `meshserve bench` run, saved as $OUT/LABEL.json and .txt
  local label=$1; shift
  "$MS" bench --disable-tqdm --label "$label" --save-result "$OUT/$label.json" "$@" > "$OUT/$label.txt"
  grep -E "^(Successful|Failed) requests|Output token throughput|Median TTFT|P99 TTFT" "$OUT/$label.txt" || true
}

trap '[[ -n $UP_PID ]] && kill -INT "$UP_PID" 2>/dev/null; wait || true' EXIT
