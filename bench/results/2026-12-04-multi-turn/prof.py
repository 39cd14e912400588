"""py-spy of the gateway during multi_turn runs (kv-aware, sim speed 1, no tracing)."""
import subprocess, sys, tempfile, psutil
from pathlib import Path
sys.path.insert(0, "/work/main")
from bench._mesh import CLI, meshserve_up, tree_env
from bench.routing import FLEET, MULTI_BENCH, PORT
tree = Path("/tmp/rtree")
with meshserve_up([*FLEET, "--routing", "kv-aware"], tempfile.mkdtemp(), tree) as mesh:
    gw = [p.pid for p in psutil.process_iter(["cmdline"]) if "serve gateway" in " ".join(p.info["cmdline"] or [])][0]
    spy = subprocess.Popen(["/tmp/pyspy/bin/py-spy", "record", "-p", str(gw), "-r", "200", "-f", "raw", "-o", "/tmp/mt/gw.raw", "-d", "20"])
    for s in range(4):
        subprocess.run([*CLI, "bench", "--target", f"127.0.0.1:{PORT}", *MULTI_BENCH, "--seed", str(300 + s),
                        "--disable-tqdm"], check=True, stdout=subprocess.DEVNULL, cwd=tree, env=tree_env(tree))
    spy.wait()
