"""A worker dies or freezes, or the router dies, under load: no stream fails, and every answer
is the undisturbed one.

A three-worker sim fleet (real processes under the supervisor, as `meshserve up` runs them,
through Envoy) serves concurrent greedy streams; one worker is frozen (SIGSTOP) or killed
(SIGKILL) while it is streaming. The gateway moves each of its streams to another worker with
the tokens the client already has (mid-stream migration): each answer must equal, token for
token and character for character, the one the same prompt got before the fault, with no
error. With the router killed, the gateway picks from the workers it knows until the
supervisor has the router back."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from meshserve.commands.launcher import Mesh, Proc
from meshserve.commands.supervisor import RestartPolicy
from meshserve.services.config import GatewayConfig, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from tests.integration.helpers import mesh_spec, metric_sum, scrape, wait_until

pytestmark = pytest.mark.integration

USERS = 36
MAX_TOKENS = 120
STALL_TIMEOUT_S = 1.0
TIMEOUT_S = 90.0


@dataclass
class Answer:
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    workers: list[str] = field(default_factory=list)  # each chunk's worker
    times: list[float] = field(default_factory=list)  # when each chunk arrived
    finish_reason: str = ""
    completion_tokens: int = 0


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    # ~7 ms per step plus a little per sequence: a 120-token stream lasts about a second or more.
    spec = mesh_spec(tmp_path_factory.mktemp("faults-workers"), "sim", workers=3,
                     worker=WorkerConfig(sim_itl_base_ms=8.0),
                     gateway=GatewayConfig(stall_timeout_s=STALL_TIMEOUT_S), supervise=RestartPolicy())
    with Mesh(spec) as mesh:
        yield mesh


def prompt(i: int, tag: str) -> str:
    return f"{tag} user {i}: tell me a long story about the number {i * 7919 % 1000}"


async def stream(channel: grpc.aio.Channel, text: str, seen: asyncio.Queue[str], max_tokens: int,
                 model: str = "") -> Answer:
    answer = Answer()
    request = pb.GenerateRequest(prompt=text, max_tokens=max_tokens, temperature=0, cache="off", model=model)
    async for chunk in pb_grpc.InferenceStub(channel).Generate(request, timeout=TIMEOUT_S):
        answer.tokens += chunk.token_ids
        answer.text += chunk.text
        answer.workers.append(chunk.worker)
        answer.times.append(time.monotonic())
        if chunk.finish_reason:
            answer.finish_reason = chunk.finish_reason
            answer.completion_tokens = chunk.usage.completion_tokens
        if len(answer.workers) == 1:
            seen.put_nowait(chunk.worker)
    return answer


async def run(mesh: Mesh, tag: str, fault: signal.Signals | None = None, max_tokens: int = MAX_TOKENS,
              signalled: Callable[[Proc], None] = lambda _: None, model: str = "") -> tuple[list[Answer], str]:
    """USERS concurrent streams; with ``fault``, the worker serving the most of them gets the
    signal once every stream has its first token. Returns the answers and the victim."""
    seen: asyncio.Queue[str] = asyncio.Queue()
    async with insecure_channel(mesh.envoy_address) as channel:
        tasks = [asyncio.create_task(stream(channel, prompt(i, tag), seen, max_tokens, model)) for i in range(USERS)]
        victim = ""
        proc = None
        if fault is not None:
            first = [await asyncio.wait_for(seen.get(), TIMEOUT_S) for _ in range(USERS)]
            victim = max(set(first), key=first.count)
            proc = next(p for p in mesh.procs if p.name == victim)
            assert not all(t.done() for t in tasks), "every stream ended before the fault"
            os.killpg(proc.popen.pid, fault)
            signalled(proc)
        try:
            return list(await asyncio.gather(*tasks)), victim
        finally:
            if fault == signal.SIGSTOP and proc is not None:
                os.killpg(proc.popen.pid, signal.SIGCONT)


def migrations(mesh: Mesh, outcome: str) -> float:
    return metric_sum(scrape(mesh.metrics["gateway"]), "meshserve_gateway_migrations_total", outcome=outcome)


@pytest.mark.parametrize("fault", [signal.SIGSTOP, signal.SIGKILL], ids=["frozen", "killed"])
async def test_streams_of_a_lost_worker_continue_elsewhere_unchanged(fleet: Mesh, fault: signal.Signals) -> None:
    tag = fault.name
    undisturbed, _ = await run(fleet, tag)
    ok_before, failed_before = migrations(fleet, "ok"), migrations(fleet, "failed")
    faulted, victim = await run(fleet, tag, fault)

    moved = [a for a in faulted if a.workers[0] == victim]
    assert moved, "no stream was on the victim"
    for before, after in zip(undisturbed, faulted, strict=True):
        assert after.tokens == before.tokens  # no duplicate, no gap, the same tokens
        assert after.text == before.text
        assert after.finish_reason == "length" and after.completion_tokens == MAX_TOKENS
    spliced = [a for a in moved if a.workers[-1] != victim]
    assert spliced, "no stream moved off the victim"
    assert migrations(fleet, "ok") - ok_before >= len(spliced)
    assert migrations(fleet, "failed") == failed_before
    # The client's pause at the splice: the last chunk from the victim to the first from elsewhere.
    gaps = []
    for a in spliced:
        at = next(i for i, w in enumerate(a.workers) if w != victim)
        gaps.append(a.times[at] - a.times[at - 1])
    print(f"{tag}: {len(spliced)} of {USERS} streams migrated; gap at the splice max {max(gaps):.2f}s")
    if fault == signal.SIGSTOP:
        # Found by the unanswered keepalive pings within the stall timeout (plus a ping period).
        assert max(gaps) < STALL_TIMEOUT_S + 2.0


@pytest.fixture(scope="module")
def lora_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    lora = WorkerConfig(sim_itl_base_ms=8.0, enable_lora=True, max_loras=2,
                        lora_modules=["support=/adapters/support", "legal=/adapters/legal"])
    spec = mesh_spec(tmp_path_factory.mktemp("faults-lora"), "sim", workers=3, worker=lora,
                     gateway=GatewayConfig(stall_timeout_s=STALL_TIMEOUT_S), supervise=RestartPolicy())
    with Mesh(spec) as mesh:
        yield mesh


async def test_a_stream_on_an_adapter_continues_on_that_adapter_elsewhere(lora_fleet: Mesh) -> None:
    """Streams on the adapter `support` whose worker is killed go on, on another worker, with the
    same adapter: the answers are the undisturbed ones, which are not the base model's."""
    base, _ = await run(lora_fleet, "lora", model="")
    undisturbed, _ = await run(lora_fleet, "lora", model="support")
    assert all(a.tokens != b.tokens for a, b in zip(undisturbed, base, strict=True))  # the adapter's own
    faulted, victim = await run(lora_fleet, "lora", signal.SIGKILL, model="support")
    spliced = [a for a in faulted if a.workers[0] == victim and a.workers[-1] != victim]
    assert spliced, "no stream moved off the victim"
    for before, after in zip(undisturbed, faulted, strict=True):
        assert (after.tokens, after.text, after.finish_reason) == (before.tokens, before.text, "length")


