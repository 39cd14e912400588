"""Faults under load: a worker killed (SIGKILL), frozen (SIGSTOP) or drained (SIGTERM), or the
router killed, while hundreds of greedy streams run, against the same prompts undisturbed on the
same mesh.

For each fault a fresh `meshserve up` serves two `meshserve bench` runs with the same seed (so
the same prompts in the same order): undisturbed, then with the fault sent to one worker's
process group (``router``: the router's) ``--at`` seconds in, or as soon after as worker-1 is
streaming (its engine has running requests and has sent first tokens in this run: a fault
before any token would test failover, not migration). Every answer of the second run is compared with the first's,
request by request (digests of the token ids, `--save-detailed`), and the migrated streams'
pause at the splice is read from the bench's summary. ``none`` is the control: the same two
runs with no fault, which must differ nowhere.

    .venv/bin/python bench/faults.py OUT_DIR [--engine sim] [--workers 4] [--faults none,kill,stop,term,router]
        [--num-prompts 1500] [--concurrency 300] [--input-len 64] [--output-len 256] [--at 8]
        [--up-args "--stall-timeout-s 1"] [--tree DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from meshserve.loadgen.mesh import by_name, cli, meshserve_up, tree_env
from meshserve.loadgen.results import save_result

REPO = Path(__file__).resolve().parent.parent

PORT = 8080
# fault -> (the signal, the process of the mesh that gets it)
FAULTS = {"kill": (signal.SIGKILL, "worker-1"), "stop": (signal.SIGSTOP, "worker-1"),
          "term": (signal.SIGTERM, "worker-1"), "router": (signal.SIGKILL, "router")}
PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls")  # dropped once compared (MBs per run)


def process_group(name: str) -> int:
    """The process group of the mesh's process ``name`` ("worker-1", "router")."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if "serve" in cmd and (name in cmd if name.startswith("worker-") else cmd[cmd.index("serve") + 1] == name):
            return os.getpgid(proc.pid)
    raise RuntimeError(f"no process of {name}")


def streaming(url: str, first_tokens_before: float) -> bool:
    m = by_name(url)
    return (m.get("vllm:num_requests_running", 0) >= 1
            and m.get("vllm:time_to_first_token_seconds_count", 0) - first_tokens_before >= 10)


def bench(args: argparse.Namespace, out: Path, label: str, tree: Path) -> subprocess.Popen[bytes]:
    argv = [*cli(tree), "bench", "--target", f"127.0.0.1:{PORT}", "--num-prompts", str(args.num_prompts),
            "--max-concurrency", str(args.concurrency), "--random-input-len", str(args.input_len),
            "--random-output-len", str(args.output_len), "--temperature", "0", "--cache", "off",
            "--seed", str(args.seed), "--disable-tqdm", "--metric-percentiles", "50,99",
            "--save-result", "--save-detailed", "--result-dir", str(out), "--result-filename", f"{label}.json"]
    log = open(out / f"{label}.txt", "wb")  # noqa: SIM115 - closed with the process
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=tree, env=tree_env(tree))


def run_fault(fault: str, args: argparse.Namespace, out: Path, tree: Path) -> dict:
    flags = ["--engine", args.engine, "--workers", str(args.workers), "--port", str(PORT),
             *shlex.split(args.up_args)]
    with tempfile.TemporaryDirectory(prefix="meshserve-faults-") as run_dir, meshserve_up(flags, run_dir, tree) as mesh:
        assert bench(args, out, f"{fault}-undisturbed", tree).wait() == 0, "the undisturbed run failed"
        worker_1 = mesh.worker_metrics()[1]
        first_tokens = by_name(worker_1).get("vllm:time_to_first_token_seconds_count", 0)
        faulted = bench(args, out, f"{fault}-faulted", tree)
        sent_at: list[float] = []
        sig, victim = FAULTS.get(fault, (None, "worker-1"))
        group = process_group(victim)

        def inject() -> None:
            time.sleep(args.at)  # the fault's earliest moment in the run, not a synchronisation
            while faulted.poll() is None and not streaming(worker_1, first_tokens):
                time.sleep(0.05)  # polling worker-1's own metrics until it streams
            if sig is not None and faulted.poll() is None:
                os.killpg(group, sig)
                sent_at.append(time.monotonic())

        injector = threading.Thread(target=inject, daemon=True)
        started = time.monotonic()
        injector.start()
        faulted.wait()
        injector.join()
        if fault == "stop":
            os.killpg(group, signal.SIGCONT)
        gateway = mesh.metrics("gateway")
    a = json.loads((out / f"{fault}-undisturbed.json").read_text())
    b = json.loads((out / f"{fault}-faulted.json").read_text())
    pairs = list(zip(a["answer_digests"], b["answer_digests"], b["splices"], strict=True))
    differing = sum(1 for x, y, _ in pairs if x and y and x != y)
    # vLLM's fp32 CPU kernels round differently with other batch shapes, so a greedy answer can
    # change between two undisturbed runs (the `none` control counts how often): a difference
    # in a migrated stream is the migration's only if the control shows none.
    differing_migrated = sum(1 for x, y, n in pairs if x and y and x != y and n)
    for name, result in ((f"{fault}-undisturbed", a), (f"{fault}-faulted", b)):
        # The digests, splices and compact timings stay (`meshserve plot` draws the pair).
        save_result({k: v for k, v in result.items() if k not in PER_REQUEST}, out / f"{name}.json", detailed=True)
    row = {"fault": fault, "at_s": round(sent_at[0] - started, 2) if sent_at else None,
           "failed": b["failed"], "errors": b["errors"], "differing": differing,
           "differing_migrated": differing_migrated, "migrated": b.get("migrated", 0),
           "splice_gap_p50_ms": b.get("median_splice_gap_ms", 0.0), "splice_gap_p99_ms": b.get("p99_splice_gap_ms", 0.0),
           "throughput": b["output_throughput"], "undisturbed_throughput": a["output_throughput"],
           "undisturbed_failed": a["failed"], "gateway_metrics": gateway}
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--engine", default="sim")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--faults", default="none,kill,stop,term")
    parser.add_argument("--num-prompts", type=int, default=1500)
    parser.add_argument("--concurrency", type=int, default=300)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=256)
    parser.add_argument("--at", type=float, default=8.0, help="seconds into the faulted run")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--up-args", default="", help="more `meshserve up` flags")
    parser.add_argument("--tree", type=Path, default=REPO, help="the source tree to run (a worktree)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = [run_fault(f, args, args.out, args.tree.resolve()) for f in args.faults.split(",")]
    lines = ["| fault | sent at (s) | failed | answers differing (of them migrated) | streams migrated "
             "| pause at the splice p50 / p99 (ms) | tok/s (undisturbed) |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['fault']} | {r['at_s'] if r['at_s'] is not None else '-'} | {r['failed']} "
                     f"{r['errors'] or ''} | {r['differing']} ({r['differing_migrated']}) | {r['migrated']} | "
                     f"{r['splice_gap_p50_ms']:.0f} / {r['splice_gap_p99_ms']:.0f} | "
                     f"{r['throughput']:,.0f} ({r['undisturbed_throughput']:,.0f}) |")
    text = f"`{' '.join(sys.argv)}`\n\n" + "\n".join(lines) + "\n"
    (args.out / "summary.md").write_text(text)
    (args.out / "rows.json").write_text(json.dumps(rows, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
