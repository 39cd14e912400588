import asyncio, statistics, sys
sys.path.insert(0, "/work/main")
from trace_service import server as traces
found = asyncio.run(traces.fetch_slowest("127.0.0.1:4397", 100000))
rows = {"gw pick start -> router span start": [], "router span": [], "router span end -> gw pick end": [], "gw pick span": [],
        "gw handler start -> pick start": [], "envoy start -> gw handler start": []}
for tid, spans in found.items():
    by = {}
    for s in spans: by.setdefault((s.service, s.name), s)
    gp, rp = by.get(("gateway", "router pick")), by.get(("router", "Router/Pick"))
    if not gp or not rp: continue
    gh = next((s for s in spans if s.service == "gateway" and s.parent_id and not s.name.startswith(("router", "worker", "cache"))), None)
    env = by.get(("envoy", "ingress"))
    rows["gw pick start -> router span start"].append((rp.start_ns - gp.start_ns) / 1e6)
    rows["router span"].append(rp.duration_ms)
    rows["router span end -> gw pick end"].append((gp.end_ns - rp.end_ns) / 1e6)
    rows["gw pick span"].append(gp.duration_ms)
    if gh: rows["gw handler start -> pick start"].append((gp.start_ns - gh.start_ns) / 1e6)
    if env and gh: rows["envoy start -> gw handler start"].append((gh.start_ns - env.start_ns) / 1e6)
print(len(found), "traces")
for k, v in rows.items():
    if v:
        v.sort(); print(f"{k:40s} n={len(v)} p50={v[len(v)//2]:8.2f} p90={v[int(len(v)*.9)]:8.2f} p99={v[int(len(v)*.99)]:8.2f} ms")
