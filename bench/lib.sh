# Shared by the bench/*.sh scripts (source it after setting OUT): start a mesh, wait until it is
# up, bench it, stop it. MS is the meshserve command; UP_PID the running `meshserve up`.
MS=.venv/bin/meshserve
UP_PID=""
# The 300-user workload of docs/benchmarks.md (128 -> 64 tokens); scripts add --target and --num-prompts.
USERS_300=(--max-concurrency 300 --random-input-len 128 --random-output-len 64 --num-warmups 10)

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

mesh_cpu() {  # CPU seconds (user + system) used so far by the running mesh's processes
  .venv/bin/python -c 'import psutil, sys
p = psutil.Process(int(sys.argv[1]))
print(sum(sum(q.cpu_times()[:2]) for q in [p, *p.children(recursive=True)]))' "$UP_PID"
}

bench() {  # bench LABEL ARGS... : one `meshserve bench` run, saved as $OUT/LABEL.json and .txt;
  # with a mesh up, the JSON also gets mesh_cpu_s: the CPU seconds its processes used meanwhile
  # (warm-ups included) -- steadier than throughput on a shared machine.
  local label=$1; shift
  local cpu0=""
  [[ -n $UP_PID ]] && cpu0=$(mesh_cpu)
  "$MS" bench --disable-tqdm --label "$label" --save-result "$OUT/$label.json" "$@" > "$OUT/$label.txt"
  if [[ -n $cpu0 ]]; then
    .venv/bin/python -c 'import json, sys
path, cpu = sys.argv[1], float(sys.argv[2]) - float(sys.argv[3])
d = json.load(open(path)); d["mesh_cpu_s"] = round(cpu, 3); json.dump(d, open(path, "w"), indent=2)' \
      "$OUT/$label.json" "$(mesh_cpu)" "$cpu0"
  fi
  grep -E "^(Successful|Failed) requests|Output token throughput|Median TTFT|P99 TTFT" "$OUT/$label.txt" || true
}

trap '[[ -n $UP_PID ]] && kill -INT "$UP_PID" 2>/dev/null; wait || true' EXIT
