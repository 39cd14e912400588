"""One user in process, no server on the path: N requests one at a time (64 random numbers as
the prompt -> 32 tokens, ignore_eos, temperature 1) straight into vLLM's AsyncLLM, the token
intervals seen by the caller. VARIANT `plain`: AsyncLLM with `vllm serve`'s engine settings of
bench/peer.py, vLLM's own process placement; `mesh`: the worker's VllmEngine with its config
(the defaults, or WorkerConfig fields as KEY=VALUE). Prints one JSON line.
  run.py VARIANT MODEL N [KEY=VALUE ...]   (from the repository's root; ab.sh runs it)"""
import asyncio, json, os, random, statistics, sys, time
sys.path.insert(0, os.getcwd())
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", VLLM_LOGGING_LEVEL="WARNING")


async def main():
    variant, model, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    overrides = dict(a.split("=", 1) for a in sys.argv[4:])
    rng = random.Random(7)
    itls, ttfts = [], []
    if variant == "plain":
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM
        from vllm.sampling_params import SamplingParams, RequestOutputKind
        from vllm.inputs import TokensPrompt
        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, max_num_seqs=256, max_model_len=2048, block_size=32,
                                                        kv_cache_memory_bytes=256 * 2**20, enforce_eager=True,
                                                        disable_log_stats=False))
        async def gen(ids, rid):
            p = SamplingParams(max_tokens=32, temperature=1.0, ignore_eos=True, output_kind=RequestOutputKind.DELTA)
            async for out in llm.generate(" ".join(str(i) for i in ids), p, rid):
                yield out
    else:
        from services.config import WorkerConfig
        from worker.engine import Request
        from worker.vllm_engine import VllmEngine
        kw = {k: (v == "true" if v in ("true", "false") else v) for k, v in overrides.items()}
        eng = VllmEngine(WorkerConfig(engine="vllm", model=model, block_size=32, enforce_eager=True, **kw))
        await eng.start()
        async def gen(ids, rid):
            r = Request(request_id=rid, prompt=" ".join(str(i) for i in ids), max_tokens=32, temperature=1.0,
                        ignore_eos=True)
            async for d in eng.generate(r):
                yield d
    for i in range(n + 3):
        ids = [rng.randrange(100, 1000) for _ in range(64)]
        t0 = time.perf_counter(); last = None; first = None; gaps = []
        async for _ in gen(ids, f"r{i}"):
            now = time.perf_counter()
            if first is None: first = now - t0
            else: gaps.append(now - last)
            last = now
        if i >= 3:
            ttfts.append(first * 1000); itls.extend(g * 1000 for g in gaps)
    print(json.dumps({"variant": variant, "overrides": overrides, "ttft_median": statistics.median(ttfts),
                      "itl_mean": statistics.mean(itls), "itl_median": statistics.median(itls)}), flush=True)
    os._exit(0)

if __name__ == "__main__":
    asyncio.run(main())
