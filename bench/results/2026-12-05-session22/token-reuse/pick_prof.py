"""One embedded pick after another (RouterServicer.answer(embedded=True)), 4 or 256 workers,
prefix_repetition prompts (1,000 words + 64), kv-aware, sim tokenizer: time per pick and a profile."""
import random, sys, time, cProfile, pstats
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "/work/main")
N = int(sys.argv[2]) if len(sys.argv) > 2 else 4
PREFIX = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
import logging; logging.basicConfig(level=logging.INFO, stream=open("/dev/null", "w"))
from router.server import Router, RouterServicer
from router.state import WorkerTable, WorkerLoad
from router.policies import build_policy
from commands.bench import prefix_repetition_requests
from services.prompts import block_hashes, sim_tokenize
from services.gen import meshserve_pb2 as pb
BLOCK = 16
rng = random.Random(0)
prompts = [r.prompt for r in prefix_repetition_requests(2000, 16, PREFIX, 64, 1, rng)]
addrs = [f"10.0.0.{i}:50051" for i in range(N)]
table = WorkerTable(addrs)
router = Router(table, build_policy("kv-aware"), 2.0, random.Random(1))
router.prefix.configure("sim", BLOCK)
for i, a in enumerate(addrs):
    r = random.Random(i)
    table.on_connected(a, f"sim-{i}")
    table.on_report(a, WorkerLoad(num_running=r.randint(0, 64), num_waiting=r.randint(0, 4), max_num_seqs=256, sequence=1))
    for p in r.sample(prompts[:16], 4):
        router.kv.stored(a, block_hashes(sim_tokenize(p), BLOCK))
svc = RouterServicer(router)
reqs = [pb.PickRequest(request_id=str(i), prompt=p) for i, p in enumerate(prompts)]
def run(seconds):
    t0 = time.perf_counter(); n = 0; lat = []
    while time.perf_counter() - t0 < seconds:
        s = time.perf_counter(); svc.answer(reqs[n % len(reqs)], embedded=True); lat.append(time.perf_counter() - s); n += 1
        if n % 50 == 0:
            for a in addrs[:8]:
                r = random.Random(n); table.on_report(a, WorkerLoad(num_running=r.randint(0, 64), num_waiting=0, max_num_seqs=256, sequence=n, requests_received=n))
    lat.sort(); return n / (time.perf_counter() - t0), lat[len(lat) // 2] * 1e6, lat[int(len(lat) * .99)] * 1e6
run(0.5)
print("%d workers, prefix %d words: %.0f picks/s p50 %.0f us p99 %.0f us" % ((N, PREFIX) + run(3)))
import timeit
p = prompts[5]
ids = sim_tokenize(p)
for name, fn in [("sim_tokenize", lambda: sim_tokenize(p)), ("block_hashes", lambda: block_hashes(ids, BLOCK)),
                 ("chain", lambda: router.prefix.chain(p, None))]:
    print(f"  {name:14s} {timeit.timeit(fn, number=300) / 300 * 1e6:7.1f} us  ({len(ids)} tokens)")
if "--prof" in sys.argv:
    pr = cProfile.Profile(); pr.enable(); run(2); pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(18)
from router.prefix import TOKENIZED
print({w: TOKENIZED.labels(way=w)._value.get() for w in ("whole", "reused", "repeated", "mismatch")})
