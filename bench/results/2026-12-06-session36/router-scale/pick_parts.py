"""In-process cost of a pick, whole and by part: 256 workers, kv-aware, prefix_repetition prompts
(as bench/router_scale.py), the router's tracer set up as a router without an OTLP endpoint.

    .venv/bin/python bench/results/2026-12-06-session36/router-scale/pick_parts.py   (from the repo root)
"""
import asyncio
import os
import random
import sys
import time

import numpy as np

sys.path.insert(0, os.getcwd())
from commands.bench import prefix_repetition_requests  # noqa: E402
from router.policies import PickContext  # noqa: E402
from router.server import RouterCore  # noqa: E402
from router.state import WorkerLoad  # noqa: E402
from services import telemetry  # noqa: E402
from services.config import RouterConfig, RoutingConfig  # noqa: E402
from services.gen import meshserve_pb2 as pb  # noqa: E402
from services.prompts import block_hashes, sim_tokenize  # noqa: E402


def timed(name: str, f, k: int = 3000) -> None:
    best = 1e9
    for _ in range(3):
        start = time.perf_counter()
        for i in range(k):
            f(i)
        best = min(best, (time.perf_counter() - start) / k * 1e6)
    print(f"{name:28s} {best:7.1f} us")


async def main() -> None:
    telemetry.setup_tracing("router", RouterConfig())
    addrs = [f"127.0.0.1:{10000 + i}" for i in range(256)]
    core = RouterCore(RoutingConfig(workers=addrs))
    r = core.router
    await r.prefix.configure("sim", 16)
    rng = random.Random(0)
    prompts = [q.prompt for q in prefix_repetition_requests(2000, 16, 192, 64, 1, rng)]
    prefix_blocks = [block_hashes(sim_tokenize(p), 16) for p in prompts[:64]]
    for i, a in enumerate(addrs):
        r.table.on_connected(a, f"sim-{i}")
        r.table.on_report(a, WorkerLoad(num_running=rng.randint(0, 64), num_waiting=rng.randint(0, 4),
                                        kv_cache_usage=rng.random(), max_num_seqs=256))
        r.kv.reset(a, {h for chain in random.Random(i).sample(prefix_blocks, 4) for h in chain})
    requests = [pb.PickRequest(request_id="x", prompt=p) for p in prompts]
    for i in range(3000):  # the pending record as in steady state
        core.servicer.answer(requests[i % 2000])
    timed("answer (whole)", lambda i: core.servicer.answer(requests[i % 2000]))
    timed("chain (tokenize + hash)", lambda i: r.prefix.chain(prompts[i % 2000], None))
    chains = [r.prefix.chain(p, None) for p in prompts]
    fleet, now = r.table.fleet(), r._clock()
    timed("_cached (kv + pending)", lambda i: r._cached("kv", chains[i % 2000], now, fleet.rows))
    timed("table.fleet", lambda i: r.table.fleet())
    ctxs = [PickContext(request_id="x", prompt=p, block_hashes=c, now=r.table.now(),
                        cached_blocks=r._cached("kv", c, now, fleet.rows)) for p, c in zip(prompts[:500], chains)]
    timed("policy.pick", lambda i: r.policy.pick(ctxs[i % 500], fleet, r._rng))
    mask, rows = np.ones(len(fleet), dtype=bool), np.arange(len(fleet))
    for f in r.policy.filters:
        timed(f"  filter {type(f).__name__}", lambda i, f=f: f.keep(ctxs[i % 500], fleet, mask))
    for scorer, _ in r.policy.scorers:
        timed(f"  scorer {type(scorer).__name__}", lambda i, s=scorer: s.score(ctxs[i % 500], fleet, rows))
    timed("pending.stored", lambda i: r.pending.stored(addrs[i % 256], chains[i % 2000], at=now))


asyncio.run(main())
