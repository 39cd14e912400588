import asyncio
import random, sys, time, statistics
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "/work/main")
from router.server import Router
from router.state import WorkerTable, WorkerLoad
from router.policies import build_policy, PickContext
from commands.bench import prefix_repetition_requests
from services.prompts import block_hashes, sim_tokenize
N = int(sys.argv[2]) if len(sys.argv) > 2 else 256; BLOCK = 16
rng = random.Random(0)
prompts = [r.prompt for r in prefix_repetition_requests(2000, 16, 192, 64, 1, rng)]
prefix_blocks = [block_hashes(sim_tokenize(p), BLOCK) for p in prompts[:64]]
addrs = [f"10.0.0.{i}:50051" for i in range(N)]
table = WorkerTable(addrs)
router = Router(table, build_policy("kv-aware"), 2.0, random.Random(1))
configured = router.prefix.configure("sim", BLOCK)
if asyncio.iscoroutine(configured):  # async since session 25
    asyncio.run(configured)
for i, a in enumerate(addrs):
    r = random.Random(i)
    table.on_connected(a, f"sim-{i}")
    table.on_report(a, WorkerLoad(num_running=r.randint(0, 64), num_waiting=r.randint(0, 4), max_num_seqs=256, sequence=1))
    router.kv.stored(a, {h for chain in r.sample(prefix_blocks, min(4, len(prefix_blocks))) for h in chain})
t0 = time.perf_counter(); n = 0; lat = []
while time.perf_counter() - t0 < 3:
    p = prompts[n % len(prompts)]
    s = time.perf_counter()
    router.pick(PickContext(request_id=str(n), prompt=p))
    lat.append(time.perf_counter() - s)
    n += 1
    if n % 50 == 0:  # reports keep arriving: settle picks
        for i in range(0, N, 7):
            a = addrs[(i + n) % N]; r = random.Random(n + i)
            table.on_report(a, WorkerLoad(num_running=r.randint(0, 64), num_waiting=r.randint(0, 4), max_num_seqs=256, sequence=n, requests_received=n))
lat.sort()
print(f"{n/(time.perf_counter()-t0):.0f} picks/s  p50 {lat[len(lat)//2]*1e6:.0f} us  p99 {lat[int(len(lat)*.99)]*1e6:.0f} us")
import timeit
ctx = PickContext(request_id="x", prompt=prompts[3])
hashes = router.prefix.chain(prompts[3], None)
from dataclasses import replace
ctx2 = replace(ctx, block_hashes=hashes, cached_blocks=router._cached("kv", hashes, 0.0))
snap = table.fleet() if hasattr(table, "fleet") else table.snapshot()
for name, fn in [("snapshot", table.snapshot), ("chain", lambda: router.prefix.chain(prompts[3], None)),
                 ("cached", lambda: router._cached("kv", hashes, 0.0)),
                 ("policy", lambda: router.policy.pick(ctx2, snap, router._rng))]:
    n = 2000; t = timeit.timeit(fn, number=n) / n
    print(f"{name:10s} {t*1e6:7.1f} us")
columns = hasattr(table, "fleet")  # the tree with the columnar Fleet (keep/score over rows)
if columns:
    import numpy as np
    mask, rows = np.ones(len(snap), dtype=bool), np.arange(len(snap))
for f in router.policy.filters:
    fn = (lambda: f.keep(ctx2, snap, mask)) if columns else (lambda: f.filter(ctx2, snap))
    print(type(f).__name__, f"{timeit.timeit(fn, number=2000)/2000*1e6:.1f} us")
for s, wt in router.policy.scorers:
    fn = (lambda: s.score(ctx2, snap, rows)) if columns else (lambda: s.score(ctx2, snap))
    print(type(s).__name__, f"{timeit.timeit(fn, number=2000)/2000*1e6:.1f} us")