def router_picks(mesh: Mesh) -> float:
    return metric_sum(scrape(mesh.metrics["router"]), "meshserve_router_picks_total")


async def test_with_the_router_killed_streams_go_on_and_picks_resume_when_it_is_back(fleet: Mesh) -> None:
    undisturbed, _ = await run(fleet, "router")
    gateway = fleet.metrics["gateway"]
    fallback_before = metric_sum(scrape(gateway), "meshserve_gateway_fallback_picks_total")
    router = next(p for p in fleet.procs if p.name == "router")
    os.killpg(router.popen.pid, signal.SIGKILL)
    faulted, _ = await run(fleet, "router")  # started at once: the router is still down
    for before, after in zip(undisturbed, faulted, strict=True):
        assert after.tokens == before.tokens and after.text == before.text
    assert metric_sum(scrape(gateway), "meshserve_gateway_fallback_picks_total") > fallback_before
    # The supervisor starts the router again; the gateway's picks go to it once it answers.
    await wait_until(lambda: next(p for p in fleet.procs if p.name == "router").ready
                     and next(p for p in fleet.procs if p.name == "router").popen.pid != router.popen.pid,
                     60, "the router to be back")
    async with insecure_channel(fleet.envoy_address) as channel:
        async def one() -> None:
            request = pb.GenerateRequest(prompt="after the router", max_tokens=4, temperature=0, cache="off")
            chunks = [c async for c in pb_grpc.InferenceStub(channel).Generate(request, timeout=TIMEOUT_S)]
            assert chunks[-1].finish_reason == "length"

        await one()
        deadline = time.monotonic() + 30
        while router_picks(fleet) == 0:  # the first picks may still fall back while the stream reopens
            assert time.monotonic() < deadline, "the restarted router made no pick"
            await one()


