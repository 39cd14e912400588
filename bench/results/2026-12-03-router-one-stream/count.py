"""Counts one worker's WatchLoad and WatchKvEvents messages per second for SECONDS."""
import asyncio, sys, time
import grpc
sys.path.insert(0, __import__("os").getcwd())
from services.gen import meshserve_pb2 as pb, meshserve_pb2_grpc as pb_grpc

async def main(addr, seconds):
    async with grpc.aio.insecure_channel(addr) as ch:
        stub = pb_grpc.WorkerStub(ch)
        counts = {"load": 0, "kv": 0, "load with kv": 0}
        combined = len(sys.argv) > 3
        async def load():
            async for r in stub.WatchLoad(pb.WatchLoadRequest(kv_events=combined)):
                counts["load"] += 1
                counts["load with kv"] += r.HasField("kv")
        async def kv():
            async for _ in stub.WatchKvEvents(pb.WatchKvEventsRequest()): counts["kv"] += 1
        tasks = [asyncio.create_task(load())] + ([] if combined else [asyncio.create_task(kv())])
        await asyncio.sleep(1)
        c0 = dict(counts); t0 = time.monotonic()
        await asyncio.sleep(seconds)
        dt = time.monotonic() - t0
        print({k: round((counts[k] - c0[k]) / dt, 1) for k in counts}, "msgs/s")
        for t in tasks: t.cancel()
asyncio.run(main(sys.argv[1], float(sys.argv[2])))
