"""The router's gRPC server on port 0 against fake workers: in-process gRPC servers implementing
the real Worker service, whose load reports the tests control."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import grpc
import prometheus_client
import pytest

from meshserve.router.server import start_router
from meshserve.services.config import RouterConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import Running, insecure_channel


class FakeWorker(pb_grpc.WorkerServicer):
    """A worker with no engine: WatchLoad sends the current report now and on every change."""

    def __init__(self, worker_id: str, interval_s: float | None = None, host: str = "127.0.0.1") -> None:
        self.worker_id = worker_id
        self.host = host  # discovery tests give workers of one slice their own loopback address
        self.port = 0
        self.interval_s = interval_s  # also repeat the report this often, as real workers do
        self.frozen = False           # keep streams open but send nothing (a hung worker)
        self.streams = 0              # WatchLoad streams opened
        self.asked_interval_s: list[float] = []  # each stream's WatchLoadRequest.min_interval_s
        self.weights_id = f"weights-of-{worker_id}"
        self._report = pb.LoadReport(worker_id=worker_id, max_num_seqs=256, sequence=1)
        self._changed = asyncio.Condition()
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        self._server = grpc.aio.server()
        pb_grpc.add_WorkerServicer_to_server(self, self._server)
        self.port = self._server.add_insecure_port(f"{self.host}:{self.port}")  # the same port on a restart
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(0)
            self._server = None

    async def set_load(self, **fields: object) -> int:
        """Publishes a new report; returns its sequence number."""
        async with self._changed:
            sequence = self._report.sequence + 1
            self._report = pb.LoadReport(
                worker_id=self.worker_id, max_num_seqs=256, sequence=sequence, **fields
            )
            self._changed.notify_all()
        return sequence

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.WorkerInfo:
        return pb.WorkerInfo(worker_id=self.worker_id, engine="fake", max_num_seqs=256, weights_id=self.weights_id)

    async def WatchLoad(
        self, request: pb.WatchLoadRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.LoadReport]:
        self.streams += 1
        self.asked_interval_s.append(request.min_interval_s)
        sent = 0
        while True:
            async with self._changed:
                try:
                    await asyncio.wait_for(
                        self._changed.wait_for(lambda: not self.frozen and self._report.sequence != sent),
                        self.interval_s,
                    )
                except TimeoutError:
                    if self.frozen:
                        continue
                report = self._report
            sent = report.sequence
            yield report


Mesh = tuple[pb_grpc.RouterStub, list[FakeWorker]]
StartMesh = Callable[..., Awaitable[Mesh]]


@pytest.fixture
async def start_mesh() -> AsyncIterator[StartMesh]:
    workers: list[FakeWorker] = []
    routers: list[Running] = []
    channels: list[grpc.aio.Channel] = []

    async def start(
        n: int,
        extra_addresses: Sequence[str] = (),
        stale_after_s: float = 30.0,
        interval_s: float | None = None,
        lost_after_s: float = 60.0,
        routing: str = "least-load",  # most tests here are about the load view
        load_bound: float = 1.25,
        fleet_reports_per_s: float = RouterConfig.fleet_reports_per_s,
    ) -> Mesh:
        for i in range(n):
            worker = FakeWorker(f"w{i}", interval_s)
            await worker.start()
            workers.append(worker)
        cfg = RouterConfig(
            port=0, metrics_port=-1, grace_seconds=0.5, stale_after_s=stale_after_s, lost_after_s=lost_after_s,
            routing=routing, load_bound=load_bound, fleet_reports_per_s=fleet_reports_per_s,
            workers=[*(x.address for x in workers), *extra_addresses],
        )
        routers.append(await start_router(cfg))
        channels.append(insecure_channel(f"127.0.0.1:{routers[-1].port}"))
        return pb_grpc.RouterStub(channels[-1]), workers

    yield start
    for channel in channels:
        await channel.close()
    for running in routers:
        await running.shutdown()
    for worker in workers:
        await worker.stop()
    leaked = [t for t in asyncio.all_tasks() if t.get_name().startswith("watch ")]
    assert not leaked, f"watcher tasks left running: {leaked}"


async def wait_for_workers(
    stub: pb_grpc.RouterStub, condition: Callable[[dict[str, pb.WorkerState]], bool], timeout: float = 5.0
) -> dict[str, pb.WorkerState]:
    """Polls ListWorkers until ``condition`` holds on the workers by id; fails after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        workers = {x.worker_id: x for x in (await stub.ListWorkers(pb.ListWorkersRequest())).workers}
        if condition(workers):
            return workers
        if loop.time() > deadline:
            pytest.fail(f"router never reached the expected state; workers: {workers}")
        await asyncio.sleep(0.02)


