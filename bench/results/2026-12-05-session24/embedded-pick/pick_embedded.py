"""One embedded pick after another, as a gateway with --router embedded makes them on the routing
benchmark's prefix workload: 4 sim workers, prefix_repetition prompts of 1,000-word prefixes and
64-word suffixes, the kv-aware policy, the pick's attributes on a current recording span.

    taskset -c 1 .venv/bin/python bench/results/2026-12-05-session24/embedded-pick/pick_embedded.py TREE [SECONDS] [--profile]
"""
import asyncio, cProfile, pstats, random, sys, time
tree = sys.argv[1]
sys.path.insert(0, tree)
seconds = float(sys.argv[2]) if len(sys.argv) > 2 and not sys.argv[2].startswith("-") else 5.0
from commands.bench import prefix_repetition_requests
from router.policies import build_policy
from router.server import Router, RouterServicer
from router.state import WorkerLoad, WorkerTable
from services import telemetry
from services.config import GatewayConfig
from services.gen import meshserve_pb2 as pb
from services.prompts import block_hashes, sim_tokenize

telemetry.setup_tracing("gateway", GatewayConfig())
rng = random.Random(0)
prompts = [r.prompt for r in prefix_repetition_requests(1200, 16, 1000, 64, 32, rng)]
addrs = [f"127.0.0.1:{50051 + i}" for i in range(4)]
table = WorkerTable(addrs)
router = Router(table, build_policy("kv-aware"), 2.0, random.Random(1))
configured = router.prefix.configure("sim", 16)
if asyncio.iscoroutine(configured):  # async since session 25
    asyncio.run(configured)
chains = [block_hashes(sim_tokenize(p), 16) for p in prompts[:16]]
for i, a in enumerate(addrs):
    table.on_connected(a, f"worker-{i}")
    table.on_report(a, WorkerLoad(num_running=70, num_waiting=5, max_num_seqs=256, sequence=1))
    router.kv.stored(a, {h for c in chains[i * 4:(i + 1) * 4] for h in c[:60]})
servicer = RouterServicer(router)
requests = [pb.PickRequest(request_id=str(i), prompt=p) for i, p in enumerate(prompts)]

def run(seconds: float) -> list[float]:
    lat, n, t0 = [], 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        with telemetry.tracer.start_as_current_span("router pick"):
            s = time.perf_counter()
            servicer.answer(requests[n % len(requests)], embedded=True)
            lat.append(time.perf_counter() - s)
        n += 1
        if n % 20 == 0:  # the workers' reports settle the picks
            for i, a in enumerate(addrs):
                table.on_report(a, WorkerLoad(num_running=70 + n % 7, num_waiting=5, max_num_seqs=256,
                                              sequence=n, requests_received=n // 4))
    return sorted(lat)

run(1.0)  # warm: the token reuse's memory of recent texts
if "--profile" in sys.argv:
    cProfile.run("run(seconds)", "/tmp/pick_embedded.prof")
    pstats.Stats("/tmp/pick_embedded.prof").sort_stats("tottime").print_stats(25)
else:
    lat = run(seconds)
    q = lambda f: lat[int(len(lat) * f)] * 1e6
    print(f"{tree}: {len(lat) / seconds:.0f} picks/s  p50 {q(0.5):.0f}  p90 {q(0.9):.0f}  p99 {q(0.99):.0f} us")
