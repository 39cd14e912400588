import asyncio, sys, os, time, subprocess
sys.path.insert(0, "/work/main")
import grpc
from services.gen import meshserve_pb2 as pb, meshserve_pb2_grpc as pb_grpc

class W(pb_grpc.WorkerServicer):
    async def WatchLoad(self, request, context):
        r = pb.LoadReport(worker_id="w", num_running=3, num_waiting=1, kv_cache_usage=0.5, max_num_seqs=256)
        for i in range(int(os.environ.get("N", "20000"))):
            r.sequence = i
            yield r
            if i % 64 == 63: await asyncio.sleep(0.002)

async def serve():
    s = grpc.aio.server(); pb_grpc.add_WorkerServicer_to_server(W(), s); s.add_insecure_port("127.0.0.1:50999"); await s.start(); await s.wait_for_termination()

async def client(mode):
    ch = grpc.aio.insecure_channel("127.0.0.1:50999"); stub = pb_grpc.WorkerStub(ch)
    await ch.channel_ready()
    n = 0; c0 = time.process_time(); t0 = time.perf_counter()
    call = stub.WatchLoad(pb.WatchLoadRequest())
    if mode == "read":
        while (r := await call.read()) is not grpc.aio.EOF: n += 1
    elif mode == "timeout":
        while True:
            async with asyncio.timeout(5):
                r = await call.read()
            if r is grpc.aio.EOF: break
            n += 1
    else:
        async for r in call: n += 1
    c = time.process_time() - c0
    print(mode, n, f"{c/n*1e6:.1f} us CPU/msg, wall {(time.perf_counter()-t0)/n*1e6:.1f} us/msg")

if sys.argv[1] == "serve": asyncio.run(serve())
else:
    p = subprocess.Popen(["taskset", "-c", "1", sys.executable, __file__, "serve"])
    time.sleep(2)
    try:
        os.sched_setaffinity(0, {0})
        for m in ["read", "iter", "timeout", "read"]: asyncio.run(client(m))
    finally: p.kill()
