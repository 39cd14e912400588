import asyncio, sys, time
sys.path.insert(0, "/work/main")
import grpc
from services.gen import meshserve_pb2 as pb, meshserve_pb2_grpc as pb_grpc
async def one(stub, n):
    k = 0
    async for _ in stub.StreamChatCompletions(pb.ChatCompletionRequest(max_tokens=n)):
        k += 1
    return k
async def main():
    ch = grpc.aio.insecure_channel("127.0.0.1:50999")
    stub = pb_grpc.OpenAIStub(ch)
    t = time.time()
    ks = await asyncio.gather(*[one(stub, 256) for _ in range(300)])
    print("msgs", sum(ks), "wall", round(time.time()-t, 2))
asyncio.run(main())
