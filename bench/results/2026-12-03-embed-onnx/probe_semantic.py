"""Semantic-hit latency probe (issue 10): one greedy question stored once, then N paraphrases
never asked before, each once (a paraphrase answered once becomes an exact entry, so none repeats).

    .venv/bin/python bench/results/2026-12-03-embed-onnx/probe_semantic.py TARGET N

Prints the p50 / p90 / p99 of the time to the first chunk of the requests answered by meaning,
and how many were answered otherwise (guards or threshold: a miss, generated).
"""

import asyncio
import itertools
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from services.gen import meshserve_pb2 as pb  # noqa: E402
from services.gen import meshserve_pb2_grpc as pb_grpc  # noqa: E402
from services.server import insecure_channel  # noqa: E402

PREFIXES = ["", "please ", "hey, ", "quick question: ", "could you tell me ", "tell me ", "so, ", "hi! "]
CORES = ["what is the capital city of {}?", "what's the capital city of {}?", "which city is the capital of {}?",
         "what is the capital of the country {}?", "name the capital city of {}."]
SUFFIXES = ["", " thanks", " please", " thank you", " :)"]


async def main(target: str, n: int) -> None:
    topic = f"Zorbania-{uuid.uuid4().hex[:6]}"  # a fresh question each run: nothing cached before
    async with insecure_channel(target) as channel:
        stub = pb_grpc.InferenceStub(channel)

        def request(text: str) -> pb.GenerateRequest:
            return pb.GenerateRequest(prompt=text, max_tokens=16, temperature=0, cache="semantic")

        [c async for c in stub.Generate(request(f"What is the capital city of {topic}?"))]
        await asyncio.sleep(2.0)  # stored and indexed by meaning
        hits, kinds = [], {}
        variants = [p + c.format(topic) + s for p, c, s in itertools.product(PREFIXES, CORES, SUFFIXES)]
        for text in variants[1:n + 1]:
            started = time.perf_counter()
            async for chunk in stub.Generate(request(text)):
                kind = chunk.cache_kind or "none"
                kinds[kind] = kinds.get(kind, 0) + 1
                if kind == "semantic":  # answered by meaning
                    hits.append(time.perf_counter() - started)
                break
        hits.sort()

        def q(p: float) -> float:
            return hits[min(len(hits) - 1, int(p * len(hits)))] * 1000 if hits else float("nan")

        print(f"{target}: semantic hits {len(hits)} of {min(n, len(variants) - 1)} kinds={kinds} "
              f"p50 {q(0.5):.2f} p90 {q(0.9):.2f} p99 {q(0.99):.2f} ms")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
