"""One user's run of `vllm bench serve` against a stack, for the scripts beside this file (run
from the repository's root): N chat requests one at a time, 64 -> 32 tokens, --ignore-eos, the
seed given; the result saved as OUT/LABEL.json and returned."""

from __future__ import annotations

import json
import subprocess
from typing import Any


def run(port: int, out: str, label: str, n: int, model: str, seed: int) -> dict[str, Any]:
    subprocess.run([".venv/bin/vllm", "bench", "serve", "--backend", "openai-chat", "--base-url",
                    f"http://127.0.0.1:{port}", "--endpoint", "/v1/chat/completions", "--model",
                    "meshserve-tiny", "--tokenizer", model, "--dataset-name", "random", "--random-input-len", "64",
                    "--random-output-len", "32", "--num-prompts", str(n), "--max-concurrency", "1",
                    "--ignore-eos", "--seed", str(seed), "--disable-tqdm", "--percentile-metrics",
                    "ttft,tpot,itl,e2el", "--save-result", "--result-dir", out, "--result-filename", f"{label}.json"],
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    with open(f"{out}/{label}.json") as f:
        return json.load(f)
