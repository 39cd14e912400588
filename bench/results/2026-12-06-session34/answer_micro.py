"""In-process: Router.pick vs RouterServicer.answer (the stream's per-pick path), 256 workers, traced or not.
usage: answer_micro.py TREE RATIO"""
import random, sys, time, timeit, asyncio
sys.path.insert(0, sys.argv[1])
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
ratio = float(sys.argv[2])
trace.set_tracer_provider(TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio))))
from router.server import Router, RouterServicer
from router.state import WorkerTable, WorkerLoad
from router.policies import build_policy, PickContext
from commands.bench import prefix_repetition_requests
from services.prompts import block_hashes, sim_tokenize
from services.gen import meshserve_pb2 as pb
N = 256; BLOCK = 16
rng = random.Random(0)
prompts = [r.prompt for r in prefix_repetition_requests(2000, 16, 192, 64, 1, rng)]
prefix_blocks = [block_hashes(sim_tokenize(p), BLOCK) for p in prompts[:64]]
addrs = [f"10.0.0.{i}:50051" for i in range(N)]
table = WorkerTable(addrs)
router = Router(table, build_policy("kv-aware"), 2.0, random.Random(1))
c = router.prefix.configure("sim", BLOCK)
if asyncio.iscoroutine(c): asyncio.run(c)
for i, a in enumerate(addrs):
    r = random.Random(i)
    table.on_connected(a, f"sim-{i}")
    table.on_report(a, WorkerLoad(num_running=r.randint(0, 64), num_waiting=r.randint(0, 4), max_num_seqs=256, sequence=1))
    router.kv.stored(a, {h for chain in r.sample(prefix_blocks, 4) for h in chain})
servicer = RouterServicer(router)
reqs = [pb.PickRequest(request_id=f"r{i}", prompt=prompts[i % len(prompts)], pick_id=i) for i in range(4000)]
def settle(n):
    for i in range(0, N, 7):
        a = addrs[(i + n) % N]; r = random.Random(n + i)
        table.on_report(a, WorkerLoad(num_running=r.randint(0, 64), num_waiting=r.randint(0, 4), max_num_seqs=256, sequence=n, requests_received=n))
def run(fn, label):
    for rep in range(3):
        t0 = time.perf_counter()
        for n, req in enumerate(reqs):
            fn(req)
            if n % 50 == 49: settle(n + rep * 10000)
        dt = time.perf_counter() - t0
        print(f"{label:8s} {len(reqs)/dt:7.0f} /s  {dt/len(reqs)*1e6:6.1f} us")
run(lambda req: router.pick(PickContext(request_id=req.request_id, prompt=req.prompt)), "pick")
run(servicer.answer, "answer")
run(lambda req: pb.PickBatchResponse(answers=[servicer.answer(req)]).SerializeToString(), "answer+ser")
