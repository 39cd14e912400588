#!/usr/bin/env bash
# One user, three ways into running stacks: `vllm serve` (8100) and the mesh through Envoy (8080)
# with `vllm bench serve` (c1.py), and the mesh's one worker directly over gRPC with `meshserve
# bench --service worker` (no Envoy, gateway or router on the path). Around each run, each
# engine's own vLLM metrics (TTFT and ITL from the engine core's timestamps), as engine_itl.sh.
# If the engine steps as fast when the worker is called directly as under `vllm serve`, the
# mesh's slower steps come from the relay's processes beside it; if not, from the worker itself.
# ROUNDS alternated rounds of N requests one at a time (64 -> 32 tokens, one seed per round).
#   direct.sh OUT ROUNDS N
set -euo pipefail
OUT=$1; ROUNDS=${2:-6}; N=${3:-40}
HERE=$(cd "$(dirname "$0")" && pwd)
source "$HERE/stacks.sh"  # from the repository root: MODEL, `vllm serve` (VLLM), mesh, ready, one_mesh
one_mesh
.venv/bin/python - "$OUT" "$ROUNDS" "$N" "$MODEL" "$HERE" <<'PY' | tee "$OUT/results.txt"
import json, statistics, subprocess, sys, urllib.request
sys.path.insert(0, sys.argv[5])
import c1

out, rounds, n, model = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
grpc_addr, metrics_port = open(f"{out}/mesh-run/worker-0.ready").read().split()[:2]
worker_metrics = f"http://127.0.0.1:{metrics_port}/metrics"
SERIES = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds")


def scrape(url: str) -> dict[str, float]:
    got: dict[str, float] = {}
    for line in urllib.request.urlopen(url).read().decode().splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith(("_sum", "_count")) and name.rsplit("_", 1)[0] in SERIES:
            got[name] = got.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return got


def direct(label: str, seed: int) -> dict:
    subprocess.run([".venv/bin/meshserve", "bench", "--target", grpc_addr, "--service", "worker",
                    "--model", "meshserve-tiny", "--dataset-name", "random", "--random-input-len", "64",
                    "--random-output-len", "32", "--num-prompts", str(n), "--max-concurrency", "1",
                    "--ignore-eos", "--temperature", "1.0", "--seed", str(seed), "--disable-tqdm",
                    "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir", out,
                    "--result-filename", f"{label}.json"], stdout=subprocess.DEVNULL, check=True)
    return json.load(open(f"{out}/{label}.json"))


stacks = {
    "vllm": ("http://127.0.0.1:8100/metrics",
             lambda label, seed: c1.run(8100, out, label, n, model, seed)),
    "mesh": (worker_metrics, lambda label, seed: c1.run(8080, out, label, n, model, seed)),
    "direct": (worker_metrics, direct),
}
rows: dict[str, list[tuple[float, ...]]] = {}
for rnd in range(rounds):
    for name in list(stacks) if rnd % 2 == 0 else list(stacks)[::-1]:
        metrics, run = stacks[name]
        before = scrape(metrics)
        r = run(f"{name}-{rnd}", 3000 + rnd)
        after = scrape(metrics)
        d = {k: after[k] - before.get(k, 0.0) for k in after}
        engine = [1000 * d[f"{s}_sum"] / max(1.0, d[f"{s}_count"]) for s in SERIES]
        row = (r["mean_ttft_ms"], engine[0], r["mean_itl_ms"], engine[1], r["median_ttft_ms"], r["median_tpot_ms"])
        rows.setdefault(name, []).append(row)
        print(f"round {rnd} {name:6s} mean TTFT client {row[0]:6.2f} engine {row[1]:6.2f} | mean ITL client "
              f"{row[2]:5.2f} engine {row[3]:5.2f} | median TTFT {row[4]:6.2f} TPOT {row[5]:5.2f}", flush=True)
print("medians over rounds:")
for name, rs in rows.items():
    m = [statistics.median(r[i] for r in rs) for i in range(6)]
    print(f"{name:6s} mean TTFT client {m[0]:6.2f} engine {m[1]:6.2f} | mean ITL client {m[2]:5.2f} engine "
          f"{m[3]:5.2f} | median TTFT {m[4]:6.2f} TPOT {m[5]:5.2f}")
json.dump(rows, open(f"{out}/rows.json", "w"))
PY