def healthy_with(sequences: dict[str, int]) -> Callable[[dict[str, pb.WorkerState]], bool]:
    """Every named worker is healthy and has reported at least the given sequence."""
    return lambda ws: all(
        k in ws and ws[k].healthy and ws[k].load.sequence >= seq for k, seq in sequences.items()
    )


async def pick(stub: pb_grpc.RouterStub, *exclude: str, prompt: str = "hello") -> pb.PickResponse:
    return await stub.Pick(pb.PickRequest(request_id="t", prompt=prompt, exclude=exclude), timeout=5)


def picks_metric(worker: str, reason: str) -> float:
    value = prometheus_client.REGISTRY.get_sample_value(
        "meshserve_router_picks_total", {"worker": worker, "reason": reason}
    )
    return value or 0.0


async def test_picks_go_to_the_least_loaded_worker(start_mesh: StartMesh) -> None:
    stub, workers = await start_mesh(3)
    seqs = {w.worker_id: await w.set_load(num_running=r) for w, r in zip(workers, (5, 1, 3))}
    await wait_for_workers(stub, healthy_with(seqs))
    before = picks_metric("w1", "least-load")

    reply = await pick(stub)
    assert (reply.worker_id, reply.address) == ("w1", workers[1].address)
    assert "least-load" in reply.reason
    assert picks_metric("w1", "least-load") == before + 1

    # w1 draining: the next least loaded takes over.
    seqs["w1"] = await workers[1].set_load(num_running=0, draining=True)
    await wait_for_workers(stub, healthy_with(seqs))
    assert (await pick(stub)).worker_id == "w2"


async def test_the_list_says_which_weights_each_worker_serves(start_mesh: StartMesh) -> None:
    # What the gateways key cache entries by; a worker restarted on new weights says so again.
    stub, (w0, w1) = await start_mesh(2)
    listed = await wait_for_workers(stub, lambda ws: len(ws) == 2 and all(w.healthy for w in ws.values()))
    assert {w: s.weights_id for w, s in listed.items()} == {"w0": "weights-of-w0", "w1": "weights-of-w1"}
    await w1.stop()
    await wait_for_workers(stub, lambda ws: not ws["w1"].healthy)
    w1.weights_id = "new"
    await w1.start()
    await wait_for_workers(stub, lambda ws: ws["w1"].healthy and ws["w1"].weights_id == "new")


async def test_a_burst_spreads_across_workers_before_they_report(start_mesh: StartMesh) -> None:
    stub, workers = await start_mesh(3)
    await wait_for_workers(stub, healthy_with({w.worker_id: 1 for w in workers}))

    burst = Counter([(await pick(stub)).worker_id for _ in range(6)])
    assert burst == {"w0": 2, "w1": 2, "w2": 2}
    state = await wait_for_workers(stub, lambda ws: len(ws) == 3)
    assert {k: v.assigned_unreported for k, v in state.items()} == {"w0": 2, "w1": 2, "w2": 2}

    # A w0 report that does not show the picks arrived leaves them counted ...
    seq = await workers[0].set_load(num_running=0)
    state = await wait_for_workers(stub, healthy_with({"w0": seq}))
    assert state["w0"].assigned_unreported == 2
    # ... and one that does settles them, so the router stops counting them itself.
    seq = await workers[0].set_load(num_running=2, requests_received=2)
    state = await wait_for_workers(stub, healthy_with({"w0": seq}))
    assert state["w0"].assigned_unreported == 0 and state["w1"].assigned_unreported == 2


