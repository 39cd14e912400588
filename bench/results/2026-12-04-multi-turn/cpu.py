"""CPU seconds per meshserve process across one multi_turn bench run."""
import subprocess, sys, time, psutil, os
def snap():
    out = {}
    for p in psutil.process_iter(["cmdline"]):
        try:
            cl = " ".join(p.info["cmdline"] or [])
            if ("meshserve" in cl or "envoy" in cl or "valkey" in cl) and "cpu.py" not in cl and " bench " not in cl:
                t = p.cpu_times(); out[p.pid] = (cl[:110], t.user + t.system)
        except psutil.Error: pass
    return out
a = snap(); t0 = time.time()
subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)
b = snap(); wall = time.time() - t0
print(f"wall {wall:.1f}s")
for pid, (cl, c) in sorted(b.items(), key=lambda kv: -(kv[1][1] - a.get(kv[0], ("", 0))[1])):
    d = c - a.get(pid, ("", 0))[1]
    if d > 0.05: print(f"{d:6.2f}s {d/wall:5.2f} core  {cl}")
