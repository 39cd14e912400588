"""One user in process, no server on the path: N requests one at a time (64 random numbers as
the prompt -> 32 tokens, ignore_eos, temperature 1) straight into vLLM's AsyncLLM, the token
intervals seen by the caller. VARIANT `plain`: AsyncLLM with the engine flags bench/peer.py gives
`vllm serve` (parsed by vLLM's own parser), vLLM's own process placement; `mesh`: the worker's VllmEngine with its config
(the defaults, or WorkerConfig fields as KEY=VALUE). Prints one JSON line.
  run.py VARIANT MODEL N [KEY=VALUE ...]   (from the repository's root; ab.sh runs it)"""

from __future__ import annotations

import asyncio
import json
import os
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

sys.path.insert(0, os.getcwd())
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
                  VLLM_LOGGING_LEVEL="WARNING")
WARMUP = 3


async def plain(model: str) -> Callable[[str, str], AsyncIterator[Any]]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind, SamplingParams
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    from vllm.v1.engine.async_llm import AsyncLLM

    from bench.peer import ENGINE_FLAGS  # the flags peer.py gives `vllm serve`, parsed as vLLM does

    cli = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args(["--model", model, *ENGINE_FLAGS])
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs.from_cli_args(cli))
    params = SamplingParams(max_tokens=32, temperature=1.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
    return lambda prompt, rid: llm.generate(prompt, params, rid)


async def mesh(model: str, overrides: dict[str, str]) -> Callable[[str, str], AsyncIterator[Any]]:
    from services.config import WorkerConfig
    from worker.engine import Request
    from worker.vllm_engine import VllmEngine

    fields: dict[str, Any] = {k: v == "true" if v in ("true", "false") else v for k, v in overrides.items()}
    engine = VllmEngine(WorkerConfig(engine="vllm", model=model, block_size=32, enforce_eager=True, **fields))
    await engine.start()
    return lambda prompt, rid: engine.generate(Request(request_id=rid, prompt=prompt, max_tokens=32,
                                                       temperature=1.0, ignore_eos=True))


async def main() -> None:
    variant, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    overrides = dict(a.split("=", 1) for a in sys.argv[4:])
    generate = await plain(model) if variant == "plain" else await mesh(model, overrides)
    rng = random.Random(7)
    itls: list[float] = []
    ttfts: list[float] = []
    for i in range(n + WARMUP):
        prompt = " ".join(str(rng.randrange(100, 1000)) for _ in range(64))
        last = time.perf_counter()
        gaps: list[float] = []
        async for _ in generate(prompt, f"r{i}"):
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        if i >= WARMUP:
            ttfts.append(gaps[0] * 1000)
            itls.extend(g * 1000 for g in gaps[1:])
    print(json.dumps({"variant": variant, "overrides": overrides, "ttft_median": statistics.median(ttfts),
                      "itl_mean": statistics.mean(itls), "itl_median": statistics.median(itls)}), flush=True)
    os._exit(0)  # the engine's processes are killed by ab.sh


if __name__ == "__main__":
    asyncio.run(main())