async def test_a_stopped_worker_is_not_picked_until_it_comes_back(start_mesh: StartMesh) -> None:
    stub, workers = await start_mesh(2)
    await wait_for_workers(stub, healthy_with({"w0": 1, "w1": 1}))

    await workers[0].stop()
    await wait_for_workers(stub, lambda ws: not ws["w0"].healthy and ws["w1"].healthy)
    assert {(await pick(stub)).worker_id for _ in range(10)} == {"w1"}

    await workers[0].start()  # same port: the watcher reconnects with backoff
    await wait_for_workers(stub, lambda ws: ws["w0"].healthy)
    seq = await workers[1].set_load(num_running=50)
    await wait_for_workers(stub, healthy_with({"w1": seq}))
    assert (await pick(stub)).worker_id == "w0"


async def test_a_silent_worker_goes_stale(start_mesh: StartMesh) -> None:
    stub, workers = await start_mesh(2, stale_after_s=0.5, interval_s=0.05)
    await wait_for_workers(stub, healthy_with({"w0": 1, "w1": 1}))
    workers[0].frozen = True  # its stream stays open, but no report comes
    await wait_for_workers(stub, lambda ws: not ws["w0"].healthy and ws["w1"].healthy)
    assert {(await pick(stub)).worker_id for _ in range(5)} == {"w1"}
    workers[0].frozen = False  # reports again, on the same stream
    await wait_for_workers(stub, lambda ws: ws["w0"].healthy)


async def test_a_late_worker_is_the_last_resort_until_it_is_lost(start_mesh: StartMesh) -> None:
    stub, workers = await start_mesh(1, stale_after_s=0.2, interval_s=0.05, lost_after_s=30.0)
    await wait_for_workers(stub, healthy_with({"w0": 1}))
    before = picks_metric("w0", "late")
    workers[0].frozen = True  # too busy to report, stream still open
    await wait_for_workers(stub, lambda ws: not ws["w0"].healthy)
    reply = await pick(stub)  # better a late worker than refusing everyone
    assert reply.worker_id == "w0" and reply.reason.startswith("late")
    assert picks_metric("w0", "late") == before + 1
    workers[0].frozen = False
    await wait_for_workers(stub, lambda ws: ws["w0"].healthy)
    assert not (await pick(stub)).reason.startswith("late")


async def test_a_worker_silent_past_lost_after_is_not_picked(start_mesh: StartMesh) -> None:
    stub, workers = await start_mesh(1, stale_after_s=0.1, interval_s=0.05, lost_after_s=0.3)
    await wait_for_workers(stub, healthy_with({"w0": 1}))
    workers[0].frozen = True
    # The watcher gives the stream up and reopens it; with no report on the new one the worker
    # counts as disconnected, and nobody is picked.
    async def refused() -> grpc.aio.AioRpcError:
        while True:
            try:
                await pick(stub)
            except grpc.aio.AioRpcError as e:
                return e
            await asyncio.sleep(0.05)  # polling the router's state; bounded by wait_for

    err = await asyncio.wait_for(refused(), 5.0)
    assert err.code() == grpc.StatusCode.UNAVAILABLE and err.details() == "no healthy worker"
    workers[0].frozen = False
    await wait_for_workers(stub, lambda ws: ws["w0"].healthy)
    assert (await pick(stub)).worker_id == "w0"


