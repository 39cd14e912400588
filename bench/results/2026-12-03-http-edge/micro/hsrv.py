import asyncio, sys, json
sys.path.insert(0, "/work/main")
from aiohttp import web
from srv import Ticker
ticker = Ticker()
HEAD = b'data: {"id":"chatcmpl-x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":'
async def handle(request):
    body = await request.json()
    n = body["max_tokens"]
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(n):
        await ticker.wait_step()
        await resp.write(HEAD + json.dumps("tok").encode() + b'},"finish_reason":null}]}\n\n')
    await resp.write(b"data: [DONE]\n\n")
    return resp
async def main():
    app = web.Application(); app.router.add_post("/v1/chat/completions", handle)
    runner = web.AppRunner(app, access_log=None); await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 50998).start()
    asyncio.create_task(ticker.run()); print("ready", flush=True)
    await asyncio.Event().wait()
asyncio.run(main())
