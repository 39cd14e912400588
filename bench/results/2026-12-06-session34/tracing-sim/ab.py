"""Sim mesh, vllm bench serve 600 x 300 users 64->32 through Envoy; CPU per process; tracing ratio A/B.
usage: ab.py OUT TREE RATIO [RATIO...]   (each ratio a fresh meshserve up; extra up flags in UP_ARGS)"""
import json, os, re, signal, subprocess, sys, time, urllib.request
from pathlib import Path
import psutil
out, tree = Path(sys.argv[1]), sys.argv[2]; out.mkdir(parents=True, exist_ok=True)
V = "/work/main/.venv/bin"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "PYTHONPATH": tree}
def cpu(pids):
    r = {}
    for name, pid in pids.items():
        try:
            p = psutil.Process(pid); t = p.cpu_times(); s = t.user + t.system
            for c in p.children(recursive=True):
                try: ct = c.cpu_times(); s += ct.user + ct.system
                except psutil.Error: pass
            r[name] = s
        except psutil.Error: pass
    return r
for n, ratio in enumerate(sys.argv[3:]):
    log = open(out / f"up-{n}-{ratio}.log", "w")
    up = subprocess.Popen([f"{V}/python", "-m", "commands.cli", "up", "--engine", "sim", "--workers", "1",
                           "--trace-sampling-ratio", ratio, *os.environ.get("UP_ARGS", "").split()],
                          cwd=tree, env=ENV, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        for _ in range(120):
            time.sleep(1)
            text = (out / f"up-{n}-{ratio}.log").read_text()
            if "\nTry:" in text: break
        pids = {m[0]: int(m[1]) for m in re.findall(r"started (\S+) \(pid (\d+)\)", text)}
        def bench(label, num, conc, seed):
            subprocess.run([f"{V}/vllm", "bench", "serve", "--backend", "openai-chat", "--base-url", "http://127.0.0.1:8080",
                "--endpoint", "/v1/chat/completions", "--model", "meshserve-tiny", "--tokenizer",
                "/root/.cache/meshserve/models/meshserve-tiny-v1", "--dataset-name", "random", "--random-input-len", "64",
                "--random-output-len", "32", "--num-prompts", str(num), "--max-concurrency", str(conc), "--ignore-eos",
                "--seed", str(seed), "--disable-tqdm", "--save-result", "--result-dir", str(out), "--result-filename", f"{label}.json"],
                stdout=open(out / f"{label}.txt", "w"), stderr=subprocess.STDOUT, env=ENV, check=True)
            return json.loads((out / f"{label}.json").read_text())
        bench(f"warm-{n}", 40, 40, 1)
        before = cpu(pids); t0 = time.time()
        r = bench(f"run-{n}-{ratio}", 600, 300, 7)
        after = cpu(pids)
        split = {k: round(after[k] - before.get(k, 0), 2) for k in after}
        tot = sum(split.values())
        print(f"ratio {ratio}: {r['output_throughput']:.0f} tok/s  median TTFT {r['median_ttft_ms']:.0f} ms  "
              f"CPU {tot/600*1000:.2f} ms/req  {split}", flush=True)
    finally:
        os.killpg(up.pid, signal.SIGINT); up.wait(60)
