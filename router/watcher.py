"""Keeps the router's WorkerTable and KV index current: one task per worker holds its WatchLoad
stream open and reconnects with capped exponential backoff when it breaks or goes silent. The same
stream carries the worker's KV events, which keep the index of the blocks it caches (a worker from
before they rode on it gets a second stream, WatchKvEvents).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging

import grpc

from meshserve.router.kv_index import KvIndex
from meshserve.router.prefix import PromptBlocks
from meshserve.router.state import LoraSlots, WorkerLoad, WorkerTable
from meshserve.services.config import RoutingConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.config import SERVICE_IDENTITIES
from meshserve.services.mesh_tls import MeshTls
from meshserve.services.server import mesh_channel

log = logging.getLogger(__name__)


# WorkerLoad mirrors LoadReport field for field (less worker_id); the conversions derive from it.
_LOAD_FIELDS = [f.name for f in dataclasses.fields(WorkerLoad)]
_REPEATED = ("active_adapters", "running_adapters", "waiting_adapters")  # repeated fields: made values of their own


def load_from_pb(report: pb.LoadReport) -> WorkerLoad:
    """The report as a value; counts a worker cannot have (negative, usage outside 0..1) are
    clamped, so one confused worker cannot steer every pick."""
    load = WorkerLoad(**{name: getattr(report, name) for name in _LOAD_FIELDS if name not in _REPEATED},
                      active_adapters=tuple(report.active_adapters), running_adapters=tuple(report.running_adapters),
                      waiting_adapters=tuple(report.waiting_adapters))
    if (min(load.num_running, load.num_waiting, load.num_in_flight) >= 0
            and 0.0 <= load.kv_cache_usage <= 1.0 and 0.0 <= load.prefix_cache_hit_rate <= 1.0):
        return load  # the usual case: nothing to clamp
    clamped = dataclasses.replace(
        load,
        num_running=max(0, load.num_running), num_waiting=max(0, load.num_waiting),
        num_in_flight=max(0, load.num_in_flight),
        kv_cache_usage=min(1.0, max(0.0, load.kv_cache_usage)),
        prefix_cache_hit_rate=min(1.0, max(0.0, load.prefix_cache_hit_rate)),
    )
    if clamped != load:
        log.warning("worker %s reported an impossible load (%s); clamped", report.worker_id, load)
    return clamped


def _is_flood(events: pb.KvEvents) -> bool:
    """So many KV events in one message that the picks waiting should go first."""
    return len(events.stored) + len(events.removed) > 1024


def load_to_pb(worker_id: str, load: WorkerLoad) -> pb.LoadReport:
    return pb.LoadReport(worker_id=worker_id, **dataclasses.asdict(load))


def lora_from_pb(info: pb.WorkerInfo | pb.LoadReport) -> LoraSlots | None:
    """The worker's LoRA adapters and slots as a value (None: LoRA off, or a report that does not say)."""
    if not info.HasField("lora"):
        return None
    lora = info.lora
    return LoraSlots(tuple((a.name, a.path) for a in lora.adapters), lora.max_loras, lora.max_lora_rank,
                     lora.max_cpu_loras)


def lora_to_pb(lora: LoraSlots) -> pb.LoraConfig:
    return pb.LoraConfig(adapters=[pb.LoraAdapter(name=name, path=path) for name, path in lora.adapters],
                         max_loras=lora.max_loras, max_lora_rank=lora.max_lora_rank, max_cpu_loras=lora.max_cpu_loras)


