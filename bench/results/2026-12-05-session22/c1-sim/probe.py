import asyncio, json, random, statistics, sys, time
import aiohttp
WORDS = "alpha beta gamma delta river stone cloud paper light green house music table window garden".split()
async def one(s, url, prompt):
    body = {"model": "meshserve-tiny", "stream": True, "max_tokens": 32, "ignore_eos": True,
            "messages": [{"role": "user", "content": prompt}]}
    t0 = time.perf_counter(); stamps = []
    async with s.post(url, json=body) as r:
        async for line in r.content:
            if line.startswith(b"data: {"):
                stamps.append(time.perf_counter())
    return (stamps[0] - t0) * 1e3, (stamps[-1] - stamps[0]) * 1e3 / max(1, len(stamps) - 1)
async def main():
    targets = dict(a.split("=", 1) for a in sys.argv[2:])
    n = int(sys.argv[1]); rng = random.Random(0)
    res = {k: [] for k in targets}
    async with aiohttp.ClientSession() as s:
        for i in range(n):
            prompt = " ".join(rng.choice(WORDS) for _ in range(64))
            for k, url in targets.items():
                res[k].append(await one(s, url, f"{k} {i} " + prompt))
    for k, v in res.items():
        v = v[5:]
        print(f"{k:10s} TTFT median {statistics.median(t for t, _ in v):6.2f} ms  p90 {sorted(t for t,_ in v)[int(len(v)*.9)]:6.2f}  TPOT median {statistics.median(p for _, p in v):5.2f} ms")
asyncio.run(main())
