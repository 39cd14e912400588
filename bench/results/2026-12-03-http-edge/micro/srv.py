import asyncio, sys, time, os, resource
sys.path.insert(0, "/work/main")
import grpc
from services.gen import meshserve_pb2 as pb, meshserve_pb2_grpc as pb_grpc
MODE = sys.argv[1] if len(sys.argv)>1 else 'write'
STEP = asyncio.Event()
class S(pb_grpc.OpenAIServicer):
    async def StreamChatCompletions(self, request, context):
        n = request.max_tokens
        head = dict(id="chatcmpl-x", object="chat.completion.chunk", created=1, model="m")
        for i in range(n):
            await ticker.wait_step()
            c = pb.ChatCompletionChunk(**head)
            ch = c.choices.add(); ch.index = 0; ch.delta.content = "tok"
            if MODE == "gen":
                yield c
            else:
                await context.write(c)
class Ticker:
    def __init__(self): self.fut = None
    async def wait_step(self):
        if self.fut is None or self.fut.done():
            self.fut = asyncio.get_running_loop().create_future()
        await self.fut
    async def run(self):
        while True:
            await asyncio.sleep(0.02)
            if self.fut is not None and not self.fut.done(): self.fut.set_result(None)
ticker = Ticker()
if __name__ != "__main__": pass
async def main():
    s = grpc.aio.server()
    pb_grpc.add_OpenAIServicer_to_server(S(), s)
    s.add_insecure_port("127.0.0.1:50999")
    await s.start()
    asyncio.create_task(ticker.run())
    print("ready", flush=True)
    await s.wait_for_termination()
if __name__ == '__main__':
    asyncio.run(main())