async def test_a_drained_worker_exits_in_its_grace_and_what_outlives_it_moves_on(fleet: Mesh) -> None:
    # Streams of ~4 s against a 2 s grace period (mesh_spec): SIGTERM drains the worker (no new
    # requests; the running ones go on), and what still runs at the deadline migrates.
    long = 480
    undisturbed, _ = await run(fleet, "drain", max_tokens=long)
    exits: list[asyncio.Task[float]] = []

    def watch(proc: Proc) -> None:  # run() calls it right after it signalled the worker
        sent = time.monotonic()

        async def exited() -> float:
            while proc.popen.poll() is None:  # polling the process, bounded by the wait_for below
                await asyncio.sleep(0.05)
            return time.monotonic() - sent

        exits.append(asyncio.create_task(exited()))

    faulted, victim = await run(fleet, "drain", signal.SIGTERM, long, watch)
    exited_after = await asyncio.wait_for(exits[0], TIMEOUT_S)
    for before, after in zip(undisturbed, faulted, strict=True):
        assert after.tokens == before.tokens and after.text == before.text
        assert after.completion_tokens == long
    assert exited_after < 2 + 3.0, f"the drained worker took {exited_after:.1f}s to exit (grace 2 s)"
    moved = [a for a in faulted if a.workers[0] == victim and a.workers[-1] != victim]
    print(f"drain: exited {exited_after:.2f}s after SIGTERM; {len(moved)} streams moved at the deadline")
    assert moved, "no stream outlived the grace period (make them longer)"


async def test_a_client_that_reads_slowly_gets_everything_and_holds_up_no_one(fleet: Mesh) -> None:
    # One client takes a chunk every 20 ms from a long stream (its HTTP/2 window fills, and the
    # gateway's writes to it wait) while others stream at full speed on the same connection.
    long = 1500
    request = pb.GenerateRequest(prompt="a slow reader", max_tokens=long, temperature=0, cache="off")
    async with insecure_channel(fleet.envoy_address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        fast_alone, _ = await run(fleet, "fast")

        async def slow() -> list[int]:
            tokens: list[int] = []
            async for chunk in stub.Generate(request, timeout=TIMEOUT_S):
                tokens += chunk.token_ids
                await asyncio.sleep(0.02)  # the slow client itself, not a synchronisation
            return tokens

        slow_task = asyncio.create_task(slow())
        fast_beside, _ = await run(fleet, "fast")
        assert not slow_task.done(), "the slow stream should outlast the fast ones"
        tokens = await asyncio.wait_for(slow_task, TIMEOUT_S)
    assert len(tokens) == long
    for alone, beside in zip(fast_alone, fast_beside, strict=True):
        assert beside.tokens == alone.tokens
    took = [a.times[-1] - a.times[0] for a in fast_beside]
    took_alone = [a.times[-1] - a.times[0] for a in fast_alone]
    print(f"fast streams: {max(took_alone):.2f}s alone, {max(took):.2f}s beside a slow reader")