async def test_a_worker_that_keeps_reporting_keeps_its_stream(start_mesh: StartMesh) -> None:
    """The watcher's silence timer moves on with the reports: a worker that reports every 50 ms
    is never given up on, however long past lost_after_s its stream lives."""
    stub, workers = await start_mesh(1, stale_after_s=0.1, interval_s=0.05, lost_after_s=0.3)
    await wait_for_workers(stub, healthy_with({"w0": 1}))
    loop = asyncio.get_running_loop()
    started, n = loop.time(), 0
    while loop.time() - started < 1.2:  # four times lost_after_s, each change seen by the router
        n += 1
        await wait_for_workers(stub, healthy_with({"w0": await workers[0].set_load(num_running=n)}))
    assert workers[0].streams == 1


@pytest.mark.parametrize(("rate", "stale_after_s", "asked"), [
    (RouterConfig.fleet_reports_per_s, 30.0, 0.004),  # a small fleet: the workers' own rate (0.004 < 0.05)
    (10.0, 30.0, 0.4),   # 4 workers, 10 reports a second in all: one each every 0.4 s
    (1.0, 0.8, 0.2),     # never past a quarter of stale_after_s, or they would look late
])
async def test_the_router_asks_a_large_fleet_for_fewer_reports(
    start_mesh: StartMesh, rate: float, stale_after_s: float, asked: float
) -> None:
    stub, workers = await start_mesh(4, fleet_reports_per_s=rate, stale_after_s=stale_after_s)
    await wait_for_workers(stub, healthy_with({w.worker_id: 1 for w in workers}))
    assert [w.asked_interval_s for w in workers] == [[pytest.approx(asked)]] * 4


async def test_exclude_is_honoured_and_excluding_everyone_is_unavailable(start_mesh: StartMesh) -> None:
    stub, workers = await start_mesh(3)
    seqs = {w.worker_id: await w.set_load(num_running=r) for w, r in zip(workers, (0, 4, 8))}
    await wait_for_workers(stub, healthy_with(seqs))
    before = picks_metric("w1", "retry")

    assert (await pick(stub, "w0")).worker_id == "w1"
    assert picks_metric("w1", "retry") == before + 1
    assert (await pick(stub, "w0", "w1")).worker_id == "w2"
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await pick(stub, "w0", "w1", "w2")
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "excluded" in (err.value.details() or "")


async def test_no_reachable_worker_is_unavailable(start_mesh: StartMesh) -> None:
    from tests.conftest import free_port

    stub, _ = await start_mesh(0, extra_addresses=[f"127.0.0.1:{free_port()}"])
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await pick(stub)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert err.value.details() == "no healthy worker"
    (state,) = (await stub.ListWorkers(pb.ListWorkersRequest())).workers
    assert not state.healthy


async def test_a_router_without_workers_is_unavailable(start_mesh: StartMesh) -> None:
    stub, _ = await start_mesh(0)
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await pick(stub)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "no healthy worker" in (err.value.details() or "")


async def test_a_batch_of_picks_is_answered_by_one_message_in_order(start_mesh: StartMesh) -> None:
    stub, workers = await start_mesh(3)
    await wait_for_workers(stub, healthy_with({w.worker_id: 1 for w in workers}))
    call = stub.PickBatches()
    first = [pb.PickRequest(request_id=f"r{i}", prompt="hello", pick_id=10 + i) for i in range(6)]
    second = [pb.PickRequest(request_id="r6", exclude=["w0", "w1", "w2"], pick_id=16),
              pb.PickRequest(request_id="r7", prompt="hello", pick_id=17)]
    await call.write(pb.PickBatch(picks=first))
    await call.write(pb.PickBatch(picks=second))
    await call.done_writing()
    async with asyncio.timeout(5):
        replies = [r async for r in call]
    assert [[a.pick_id for a in r.answers] for r in replies] == [[10, 11, 12, 13, 14, 15], [16, 17]]
    # Counted against the workers as they are made: the batch spreads before any report.
    assert Counter(a.worker_id for a in replies[0].answers) == {"w0": 2, "w1": 2, "w2": 2}
    refused, after = replies[1].answers
    assert refused.error_code == grpc.StatusCode.UNAVAILABLE.value[0] and "excluded" in refused.error_message
    assert after.worker_id and not after.error_code  # a refusal in a batch leaves the rest answered


