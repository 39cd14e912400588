"""One short text at a time, and batches of 16, through two embedding runtimes on one thread:
    taskset -c 1 .venv/bin/python bench/results/2026-12-03-embed-onnx/embed_micro.py [RUNTIME RUNTIME]
(onnx and torch unless named; session 23 ran it with onnx onnx-int8)."""

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from cache_service.embedder import Embedder  # noqa: E402

TEXTS = ["How do I reset my password on the company portal?", "What is the capital of France and why?",
         "Write a python function that sorts a list of 3 numbers", "convert 5 miles to km"]
RUNTIMES = sys.argv[1:3] or ["onnx", "torch"]
models = {runtime: Embedder(runtime=runtime) for runtime in RUNTIMES}
a, b = (models[r].encode(TEXTS) for r in RUNTIMES)
print(f"cosine {'/'.join(RUNTIMES)}: min {float(np.min(np.sum(a * b, axis=1))):.6f}")
for round_ in (1, 2):
    for runtime, model in models.items():
        times = []
        for k in range(200):
            started = time.perf_counter()
            model.encode([TEXTS[k % 4]])
            times.append(time.perf_counter() - started)
        times.sort()
        started = time.perf_counter()
        for _ in range(20):
            model.encode(TEXTS * 4)
        batch = (time.perf_counter() - started) / 20 / 16
        print(f"round {round_} {runtime}: one text p50 {times[100] * 1e3:.2f} p99 {times[198] * 1e3:.2f} ms; "
              f"batches of 16 {batch * 1e3:.2f} ms a text")
