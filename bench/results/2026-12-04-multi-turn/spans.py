"""Where a pick's time goes under load: gateway 'router pick' vs router 'Router/Pick' spans."""
import json, subprocess, sys, tempfile, statistics
from collections import defaultdict
from pathlib import Path
import grpc
sys.path.insert(0, "/work/main")
from bench._mesh import CLI, meshserve_up, tree_env
from bench.routing import FLEET, MULTI_BENCH, PORT
from services.gen import traces_pb2, traces_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
tree = Path(sys.argv[1]); policy = sys.argv[2]
fleet = [f for f in FLEET if f != "--no-tracing"]
with meshserve_up([*fleet, "--routing", policy, "--trace-sampling-ratio", "1.0", *sys.argv[3:]], tempfile.mkdtemp(), tree) as mesh:
    subprocess.run([*CLI, "bench", "--target", f"127.0.0.1:{PORT}", *MULTI_BENCH, "--seed", "77",
                    "--disable-tqdm", "--save-result", "/tmp/mt/spans-bench.json"], check=True, stdout=subprocess.DEVNULL, cwd=tree, env=tree_env(tree))
    stub = traces_pb2_grpc.TraceQueryStub(grpc.insecure_channel("127.0.0.1:4397"))
    got = stub.Slowest(traces_pb2.SlowestRequest(count=2000))
by = defaultdict(dict)
for raw in got.resource_spans:
    rs = trace_pb2.ResourceSpans.FromString(raw)
    for ss in rs.scope_spans:
        for s in ss.spans:
            by[s.trace_id].setdefault(s.name, s)
names = defaultdict(int)
rows = []
for t, spans in by.items():
    for n in spans: names[n] += 1
    g, r = spans.get("router pick"), spans.get("Router/Pick")
    if g and r:
        rows.append(((r.start_time_unix_nano - g.start_time_unix_nano) / 1e6, (r.end_time_unix_nano - r.start_time_unix_nano) / 1e6,
                     (g.end_time_unix_nano - r.end_time_unix_nano) / 1e6, (g.end_time_unix_nano - g.start_time_unix_nano) / 1e6, g.start_time_unix_nano / 1e9))
print(dict(names))
print(len(rows), "picks: to router / in router / back / whole (ms)")
for i, label in enumerate(["to router", "in router", "back", "whole"]):
    xs = sorted(x[i] for x in rows)
    print(f"{label:10} p50 {xs[len(xs)//2]:7.2f} p90 {xs[int(len(xs)*.9)]:7.2f} p99 {xs[int(len(xs)*.99)]:7.2f} mean {statistics.mean(xs):7.2f}")

rows.sort(key=lambda x: x[4]); t0 = rows[0][4]
json.dump([(round(x[4]-t0, 4), round(x[0], 2), round(x[1], 2), round(x[2], 2)) for x in rows], open('/tmp/mt/rows.json', 'w'))
