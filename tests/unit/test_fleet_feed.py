"""The router's fleet view, pushed (router.fleet_feed): the whole view when a watcher starts, at
once when the fleet's shape changes, a change of load alone at most once per interval, and a
worker that turns stale by the clock alone within the check interval."""

from __future__ import annotations

import asyncio
from contextlib import aclosing

from meshserve.router.fleet_feed import FleetFeed
from meshserve.router.state import WorkerLoad, WorkerTable
from meshserve.services.gen import meshserve_pb2 as pb

STALE_AFTER_S = 2.0


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


def feed_of(table: WorkerTable, clock: Clock, load_interval_s: float = 60.0) -> FleetFeed:
    def workers() -> list:
        now = table.now()
        return [(v, v.is_healthy(STALE_AFTER_S, now)) for v in table.snapshot()]

    return FleetFeed(table, workers, load_interval_s=load_interval_s, check_s=0.01, clock=clock)


async def next_view(updates, timeout_s: float = 2.0) -> pb.FleetUpdate:  # noqa: ANN001
    async with asyncio.timeout(timeout_s):
        return await anext(updates)


def healthy(update: pb.FleetUpdate) -> dict[str, bool]:
    return {w.worker_id: w.healthy for w in update.workers}


async def test_a_watcher_gets_the_view_then_each_change_of_shape_at_once() -> None:
    clock = Clock()
    table = WorkerTable(["a:1"], clock=clock)
    async with aclosing(feed_of(table, clock).updates()) as updates:
        assert healthy(await next_view(updates)) == {"a:1": False}  # known, not connected yet
        table.on_connected("a:1", "a", weights_id="w1", max_model_len=2048)
        table.on_report("a:1", WorkerLoad(num_running=1))
        view = await next_view(updates)
        assert healthy(view) == {"a": True}
        assert (view.workers[0].weights_id, view.workers[0].max_model_len) == ("w1", 2048)
        table.add("b:1")
        assert set(healthy(await next_view(updates))) == {"a", "b:1"}
        table.on_report("a:1", WorkerLoad(num_running=1, draining=True))
        assert (await next_view(updates)).workers[0].load.draining


async def test_load_alone_is_pushed_at_most_once_per_interval() -> None:
    clock = Clock()
    table = WorkerTable(["a:1"], clock=clock)
    table.on_connected("a:1", "a")
    table.on_report("a:1", WorkerLoad(num_running=1))
    async with aclosing(feed_of(table, clock, load_interval_s=1.0).updates()) as updates:
        await next_view(updates)
        table.on_report("a:1", WorkerLoad(num_running=7))
        pending = asyncio.ensure_future(next_view(updates))
        await asyncio.sleep(0.05)
        assert not pending.done()  # the same shape: not yet
        clock.now += 1.0
        assert (await pending).workers[0].load.num_running == 7


async def test_a_worker_that_stops_reporting_is_pushed_as_unhealthy() -> None:
    clock = Clock()
    table = WorkerTable(["a:1"], clock=clock)
    table.on_connected("a:1", "a")
    table.on_report("a:1", WorkerLoad())
    async with aclosing(feed_of(table, clock).updates()) as updates:
        assert healthy(await next_view(updates)) == {"a": True}
        clock.now += STALE_AFTER_S + 0.1  # no report since: stale, with no event to say so
        assert healthy(await next_view(updates)) == {"a": False}


async def test_a_workers_model_and_adapters_are_in_the_view_and_a_change_of_them_is_pushed_at_once() -> None:
    from meshserve.router.state import LoraSlots

    clock = Clock()
    table = WorkerTable(["a:1"], clock=clock)
    table.on_connected("a:1", "a", model="base")
    table.on_report("a:1", WorkerLoad())
    async with aclosing(feed_of(table, clock).updates()) as updates:
        first = (await next_view(updates)).workers[0]
        assert first.model == "base" and not first.HasField("lora")
        table.on_connected("a:1", "a", model="base", lora=LoraSlots((("support", "/a/support"),), 2, 8, 4))
        table.on_report("a:1", WorkerLoad())
        lora = (await next_view(updates)).workers[0].lora  # the load is the same: the adapters are news
        assert [(a.name, a.path) for a in lora.adapters] == [("support", "/a/support")]
        assert (lora.max_loras, lora.max_lora_rank, lora.max_cpu_loras) == (2, 8, 4)
