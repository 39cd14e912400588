"""Router at scale: one router process on one core, 256 simulated workers streaming load reports
and KV events to it, and gateways' worth of Picks streams asking it as fast as it answers.

    .venv/bin/python bench/router_scale.py [--workers 256] [--seconds 10] [--streams 8]
        [--depth 16] [--batches | --rate PICKS_PER_S | --in-process] [--prompt-words 256]
        [--routing kv-aware] [--router-cpu 0] [--report-interval-s 0.1] [--router-tree DIR] [--out FILE]

The simulated workers (this process, on the other CPUs) implement the real Worker service's
Info / WatchLoad / WatchKvEvents: a load report every ``--report-interval-s`` (100 ms), each
carrying 16 blocks stored and 16 removed from a pool holding the benchmark's prefixes (on the
one WatchLoad stream the router asks for, or on WatchKvEvents for a router that asks for that),
so the router's index churns as a busy fleet's does. Each Picks stream keeps ``--depth`` picks
outstanding (the gateway's stream carries many requests at once), or, with ``--rate``, is sent
the picks due at that rate whatever is outstanding (open loop: the latency of a rate); prompts are prefix_repetition prompts (16 prefixes). Prints
picks/s and the pick latency seen by the caller (p50/p99), plus the router's own CPU seconds.

``--in-process`` measures the pick alone: the router's policy, prefix view and KV index in this
process, no gRPC, over ``--workers`` workers that each hold four prefixes' blocks and whose load
reports keep changing (one in seven of them every 50 picks), one pick at a time for ``--seconds``.
It is the ceiling the router service's picks/s approaches on the same core.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
import numpy as np
import psutil

from meshserve.loadgen.mesh import cli_module
from meshserve.loadgen.workloads import prefix_repetition_requests
from meshserve.router.policies import PickContext, build_policy
from meshserve.router.server import Router
from meshserve.router.state import WorkerLoad, WorkerTable
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.prompts import block_hashes, sim_tokenize

REPO = Path(__file__).resolve().parent.parent

BLOCK = 16


class SimulatedWorker(pb_grpc.WorkerServicer):
    sent = 0  # messages every simulated worker sent the router (load reports and KV events)
    def __init__(self, worker_id: str, prefix_blocks: list[list[int]], rng: random.Random,
                 interval_s: float = 0.1) -> None:
        self.worker_id = worker_id
        self.interval_s = interval_s
        self.rng = rng
        # Each worker holds some of the prefixes' blocks (so picks have something to match).
        self.held = {h for chain in rng.sample(prefix_blocks, 4) for h in chain}
        self.spare = [rng.getrandbits(64) for _ in range(4096)]

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.WorkerInfo:
        return pb.WorkerInfo(worker_id=self.worker_id, engine="sim", block_size=BLOCK, max_num_seqs=256,
                             tokenizer="sim", kv_events=True)

    def _load(self, seq: int) -> pb.LoadReport:
        return pb.LoadReport(worker_id=self.worker_id, num_running=self.rng.randint(0, 64),
                             num_waiting=self.rng.randint(0, 4), kv_cache_usage=self.rng.random(),
                             max_num_seqs=256, sequence=seq)

    def _kv_changes(self):  # -> Iterator[pb.KvEvents]: the whole pool, then 16 stored and 16 removed each time
        yield pb.KvEvents(reset=True, stored=sorted(self.held), block_size=BLOCK)
        churn: list[int] = []
        while True:
            stored = [self.spare[self.rng.randrange(len(self.spare))] for _ in range(16)]
            removed, churn = churn[:16], churn[16:] + stored
            yield pb.KvEvents(stored=stored, removed=removed, block_size=BLOCK)

    async def WatchLoad(self, request: pb.WatchLoadRequest, context: grpc.aio.ServicerContext):
        """As a busy worker: a report every interval; with ``kv_events`` each carries that
        interval's KV changes (the worker's one stream to the router)."""
        changes = self._kv_changes() if request.kv_events else None
        interval_s = max(self.interval_s, request.min_interval_s)  # fewer if the router asks, as a worker does
        await asyncio.sleep(self.rng.random() * interval_s)  # workers started together report out of step
        for seq in itertools.count(1):
            report = self._load(seq)
            if changes is not None:
                report.kv.CopyFrom(next(changes))
            SimulatedWorker.sent += 1
            yield report
            await asyncio.sleep(interval_s)

    async def WatchKvEvents(self, request: pb.WatchKvEventsRequest, context: grpc.aio.ServicerContext):
        for n, events in enumerate(self._kv_changes()):
            if n:
                await asyncio.sleep(self.interval_s)
            SimulatedWorker.sent += 1
            yield events


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _random_load(rng: random.Random, sequence: int) -> WorkerLoad:
    return WorkerLoad(num_running=rng.randint(0, 64), num_waiting=rng.randint(0, 4), max_num_seqs=256,
                      sequence=sequence, requests_received=sequence)


async def pick_alone(args: argparse.Namespace, prompts: list[str], prefix_blocks: list[list[int]]) -> dict:
    """The pick in this process: ``Router.pick`` over a table of ``args.workers`` workers."""
    addresses = [f"10.0.{i // 256}.{i % 256}:50061" for i in range(args.workers)]
    table = WorkerTable(addresses)
    router = Router(table, build_policy(args.routing, 2.0), 2.0, random.Random(1))
    await router.prefix.configure("sim", BLOCK)
    for i, address in enumerate(addresses):
        rng = random.Random(i)
        table.on_connected(address, f"sim-{i}")
        table.on_report(address, _random_load(rng, 1))
        router.kv.stored(address, {h for chain in rng.sample(prefix_blocks, 4) for h in chain})
    latencies: list[float] = []
    started = time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        n = len(latencies)
        t0 = time.perf_counter()
        router.pick(PickContext(request_id=str(n), prompt=prompts[n % len(prompts)]))
        latencies.append(time.perf_counter() - t0)
        if n % 50 == 49:  # reports keep arriving: picks settle, loads change
            for i in range(0, args.workers, 7):
                table.on_report(addresses[(i + n) % args.workers], _random_load(random.Random(n + i), n + 2))
    elapsed = time.perf_counter() - started
    lat = np.array(latencies) * 1000
    return {"workers": args.workers, "routing": args.routing, "rpc": "none (in process)",
            "prompt_words": args.prompt_words, "picks": len(latencies), "picks_per_s": len(latencies) / elapsed,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99))}


def report(figures: dict, out: Path | None) -> None:
    print(json.dumps(figures, indent=1))
    if out:
        out.write_text(json.dumps(figures, indent=1) + "\n")


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=256)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--streams", type=int, default=8, help="Picks streams (gateways' channels)")
    parser.add_argument("--depth", type=int, default=16, help="picks outstanding per stream")
    parser.add_argument("--batches", action="store_true",
                        help="ask over Router/PickBatches, as the gateway does: each answer's picks are asked "
                             "again as one batch (without: Router/Picks, one message per pick)")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="offer this many picks a second in all, open loop (over PickBatches: each stream sends "
                             "the picks due every millisecond as one batch), and time each from when it was due; "
                             "0: closed loop, --depth outstanding per stream")
    parser.add_argument("--in-process", action="store_true",
                        help="the pick alone, in this process: no router service, no gRPC (see above)")
    parser.add_argument("--prompt-words", type=int, default=256, help="words per prompt (prefix 3/4, suffix 1/4)")
    parser.add_argument("--routing", default="kv-aware")
    parser.add_argument("--router-cpu", type=int, default=0, help="the one CPU the router may use")
    parser.add_argument("--report-interval-s", type=float, default=0.1,
                        help="each simulated worker's load report and KV-event message interval")
    parser.add_argument("--router-tree", type=Path, default=REPO,
                        help="run the router from this source tree (a worktree of another commit, for a before/after)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args()

    rng = random.Random(0)
    prompts = [r.prompt for r in prefix_repetition_requests(
        2000, 16, args.prompt_words * 3 // 4, args.prompt_words // 4, 1, rng)]
    prefix_blocks = [block_hashes(sim_tokenize(p), BLOCK) for p in prompts[:64]]
    if args.in_process:
        report(await pick_alone(args, prompts, prefix_blocks), args.out)
        return 0

    others = sorted(os.sched_getaffinity(0) - {args.router_cpu}) or [args.router_cpu]
    os.sched_setaffinity(0, others)  # the fleet and the callers stay off the router's CPU
    servers, addresses = [], []
    for i in range(args.workers):
        server = grpc.aio.server()
        pb_grpc.add_WorkerServicer_to_server(SimulatedWorker(f"sim-{i}", prefix_blocks, random.Random(i),
                                                                 args.report_interval_s), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        addresses.append(f"127.0.0.1:{port}")

    router_port = free_port()
    router = subprocess.Popen(
        ["taskset", "-c", str(args.router_cpu), sys.executable, "-m", cli_module(args.router_tree), "serve", "router",
         "--port", str(router_port), "--metrics-port", "-1", "--routing", args.routing, "--log-level", "WARNING",
         "--workers", *addresses],
        cwd=args.router_tree, env={**os.environ, "PYTHONPATH": str(args.router_tree)},
    )
    try:
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{router_port}")
        stub = pb_grpc.RouterStub(channel)
        # Ready when every worker is connected and the index holds their blocks.
        deadline = time.monotonic() + 120
        while True:
            try:
                ws = (await stub.ListWorkers(pb.ListWorkersRequest(), timeout=5)).workers
                if sum(w.healthy for w in ws) == args.workers:
                    break
            except grpc.aio.AioRpcError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the router never saw every worker")
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.0)  # the KV streams' first messages

        latencies: list[float] = []
        predicted = 0
        stop_at = time.monotonic() + args.seconds
        proc = psutil.Process(router.pid)
        cpu_before = sum(proc.cpu_times()[:2])
        sent_before = SimulatedWorker.sent
        started = time.perf_counter()

        def answered(answer: pb.PickResponse, sent: dict[int, float]) -> None:
            nonlocal predicted
            latencies.append(time.perf_counter() - sent.pop(answer.pick_id))
            predicted += answer.predicted_cached_tokens > 0

        async def batch_stream(s: int) -> None:
            call = stub.PickBatches()
            sent: dict[int, float] = {}
            ids = itertools.count()
            prompt_at = itertools.cycle(prompts[s::args.streams])

            async def send(n: int) -> None:
                picks = []
                for _ in range(n):
                    i = next(ids)
                    sent[i] = time.perf_counter()
                    picks.append(pb.PickRequest(request_id=f"s{s}-{i}", prompt=next(prompt_at), pick_id=i))
                await call.write(pb.PickBatch(picks=picks))

            await send(args.depth)
            while time.monotonic() < stop_at:
                resp = await call.read()
                for answer in resp.answers:
                    answered(answer, sent)
                await send(len(resp.answers))
            await call.done_writing()
            while await call.read() is not grpc.aio.EOF:
                pass

        async def paced_stream(s: int) -> None:
            """Open loop: the picks due at ``--rate`` go out each millisecond, whatever is unanswered."""
            call = stub.PickBatches()
            sent: dict[int, float] = {}
            prompt_at = itertools.cycle(prompts[s::args.streams])
            interval = args.streams / args.rate  # between two picks of this stream

            async def read() -> None:
                while (resp := await call.read()) is not grpc.aio.EOF:
                    for answer in resp.answers:
                        answered(answer, sent)

            reader = asyncio.create_task(read())
            start, due = time.perf_counter(), 0
            while time.monotonic() < stop_at:
                now_due = int((time.perf_counter() - start) / interval) + 1
                picks = []
                for i in range(due, now_due):
                    sent[i] = start + i * interval  # when it was due, not when the loop got to it
                    picks.append(pb.PickRequest(request_id=f"s{s}-{i}", prompt=next(prompt_at), pick_id=i))
                due = now_due
                if picks:
                    await call.write(pb.PickBatch(picks=picks))
                await asyncio.sleep(0.001)
            await call.done_writing()
            await reader

        async def stream(s: int) -> None:
            if args.rate:
                return await paced_stream(s)
            if args.batches:
                return await batch_stream(s)
            call = stub.Picks()
            sent: dict[int, float] = {}
            ids = itertools.count()
            prompt_at = itertools.cycle(prompts[s::args.streams])

            async def send() -> None:
                i = next(ids)
                sent[i] = time.perf_counter()
                await call.write(pb.PickRequest(request_id=f"s{s}-{i}", prompt=next(prompt_at), pick_id=i))

            for _ in range(args.depth):
                await send()
            while time.monotonic() < stop_at:
                answered(await call.read(), sent)
                await send()
            await call.done_writing()
            while await call.read() is not grpc.aio.EOF:
                pass

        await asyncio.gather(*(stream(s) for s in range(args.streams)))
        elapsed = time.perf_counter() - started
        cpu = sum(proc.cpu_times()[:2]) - cpu_before
        fleet_messages = SimulatedWorker.sent - sent_before
        lat = np.array(latencies) * 1000
        figures = {
            "workers": args.workers, "routing": args.routing, "streams": args.streams,
            **({"offered_picks_per_s": args.rate} if args.rate else {"depth": args.depth}),
            "rpc": "PickBatches" if args.batches or args.rate else "Picks",
            "prompt_words": args.prompt_words, "picks": len(latencies),
            "picks_per_s": len(latencies) / elapsed, "p50_ms": float(np.percentile(lat, 50)),
            "p99_ms": float(np.percentile(lat, 99)), "router_cpu_s_per_s": cpu / elapsed,
            "picks_with_cached_prefix": predicted / max(1, len(latencies)),
            "report_interval_s": args.report_interval_s, "fleet_messages_per_s": fleet_messages / elapsed,
            "router_tree": str(args.router_tree),
        }
        report(figures, args.out)
        await channel.close()
    finally:
        router.terminate()
        router.wait(30)
        await asyncio.gather(*(s.stop(0) for s in servers))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
