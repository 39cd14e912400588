"""One routing run (prefix, kv-aware) with every process's CPU seconds over the benchmark, and
py-spy profiles of the gateway, the router and one worker."""
import os, subprocess, sys, time, json, tempfile
from pathlib import Path
sys.path.insert(0, "/work/main")
from bench._mesh import CLI, meshserve_up, tree_env
from bench.routing import FLEET, PREFIX_BENCH

TREE = Path("/work/main")
spy = "--spy" in sys.argv
policy = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("-") else "kv-aware"

def cpu_by_pid():
    out = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            stat = open(f"/proc/{p}/stat").read()
            cmd = open(f"/proc/{p}/cmdline").read().replace("\0", " ")[:160]
        except OSError:
            continue
        f = stat.rsplit(")", 1)[1].split()
        out[int(p)] = (cmd, (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK"))
    return out

def label(cmd):
    for k in ("serve gateway", "serve router", "serve worker", "serve cache", "envoy", "valkey", "serve traces", " bench "):
        if k in cmd:
            return k.strip()
    return None

logs = tempfile.mkdtemp(prefix="cpu-run-")
with meshserve_up([*FLEET, "--routing", policy], logs, TREE) as mesh:
    before = cpu_by_pid()
    procs = []
    if spy:
        for k, name in (("serve gateway", "gateway"), ("serve router", "router"), ("serve worker", "worker")):
            pid = next(p for p, (c, _) in before.items() if k in c and "python" in c)
            procs.append(subprocess.Popen(["/tmp/pyspy/bin/py-spy", "record", "--nonblocking", "-r", "100", "-f", "raw",
                                           "-o", f"/tmp/s31/cpu/{name}.txt", "-p", str(pid)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    t0 = time.time()
    b = subprocess.run([*CLI, "bench", "--target", "127.0.0.1:8380", *PREFIX_BENCH, "--seed", "7", "--disable-tqdm",
                        "--save-result", "/tmp/s31/cpu/bench.json"], cwd=TREE, env=tree_env(TREE),
                       stdout=subprocess.DEVNULL)
    wall = time.time() - t0
    after = cpu_by_pid()
    for p in procs:
        p.send_signal(2)
        p.wait()
totals = {}
for pid, (cmd, t) in after.items():
    k = label(cmd)
    if k is None:
        continue
    totals[k] = totals.get(k, 0.0) + t - before.get(pid, (cmd, 0.0))[1]
r = json.load(open("/tmp/s31/cpu/bench.json"))
print(f"{policy}: wall {wall:.1f}s, {r['completed']} requests, {r['output_throughput']:.0f} tok/s, mean TTFT {r['mean_ttft_ms']:.0f} ms")
for k, v in sorted(totals.items(), key=lambda kv: -kv[1]):
    print(f"  {k:<14} {v:6.2f} CPU-s  {1000 * v / r['completed']:5.2f} ms/request")
