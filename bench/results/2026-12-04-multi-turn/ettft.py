"""Engine-side TTFT (the workers' own histogram) against the client's, per policy and sim speed."""
import json, subprocess, sys, tempfile, urllib.request
from pathlib import Path
sys.path.insert(0, "/work/main")
from bench._mesh import CLI, meshserve_up, tree_env
from bench.routing import FLEET, MULTI_BENCH, PORT, pick_mean_ms
tree = Path("/tmp/rtree")
def hist(urls, name):
    s = c = 0.0
    for u in urls:
        for line in urllib.request.urlopen(u).read().decode().splitlines():
            if line.startswith(name + "_sum{"): s += float(line.split()[-1])
            if line.startswith(name + "_count{"): c += float(line.split()[-1])
    return s, c
for speed in sys.argv[1:]:
    for policy in ["round-robin", "kv-aware"]:
        with meshserve_up([*FLEET, "--routing", policy, "--sim-speed", speed], tempfile.mkdtemp(), tree) as mesh:
            urls = mesh.worker_metrics()
            out = "/tmp/mt/ettft.json"
            subprocess.run([*CLI, "bench", "--target", f"127.0.0.1:{PORT}", *MULTI_BENCH, "--seed", "91",
                            "--disable-tqdm", "--save-result", out], check=True, stdout=subprocess.DEVNULL, cwd=tree, env=tree_env(tree))
            s, c = hist(urls, "vllm:time_to_first_token_seconds")
            d = json.load(open(out))
            print(f"speed {speed} {policy:12} client ttft mean {d['mean_ttft_ms']:6.1f}  engine ttft mean {1000*s/c:6.1f}  gateway pick mean {pick_mean_ms(mesh.metrics('gateway'), 'meshserve_gateway_pick_seconds'):5.1f}  tok/s {d['output_throughput']:.0f}", flush=True)
