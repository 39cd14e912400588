import psutil, sys, json, time
pids = {}
for p in psutil.process_iter(["pid", "cmdline"]):
    c = " ".join(p.info["cmdline"] or [])
    for key in ("serve worker", "serve gateway", "serve router", "envoy", "EngineCore", "serve cache", "serve traces"):
        if key in c and "pgrep" not in c:
            pids.setdefault(key, []).append(p.pid)
    if (p.info["cmdline"] or [""])[0].startswith("VLLM::EngineCore"):
        pids.setdefault("EngineCore", []).append(p.pid)
def snap():
    out = {}
    for k, ps in pids.items():
        u = s = 0.0; vcs = ivcs = 0
        for pid in ps:
            try:
                pr = psutil.Process(pid)
                for q in [pr, *pr.children(recursive=True)]:
                    t = q.cpu_times(); u += t.user; s += t.system
                    cs = q.num_ctx_switches(); vcs += cs.voluntary; ivcs += cs.involuntary
            except psutil.Error: pass
        out[k] = (u, s, vcs, ivcs)
    return out
if sys.argv[1] == "start":
    json.dump(snap(), open("/tmp/c1spy-cpu0.json", "w"))
else:
    a = json.load(open("/tmp/c1spy-cpu0.json")); b = snap()
    for k in b:
        if k in a:
            print(f"{k:14s} user {b[k][0]-a[k][0]:6.2f} s  sys {b[k][1]-a[k][1]:6.2f} s  voluntary switches {b[k][2]-a[k][2]:7d}  involuntary {b[k][3]-a[k][3]:6d}")
