import asyncio, sys, time, statistics, grpc
from grpc import aio
async def serve(port):
    async def stream(req, ctx):
        yield b"x"
        yield b"y"
    async def unary(req, ctx):
        return b"x"
    h = grpc.method_handlers_generic_handler("p.P", {
        "S": grpc.unary_stream_rpc_method_handler(stream),
        "U": grpc.unary_unary_rpc_method_handler(unary)})
    s = aio.server(); s.add_generic_rpc_handlers((h,)); s.add_insecure_port(f"127.0.0.1:{port}")
    await s.start(); await s.wait_for_termination()
async def client(port):
    ch = aio.insecure_channel(f"127.0.0.1:{port}")
    S = ch.unary_stream("/p.P/S"); U = ch.unary_unary("/p.P/U")
    for name, f in (("unary", None), ("stream-first", None)):
        ts = []
        for i in range(400):
            t0 = time.perf_counter()
            if name == "unary":
                await U(b"a")
            else:
                call = S(b"a")
                async for _ in call:
                    break
                call.cancel()
            ts.append((time.perf_counter() - t0) * 1e3)
        ts = ts[50:]
        print(name, "median %.3f ms p90 %.3f" % (statistics.median(ts), sorted(ts)[int(len(ts) * .9)]))
if sys.argv[1] == "s": asyncio.run(serve(int(sys.argv[2])))
else: asyncio.run(client(int(sys.argv[2])))
