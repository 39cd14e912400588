"""One user's run against a stack, for the scripts beside this file (run from the repository's
root): N requests one at a time, 64 -> 32 tokens, --ignore-eos, the seed given; the result saved
as OUT/LABEL.json and returned. `run`: chat through an OpenAI endpoint with `vllm bench serve`;
`run_worker`: one worker's Worker/Generate with `meshserve bench --service worker`. And
`against_engines`: rounds of such runs, each stack's client figures next to its engine's own
(engine_itl.sh)."""

from __future__ import annotations

import json
import statistics
import subprocess
import urllib.request
from collections.abc import Callable
from typing import Any


def run(port: int, out: str, label: str, n: int, model: str, seed: int) -> dict[str, Any]:
    subprocess.run([".venv/bin/vllm", "bench", "serve", "--backend", "openai-chat", "--base-url",
                    f"http://127.0.0.1:{port}", "--endpoint", "/v1/chat/completions", "--model",
                    "meshserve-tiny", "--tokenizer", model, "--dataset-name", "random", "--random-input-len", "64",
                    "--random-output-len", "32", "--num-prompts", str(n), "--max-concurrency", "1",
                    "--ignore-eos", "--seed", str(seed), "--disable-tqdm", "--percentile-metrics",
                    "ttft,tpot,itl,e2el", "--save-result", "--result-dir", out, "--result-filename", f"{label}.json"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return _result(out, label)


def run_worker(address: str, out: str, label: str, n: int, seed: int) -> dict[str, Any]:
    """The same workload sent straight to the worker at ADDRESS (gRPC), temperature 1 as `vllm
    bench serve` leaves it."""
    subprocess.run([".venv/bin/meshserve", "bench", "--target", address, "--service", "worker",
                    "--model", "meshserve-tiny", "--dataset-name", "random", "--random-input-len", "64",
                    "--random-output-len", "32", "--num-prompts", str(n), "--max-concurrency", "1",
                    "--ignore-eos", "--temperature", "1.0", "--seed", str(seed), "--disable-tqdm",
                    "--percentile-metrics", "ttft,tpot,itl,e2el", "--save-result", "--result-dir", out,
                    "--result-filename", f"{label}.json"], stdout=subprocess.DEVNULL, check=True)
    return _result(out, label)


def _result(out: str, label: str) -> dict[str, Any]:
    with open(f"{out}/{label}.json") as f:
        return json.load(f)


SERIES = ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds")


def scrape(url: str) -> dict[str, float]:
    """Each of vLLM's TTFT and ITL series' _sum and _count at a metrics URL, over all label sets."""
    got: dict[str, float] = {}
    for line in urllib.request.urlopen(url).read().decode().splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name.endswith(("_sum", "_count")) and name.rsplit("_", 1)[0] in SERIES:
            got[name] = got.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return got


def against_engines(out: str, rounds: int, stacks: dict[str, tuple[str, Callable[[str, int], dict[str, Any]]]]) -> None:
    """ROUNDS rounds of one run per stack (NAME -> (its engine's metrics URL, run(label, seed))),
    the order reversed every other round, one seed per round. Prints each run's client TTFT and
    ITL next to its engine's (vLLM's metrics read around the run) and the medians over rounds;
    the rows go to OUT/rows.json."""
    rows: dict[str, list[tuple[float, ...]]] = {}
    for rnd in range(rounds):
        for name in list(stacks) if rnd % 2 == 0 else list(stacks)[::-1]:
            metrics, run_one = stacks[name]
            before = scrape(metrics)
            r = run_one(f"{name}-{rnd}", 3000 + rnd)
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
    with open(f"{out}/rows.json", "w") as f:
        json.dump(rows, f)
