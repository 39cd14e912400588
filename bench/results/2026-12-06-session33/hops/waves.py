"""TTFT hop by hop, first wave (the first 300 requests to arrive) against the rest."""
import asyncio, statistics as st, sys
from trace_service import server as traces

async def main(receiver: str, n: int, wave: int) -> None:
    got = await traces.fetch_slowest(receiver, n)
    rows = []
    for spans in got.values():
        by = {(s.service, s.name): s for s in spans}
        env = by.get(("envoy", "ingress")); gw = next((s for s in spans if s.service == "gateway" and s.name.startswith("OpenAI/")), None)
        wk = by.get(("worker", "Worker/Generate")); ws = by.get(("gateway", "worker stream"))
        if not (env and gw and wk and ws) or "first_token" not in wk.events or "first_token" not in gw.events:
            continue
        rows.append((env.start_ns, {
            "envoy->gateway handler": (gw.start_ns - env.start_ns) / 1e6,
            "handler->worker span": (wk.start_ns - gw.start_ns) / 1e6,
            "worker span->first token": (wk.events["first_token"] - wk.start_ns) / 1e6,
            "worker first token->gateway first token": (gw.events["first_token"] - wk.events["first_token"]) / 1e6,
            "envoy start->gateway first token": (gw.events["first_token"] - env.start_ns) / 1e6,
        }))
    rows.sort(key=lambda r: r[0])
    rows = [r for _, r in rows]
    rows = rows[-600:]  # the measured run
    for name, part in (("first wave", rows[:wave]), ("the rest", rows[wave:])):
        print(f"{name}: {len(part)} traces")
        for k in part[0]:
            v = [r[k] for r in part]
            print(f"  {k:<42} mean {st.mean(v):8.1f}  median {st.median(v):8.1f}  p90 {sorted(v)[int(0.9*len(v))]:8.1f} ms")

asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
