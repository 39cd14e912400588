"""Exact-hit latency probe (issue 10): one cached greedy request asked N times in a row.

    .venv/bin/python bench/results/2026-12-03-cache-stores/probe.py TARGET N

TARGET is the gateway (host:port) or Envoy; the first call stores the answer, the rest are hits.
Prints the p50 / p90 / p99 of the time to the first (and only) chunk.
"""

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from services.gen import meshserve_pb2 as pb  # noqa: E402
from services.gen import meshserve_pb2_grpc as pb_grpc  # noqa: E402
from services.server import insecure_channel  # noqa: E402


async def main(target: str, n: int) -> None:
    async with insecure_channel(target) as channel:
        stub = pb_grpc.InferenceStub(channel)
        req = pb.GenerateRequest(prompt="probe: what is the capital of France?", max_tokens=16, temperature=0,
                                 cache="exact")
        [c async for c in stub.Generate(req)]
        await asyncio.sleep(1.0)  # the store lands (the flight that holds the answer closes)
        latencies, kinds = [], set()
        for _ in range(n):
            started = time.perf_counter()
            async for chunk in stub.Generate(req):
                latencies.append(time.perf_counter() - started)
                kinds.add(chunk.cache_kind)
                break
        latencies.sort()

        def q(p: float) -> float:
            return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

        print(f"{target}: n={len(latencies)} kinds={kinds} p50 {q(0.5):.2f} p90 {q(0.9):.2f} "
              f"p99 {q(0.99):.2f} max {latencies[-1] * 1000:.2f} ms")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2])))
