"""The worker's Session stream (the gateway's path) on a real worker with the sim engine: many
requests share one call, a step's deltas travel together, and cancels, errors and a departed
gateway reach the engine."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import grpc
import pytest

from meshserve.gateway.relay import RequestStream, WorkerSession
from meshserve.services import validation
from meshserve.services.config import SESSION_BATCH_HEADER, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.offload import OFFLOAD_CHARS
from meshserve.services.server import Running, insecure_channel
from meshserve.worker import sim_engine
from meshserve.worker.server import WorkerServicer, start_worker

TIMEOUT = 30.0


@pytest.fixture(scope="module")
async def worker() -> AsyncIterator[tuple[Running, WorkerServicer]]:
    cfg = WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="sim", worker_id="sim-session",
                       grace_seconds=5.0, sim_itl_base_ms=2.0)
    running, servicer = await start_worker(cfg)
    yield running, servicer
    await running.shutdown()


def greedy(request_id: str, max_tokens: int = 8, prompt: str = "") -> pb.GenerateRequest:
    return pb.GenerateRequest(request_id=request_id, prompt=prompt or f"prompt of {request_id}",
                              max_tokens=max_tokens, temperature=0, ignore_eos=True)


def finished(texts: dict[str, str], request_id: str) -> bool:
    return texts.get(request_id, "").endswith("\0")


async def read_until(call: grpc.aio.StreamStreamCall, done: set[str], texts: dict[str, str],
                     errors: dict[str, pb.SessionError]) -> list[pb.SessionResponse]:
    """Reads session messages until every request in ``done`` finished or failed (a finish
    reason appends "\0" to its text)."""
    messages = []
    async with asyncio.timeout(TIMEOUT):
        while any(not finished(texts, r) and r not in errors for r in done):
            msg = await call.read()
            assert msg is not grpc.aio.EOF
            messages.append(msg)
            for d in msg.deltas:
                texts[d.request_id] = texts.get(d.request_id, "") + d.text + ("\0" if d.finish_reason else "")
            for e in msg.errors:
                errors[e.request_id] = e
    return messages


async def test_requests_on_one_session_get_what_generate_gives_and_share_messages(
    stub: pb_grpc.WorkerStub,
) -> None:
    ids = [f"s{i}" for i in range(6)]
    expected = {}
    for rid in ids:
        chunks = [c async for c in stub.Generate(greedy(f"direct-{rid}", prompt=rid), timeout=TIMEOUT)]
        expected[rid] = "".join(c.text for c in chunks) + "\0"

    call = stub.Session()
    for rid in ids:
        await call.write(pb.SessionRequest(generate=greedy(rid, prompt=rid)))
    texts: dict[str, str] = {}
    errors: dict[str, pb.SessionError] = {}
    messages = await read_until(call, set(ids), texts, errors)
    call.cancel()

    assert not errors and texts == expected
    deltas = sum(len(m.deltas) for m in messages)
    assert deltas >= 6 * 8 and len(messages) < deltas  # one engine step, one message
    assert max(len({d.request_id for d in m.deltas}) for m in messages) > 1


async def test_bad_request_fails_alone_and_the_session_goes_on(stub: pb_grpc.WorkerStub) -> None:
    call = stub.Session()
    await call.write(pb.SessionRequest(generate=pb.GenerateRequest(request_id="bad", prompt="hi", temperature=-1)))
    await call.write(pb.SessionRequest(generate=greedy("good")))
    await call.write(pb.SessionRequest(generate=greedy("good")))  # the same id again while it runs
    texts: dict[str, str] = {}
    errors: dict[str, pb.SessionError] = {}
    await read_until(call, {"bad", "good"}, texts, errors)  # until the duplicate's refusal
    errors_so_far = dict(errors)
    errors.clear()
    await read_until(call, {"good"}, texts, errors)  # until the first one finished
    errors.update(errors_so_far)
    call.cancel()
    assert errors["bad"].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
    assert "temperature" in errors["bad"].message
    assert errors["good"].code == grpc.StatusCode.INVALID_ARGUMENT.value[0]  # the duplicate
    assert "already running" in errors["good"].message
    assert finished(texts, "good")  # the first one finished anyway


async def wait_idle(servicer: WorkerServicer) -> None:
    async with asyncio.timeout(TIMEOUT):
        while servicer.in_flight or servicer.engine.load().num_running:
            await servicer.engine.load_signal.wait(0.05)


async def test_cancel_stops_the_request_in_the_engine(
    stub: pb_grpc.WorkerStub, worker: tuple[Running, WorkerServicer]
) -> None:
    servicer = worker[1]
    call = stub.Session()
    await call.write(pb.SessionRequest(generate=greedy("long", max_tokens=1500)))
    async with asyncio.timeout(TIMEOUT):
        first = await call.read()
    assert first.deltas[0].request_id == "long"
    assert servicer.engine.load().num_running == 1
    await call.write(pb.SessionRequest(cancel="long"))
    await wait_idle(servicer)
    assert servicer.engine.load().num_running == 0
    call.cancel()


async def test_a_gateway_that_goes_away_stops_its_requests(
    stub: pb_grpc.WorkerStub, worker: tuple[Running, WorkerServicer]
) -> None:
    servicer = worker[1]
    call = stub.Session()
    for rid in ("gone-1", "gone-2"):
        await call.write(pb.SessionRequest(generate=greedy(rid, max_tokens=1500)))
    async with asyncio.timeout(TIMEOUT):
        while servicer.engine.load().num_running < 2:
            await call.read()
    call.cancel()
    await wait_idle(servicer)
    assert servicer.in_flight == 0 and servicer.engine.load().num_running == 0


async def test_a_batch_of_actions_is_served_in_order_and_the_worker_says_it_reads_batches(
    stub: pb_grpc.WorkerStub, worker: tuple[Running, WorkerServicer]
) -> None:
    """A burst the gateway queued comes as one message: each generate runs, and a cancel in the
    same batch stops its request before it ever ran (its id is free again at once)."""
    expected = {}
    for rid in ("b1", "b3"):
        chunks = [c async for c in stub.Generate(greedy(f"direct-{rid}", prompt=rid), timeout=TIMEOUT)]
        expected[rid] = "".join(c.text for c in chunks) + "\0"
    call = stub.Session()
    assert dict(await call.initial_metadata())[SESSION_BATCH_HEADER] == "1"
    await call.write(pb.SessionRequest(batch=[
        pb.SessionRequest(generate=greedy("b1", prompt="b1")),
        pb.SessionRequest(generate=greedy("b2", max_tokens=1500)),
        pb.SessionRequest(cancel="b2"),
        pb.SessionRequest(generate=greedy("b3", prompt="b3")),
    ]))
    texts: dict[str, str] = {}
    errors: dict[str, pb.SessionError] = {}
    await read_until(call, {"b1", "b3"}, texts, errors)
    assert not errors and texts == expected  # b2 never produced a token
    await wait_idle(worker[1])
    await call.write(pb.SessionRequest(generate=greedy("b2", max_tokens=3)))  # its id is free
    await read_until(call, {"b2"}, texts, errors)
    call.cancel()
    assert not errors and finished(texts, "b2")


class Recorder(pb_grpc.WorkerServicer):
    """A Session peer that records every message it reads and ends each generate at once; with
    ``batches``, it says it reads batches, as a worker does (without: a worker from before)."""

    def __init__(self, batches: bool) -> None:
        self.batches = batches
        self.messages: list[pb.SessionRequest] = []

    async def Session(self, requests: AsyncIterator[pb.SessionRequest], context: grpc.aio.ServicerContext) -> None:
        if self.batches:
            await context.send_initial_metadata(((SESSION_BATCH_HEADER, "1"),))
        async for msg in requests:
            self.messages.append(msg)
            done = [one.generate.request_id for one in (msg.batch or [msg]) if one.HasField("generate")]
            await context.write(pb.SessionResponse(deltas=[
                pb.GenerateResponse(request_id=rid, text=rid, finish_reason="stop") for rid in done]))


@pytest.mark.parametrize("batches", [True, False], ids=["worker-reads-batches", "worker-from-before"])
async def test_the_gateway_sends_a_burst_as_one_message_to_a_worker_that_reads_batches(batches: bool) -> None:
    recorder = Recorder(batches)
    server = grpc.aio.server()
    pb_grpc.add_WorkerServicer_to_server(recorder, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with insecure_channel(f"127.0.0.1:{port}") as channel:
            session = WorkerSession(pb_grpc.WorkerStub(channel), f"127.0.0.1:{port}")

            async def answer(stream: RequestStream) -> str:
                texts = []
                async with asyncio.timeout(TIMEOUT):
                    while (msg := await stream.next()) is not None:
                        texts.append(msg.text)
                return "".join(texts)

            assert await answer(session.start(greedy("first"), {}, TIMEOUT)) == "first"  # the session is up
            burst = [f"burst-{i}" for i in range(20)]
            streams = [session.start(greedy(rid), {}, TIMEOUT) for rid in burst]  # queued in one go
            assert [await answer(s) for s in streams] == burst
            await session.close()
    finally:
        await server.stop(0)
    later = recorder.messages[1:]
    if batches:
        assert [[one.generate.request_id for one in m.batch] for m in later] == [burst]
    else:
        assert [m.generate.request_id for m in later] == burst and not any(m.batch for m in later)


async def test_a_large_request_is_checked_and_tokenized_off_the_event_loop(
    stub: pb_grpc.WorkerStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long prompt is checked (and tokenized) in the worker's threads, a short one on the loop."""
    checked_on: list[bool] = []
    validate = validation.validate

    def recording(*args: object, **kwargs: object) -> None:
        checked_on.append(threading.current_thread() is threading.main_thread())
        validate(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(validation, "validate", recording)
    short = greedy("short", max_tokens=2)
    long = greedy("long", max_tokens=2, prompt="p" * OFFLOAD_CHARS)

    async def answer(request: pb.GenerateRequest) -> list[pb.GenerateResponse]:
        return [c async for c in stub.Generate(request)]

    async with asyncio.timeout(TIMEOUT):
        answers = await asyncio.gather(answer(short), answer(long))
    assert [a[-1].finish_reason for a in answers] == ["length", "length"]
    assert sorted(checked_on) == [False, True]


async def test_a_small_request_is_served_while_large_prompts_are_being_tokenized(
    stub: pb_grpc.WorkerStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three long prompts are held in the engine's tokenizer by the test; a short request sent
    after them is answered in full meanwhile, before any of them, which finish once let go. (A
    tokenizer on the event loop would hold the loop instead: nothing would be answered.)"""
    tokenizing = threading.Event()
    release = threading.Event()
    tokenize = sim_engine.sim_tokenize

    def held(text: str) -> list[int]:
        if len(text) >= OFFLOAD_CHARS:
            tokenizing.set()
            if not release.wait(TIMEOUT):
                raise RuntimeError("a long prompt was held past the test")
        return tokenize(text)

    monkeypatch.setattr(sim_engine, "sim_tokenize", held)
    finished: list[str] = []

    async def answer(request: pb.GenerateRequest) -> str:
        chunks = [c async for c in stub.Generate(request, timeout=TIMEOUT)]
        finished.append(request.request_id)
        return chunks[-1].finish_reason

    longs = [asyncio.create_task(answer(greedy(f"long{i}", max_tokens=2, prompt=f"{i} " + "p" * OFFLOAD_CHARS)))
             for i in range(3)]
    try:
        assert await asyncio.to_thread(tokenizing.wait, TIMEOUT)
        assert await answer(greedy("short", max_tokens=2)) == "length"
        assert finished == ["short"] and not any(task.done() for task in longs)
    finally:
        release.set()
    assert await asyncio.gather(*longs) == ["length"] * 3
    assert finished[0] == "short"
