import asyncio, time, aiohttp
async def one(s):
    k=0
    async with s.post("http://127.0.0.1:50998/v1/chat/completions", json={"max_tokens":256}) as r:
        async for line in r.content:
            if line.startswith(b"data: {"): k+=1
    return k
async def main():
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=400)) as s:
        t=time.time(); ks=await asyncio.gather(*[one(s) for _ in range(300)])
        print("msgs",sum(ks),"wall",round(time.time()-t,2))
asyncio.run(main())