async def test_a_pick_stream_closed_by_the_gateway_gets_every_answer_first(start_mesh: StartMesh) -> None:
    """The answers to picks made before the gateway stopped asking still go out, then the
    stream ends; a stream that is cancelled leaves the router answering others."""
    stub, workers = await start_mesh(2)
    await wait_for_workers(stub, healthy_with({w.worker_id: 1 for w in workers}))
    call = stub.Picks()
    for i in range(5):
        await call.write(pb.PickRequest(request_id=f"r{i}", prompt="hello", pick_id=i))
    await call.done_writing()
    async with asyncio.timeout(5):
        answers = [a async for a in call]
    assert [a.pick_id for a in answers] == [0, 1, 2, 3, 4]
    assert all(a.worker_id for a in answers)
    assert await call.code() == grpc.StatusCode.OK
    gone = stub.Picks()
    await gone.write(pb.PickRequest(request_id="gone", prompt="hello", pick_id=9))
    gone.cancel()
    assert (await pick(stub)).worker_id in {w.worker_id for w in workers}


async def test_picks_on_one_stream_answer_in_order_like_pick_calls(start_mesh: StartMesh) -> None:
    stub, workers = await start_mesh(3)
    await wait_for_workers(stub, healthy_with({w.worker_id: 1 for w in workers}))
    call = stub.Picks()
    requests = [pb.PickRequest(request_id=f"r{i}", prompt="hello", pick_id=100 + i) for i in range(6)]
    requests.append(pb.PickRequest(request_id="r6", exclude=["w0", "w1", "w2"], pick_id=106))
    for request in requests:
        await call.write(request)
    async with asyncio.timeout(5):
        answers = [await call.read() for _ in requests]
    call.cancel()

    assert [a.pick_id for a in answers] == [r.pick_id for r in requests]
    # Counted against the workers like Pick calls: a burst spreads before any report.
    assert Counter(a.worker_id for a in answers[:6]) == {"w0": 2, "w1": 2, "w2": 2}
    assert all(a.address and not a.error_code for a in answers[:6])
    refused = answers[6]
    assert refused.error_code == grpc.StatusCode.UNAVAILABLE.value[0] and not refused.worker_id
    assert "excluded" in refused.error_message
    state = await wait_for_workers(stub, lambda ws: len(ws) == 3)
    assert {k: v.assigned_unreported for k, v in state.items()} == {"w0": 2, "w1": 2, "w2": 2}


async def test_prefix_affinity_keeps_a_conversation_together_and_spreads_conversations(
    start_mesh: StartMesh,
) -> None:
    """Conversations that open with one system prompt: each one's turns meet on one worker (its
    history is cached there), and the conversations do not all meet on one worker."""
    stub, workers = await start_mesh(4, routing="prefix-affinity", load_bound=100.0)  # affinity alone
    await wait_for_workers(stub, healthy_with({w.worker_id: 0 for w in workers}))
    system = pb.ChatMessage(role="system", content="You are a helpful assistant who answers briefly. " * 8)
    homes = set()
    for i in range(12):
        first = [system, pb.ChatMessage(role="user", content=f"Question {i}: what is {i} squared?")]
        second = [*first, pb.ChatMessage(role="assistant", content=f"{i * i}."),
                  pb.ChatMessage(role="user", content="And its cube?")]
        turns = [await stub.Pick(pb.PickRequest(request_id=f"c{i}-t{t}", messages=m), timeout=5)
                 for t, m in enumerate((first, second))]
        assert turns[0].worker_id == turns[1].worker_id
        homes.add(turns[0].worker_id)
    assert len(homes) >= 2
