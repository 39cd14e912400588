"""c1 A/B inside running stacks: vllm serve on 8100 and a mesh on 8080, both started once.
Variants of the mesh's engine knobs applied at runtime (renice / taskset) between runs: PRIO+PLACE
(low|normal + shared|vllm), and a third part r1 (every other mesh process on CPU 1) or rall (on
both CPUs)."""
import json, os, sys, statistics, time
import psutil
OUT = sys.argv[1]; ROUNDS = int(sys.argv[2]); N = int(sys.argv[3]); VARIANTS = sys.argv[4].split(",")
os.makedirs(OUT, exist_ok=True)
MODEL = sys.argv[5] if len(sys.argv) > 5 else "/root/.cache/meshserve/models/meshserve-tiny-v1"
os.environ.update(HF_HUB_OFFLINE="1", VLLM_LOGGING_LEVEL="WARNING")
# The one-user client run the later scripts share (from the repository's root, as this is run).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "2026-12-05-session27", "c1-insitu"))
import c1

def worker_proc():
    for p in psutil.process_iter(["cmdline"]):
        if "commands.cli serve worker" in " ".join(p.info["cmdline"] or []):
            return p
def engine_procs():
    w = worker_proc(); kids = w.children(recursive=True)
    core = [k for k in kids if k.ppid() == w.pid]
    model = [k for k in kids if k.ppid() != w.pid]
    return core, model
def threads(p):
    return [t.id for t in p.threads()]
ORIG = {}
def apply(variant):
    core, model = engine_procs()
    if not ORIG:
        for p in core + model:
            ORIG[p.pid] = {t: os.sched_getaffinity(t) for t in threads(p)}
        print("orig affinity", {pid: sorted(set().union(*a.values())) for pid, a in ORIG.items()},
              "nice", [p.nice() for p in core + model], flush=True)
    parts = variant.split("+")
    relay = parts.pop() if parts[-1] in ("r1", "rall") else ""
    prio, place = parts if len(parts) == 2 else ("", "")
    if relay:
        cpus = {1} if relay == "r1" else {0, 1}
        eng = {p.pid for p in core + model}
        launcher = [p for p in psutil.process_iter(["cmdline"]) if "meshserve up" in " ".join(p.info["cmdline"] or []) or "commands.cli up" in " ".join(p.info["cmdline"] or [])]
        for l in launcher:
            for p in l.children(recursive=True):
                if p.pid in eng: continue
                for t in threads(p):
                    try: os.sched_setaffinity(t, cpus)
                    except (ProcessLookupError, OSError): pass
    if prio:
        nice = 10 if prio == "low" else 0
        for p in core + model:
            for t in threads(p):
                try: os.setpriority(os.PRIO_PROCESS, t, nice)
                except ProcessLookupError: pass
    if place:
        mcpus = set().union(*(os.sched_getaffinity(t) for p in model for t in threads(p)))
        for p in core:
            for t in threads(p):
                try:
                    os.sched_setaffinity(t, mcpus if place == "shared" else {0, 1})
                except ProcessLookupError: pass
def bench(port, label, seed):
    r = c1.run(port, OUT, label, N, MODEL, seed)
    return r["median_ttft_ms"], r["median_tpot_ms"], r["mean_itl_ms"]
rows = {}
for rnd in range(ROUNDS):
    order = VARIANTS[rnd % len(VARIANTS):] + VARIANTS[:rnd % len(VARIANTS)]
    for v in order:
        if v == "vllm":
            res = bench(8100, f"vllm-{rnd}", 1000 + rnd)
        else:
            apply(v); time.sleep(1)
            res = bench(8080, f"{v}-{rnd}", 1000 + rnd)
        rows.setdefault(v, []).append(res)
        print(f"round {rnd} {v:14s} TTFT {res[0]:6.2f}  TPOT {res[1]:5.2f}  meanITL {res[2]:5.2f}", flush=True)
print("medians:")
for v, rs in rows.items():
    print(f"{v:14s} TTFT {statistics.median(r[0] for r in rs):6.2f}  TPOT {statistics.median(r[1] for r in rs):5.2f}  meanITL {statistics.median(r[2] for r in rs):5.2f}")
json.dump(rows, open(f"{OUT}/rows.json", "w"))
