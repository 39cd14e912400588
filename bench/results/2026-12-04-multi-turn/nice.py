"""Gateway pick latency and TTFT with one service reniced, alternating, one mesh."""
import json, subprocess, sys, tempfile, os, psutil
from pathlib import Path
sys.path.insert(0, "/work/main")
from bench._mesh import CLI, meshserve_up, tree_env
from bench.routing import FLEET, MULTI_BENCH, PORT, pick_mean_ms
tree = Path("/tmp/rtree")
target = sys.argv[1]  # router | gateway
def procs(name):
    return [p for p in psutil.process_iter(["cmdline"]) if f"serve {name}" in " ".join(p.info["cmdline"] or [])]
def snap(url):
    s = c = 0.0
    for line in __import__("urllib.request").request.urlopen(url).read().decode().splitlines():
        if line.startswith("meshserve_gateway_pick_seconds_sum "): s = float(line.split()[-1])
        if line.startswith("meshserve_gateway_pick_seconds_count "): c = float(line.split()[-1])
    return s, c
with meshserve_up([*FLEET, "--routing", "kv-aware"], tempfile.mkdtemp(), tree) as mesh:
    url = mesh.metrics("gateway")
    for i, nice in enumerate([0, -10, 0, -10, 0, -10]):
        for p in procs(target): p.nice(nice)
        s0, c0 = snap(url)
        out = f"/tmp/mt/nice-{target}-{i}.json"
        subprocess.run([*CLI, "bench", "--target", f"127.0.0.1:{PORT}", *MULTI_BENCH, "--seed", str(50 + i),
                        "--disable-tqdm", "--save-result", out], check=True, stdout=subprocess.DEVNULL, cwd=tree, env=tree_env(tree))
        s1, c1 = snap(url)
        d = json.load(open(out))
        print(f"{target} nice {nice:>3}: pick mean {1000*(s1-s0)/(c1-c0):6.1f} ms  ttft mean {d['mean_ttft_ms']:6.1f} p99 {d['p99_ttft_ms']:6.1f}  tok/s {d['output_throughput']:.0f}", flush=True)
