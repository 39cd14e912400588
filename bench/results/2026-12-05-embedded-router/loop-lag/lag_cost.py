import asyncio, resource
from services.server import LOOP_LAG
def start(loop, interval):
    state = {}
    def tick(due):
        LOOP_LAG.observe(max(0.0, loop.time() - due))
        nxt = loop.time() + interval
        state["h"] = loop.call_at(nxt, tick, nxt)
    nxt = loop.time() + interval
    state["h"] = loop.call_at(nxt, tick, nxt)
    return state
async def sleeper(interval):
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + interval
        await asyncio.sleep(interval)
        LOOP_LAG.observe(max(0.0, loop.time() - due))
async def main(kind, interval):
    loop = asyncio.get_running_loop()
    t = None
    if kind == "callback": s = start(loop, interval)
    elif kind == "task": t = asyncio.create_task(sleeper(interval))
    r0 = resource.getrusage(resource.RUSAGE_SELF); await asyncio.sleep(10); r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{kind:9s} {interval*1000:4.0f} ms: CPU ms per 10 s", round(((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)) * 1000, 1))
    if kind == "callback": s["h"].cancel()
    if t: t.cancel()
for kind, iv in (("task", 0.025), ("callback", 0.025), ("task", 0.1), ("callback", 0.1), ("none", 0.1)):
    asyncio.run(main(kind, iv))