class Watcher:
    """Watches every worker of ``table``. A stream that ends, fails or sends nothing for
    ``lost_after_s`` marks its worker disconnected (so it is not picked) and is reopened; until
    then a silent worker is only late (the table's report age says so)."""

    def __init__(
        self,
        table: WorkerTable,
        stale_after_s: float,
        lost_after_s: float,
        initial_backoff_s: float = 0.1,
        max_backoff_s: float = 1.0,  # a worker restarted by the supervisor is seen within ~1 s of serving
        kv: KvIndex | None = None,
        prefix: PromptBlocks | None = None,
        fleet_reports_per_s: float = RoutingConfig.fleet_reports_per_s,
        tls: MeshTls | None = None,
    ) -> None:
        self._table = table
        self._tls = tls  # mutual TLS to the workers
        self._fleet_reports_per_s = fleet_reports_per_s
        self._kv = kv
        self._prefix = prefix
        self._stale_after_s = stale_after_s
        self._lost_after_s = lost_after_s
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._tasks: dict[str, asyncio.Task[None]] = {}  # by address
        self._configuring: set[asyncio.Task[None]] = set()  # the prompt view's tokenizer, loading

    def report_interval_s(self) -> float:
        """The shortest gap between two reports to ask each worker for: the fleet's reports stay
        under ``fleet_reports_per_s`` in all, and a worker stays fresh well within ``stale_after_s``."""
        return min(len(self._table.addresses()) / self._fleet_reports_per_s, self._stale_after_s / 4)

    def start(self) -> None:
        for address in self._table.addresses():
            self.add(address)

    def add(self, address: str) -> None:
        """Starts watching ``address`` (a worker of the table); nothing if it is watched already."""
        if address not in self._tasks:
            self._tasks[address] = asyncio.create_task(self._watch(address), name=f"watch {address}")

    async def remove(self, address: str) -> None:
        """Stops watching ``address``; once this returns its streams are closed, so nothing writes
        to the table for it again, and the KV index holds nothing for it."""
        task = self._tasks.pop(address, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def close(self) -> None:
        tasks, self._tasks = [*self._tasks.values(), *self._configuring], {}
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self, address: str) -> None:
        backoff = self._initial_backoff_s
        while True:
            try:
                async for _ in self._stream(address):
                    backoff = self._initial_backoff_s  # a report arrived: the connection works
                log.warning("worker %s ended its load stream; reconnecting", address)
            except (grpc.aio.AioRpcError, TimeoutError) as e:
                detail = e.details() if isinstance(e, grpc.aio.AioRpcError) else "no load report in time"
                log.warning("worker %s unreachable (%s); retrying in %.1fs", address, detail, backoff)
            except Exception:
                log.exception("watching worker %s failed; retrying in %.1fs", address, backoff)
            self._table.on_disconnected(address)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._max_backoff_s)

    async def _stream(self, address: str):  # -> AsyncIterator[None], one item per report
        async with mesh_channel(address, self._tls, SERVICE_IDENTITIES["worker"]) as channel:
            stub = pb_grpc.WorkerStub(channel)
            info = await stub.Info(pb.InfoRequest(), timeout=self._stale_after_s)
            if self._prefix is not None:  # meanwhile the worker's reports flow
                configuring = asyncio.create_task(
                    self._prefix.configure(info.tokenizer, info.block_size, info.model),
                    name=f"tokenizer of {address}")
                self._configuring.add(configuring)
                configuring.add_done_callback(self._configuring.discard)
            kv_events = self._kv is not None and info.kv_events
            kv_task = None
            try:
                first = True
                async for report in self._reports(stub, address, info, kv_events):
                    if kv_events and report.HasField("kv"):
                        self._apply_kv(address, report.kv)
                    elif kv_events and first:
                        # A worker from before KV events rode on the load stream (its first
                        # report has none): they come on a stream of their own.
                        kv_task = asyncio.create_task(self._watch_kv(stub, address), name=f"kv events {address}")
                    first = False
                    yield
            finally:
                if kv_task is not None:
                    kv_task.cancel()
                    await asyncio.gather(kv_task, return_exceptions=True)
                if kv_events:
                    assert self._kv is not None
                    self._kv.drop(address)  # the stream that said what it holds has ended

    def _apply_kv(self, address: str, events: pb.KvEvents) -> None:
        assert self._kv is not None
        if events.reset:
            self._kv.reset(address, events.stored)
        else:
            self._kv.stored(address, events.stored)
            self._kv.removed(address, events.removed)

    async def _watch_kv(self, stub: pb_grpc.WorkerStub, address: str) -> None:
        """Applies an older worker's KV events (their own stream) to the index while its load
        stream is open; whenever this stream is not open, the index holds nothing for it."""
        assert self._kv is not None
        backoff = self._initial_backoff_s
        while True:
            try:
                async for batch in stub.WatchKvEvents(pb.WatchKvEventsRequest()):
                    backoff = self._initial_backoff_s
                    self._apply_kv(address, batch)
                    if _is_flood(batch):
                        await asyncio.sleep(0)  # a flood of events waits for the picks
                log.info("worker %s ended its KV-event stream (draining)", address)
                return
            except grpc.aio.AioRpcError as e:
                log.warning("KV events of worker %s: %s; retrying in %.1fs", address, e.details(), backoff)
            finally:
                self._kv.drop(address)  # also when cancelled: its load stream ended
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._max_backoff_s)

    async def _reports(self, stub: pb_grpc.WorkerStub, address: str, info: pb.WorkerInfo, kv_events: bool):
        """The reports of the worker's WatchLoad stream (with its KV events if ``kv_events``)."""
        call = stub.WatchLoad(pb.WatchLoadRequest(kv_events=kv_events, min_interval_s=self.report_interval_s()))
        first = True
        while True:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that arrives with a report, and close() would wait forever.
            async with asyncio.timeout(self._lost_after_s):
                report = await call.read()
            if report is grpc.aio.EOF:
                return
            if first:
                first = False
                self._table.on_connected(address, info.worker_id or report.worker_id, info.weights_id,
                                         info.max_model_len, info.model, lora_from_pb(info))
                log.info("worker %s (%s) connected: %s engine", info.worker_id, address, info.engine)
            self._table.on_report(address, load_from_pb(report))
            if (lora := lora_from_pb(report)) is not None:  # adapters loaded or unloaded at run time
                self._table.on_lora(address, lora)
            yield report
            if _is_flood(report.kv):
                await asyncio.sleep(0)  # a flood of events waits for the picks
