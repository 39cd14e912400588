"""Where TTFT goes, hop by hop, from the traces of one run (mean and median over traces)."""
import asyncio, statistics as st, sys
from trace_service import server as traces

async def main(receiver: str, n: int) -> None:
    got = await traces.fetch_slowest(receiver, n)
    rows = []
    for tid, spans in got.items():
        by = {(s.service, s.name): s for s in spans}
        env = by.get(("envoy", "ingress")); gw = next((s for s in spans if s.service == "gateway" and s.name.startswith("OpenAI/")), None)
        wk = by.get(("worker", "Worker/Generate")); ws = by.get(("gateway", "worker stream")); pick = by.get(("gateway", "router pick"))
        cr = by.get(("gateway", "cache read"))
        if not (env and gw and wk and ws) or "first_token" not in wk.events or "first_token" not in gw.events:
            continue
        rows.append({
            "envoy->gateway handler": (gw.start_ns - env.start_ns) / 1e6,
            "handler->cache read end": ((cr.end_ns if cr else gw.start_ns) - gw.start_ns) / 1e6,
            "router pick": (pick.duration_ms if pick else 0.0),
            "handler->worker stream start": (ws.start_ns - gw.start_ns) / 1e6,
            "worker stream->worker span": (wk.start_ns - ws.start_ns) / 1e6,
            "worker span->first token (engine)": (wk.events["first_token"] - wk.start_ns) / 1e6,
            "worker first token->gateway first token": (gw.events["first_token"] - wk.events["first_token"]) / 1e6,
            "envoy start->gateway first token": (gw.events["first_token"] - env.start_ns) / 1e6,
            "envoy total": env.duration_ms,
        })
    print(f"{len(rows)} traces of {len(got)}")
    for k in rows[0]:
        v = [r[k] for r in rows]
        print(f"  {k:<42} mean {st.mean(v):8.1f}  median {st.median(v):8.1f}  p90 {sorted(v)[int(0.9*len(v))]:8.1f} ms")

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
