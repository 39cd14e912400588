"""The gateway's one view of the fleet (gateway.fleet), as the router pushes it: the weights it
serves, its only worker when it has one, the workers that serve, and a stream that breaks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from meshserve.gateway import fleet as fleet_module
from meshserve.gateway.fleet import FleetView, Target
from meshserve.services.gen import meshserve_pb2 as pb
from tests.integration.helpers import until

WAIT_S = 5.0


def worker(worker_id: str, weights: str = "", healthy: bool = True, draining: bool = False,
           max_model_len: int = 0, model: str = "") -> pb.WorkerState:
    return pb.WorkerState(worker_id=worker_id, address=f"{worker_id}:1", weights_id=weights, healthy=healthy,
                          load=pb.LoadReport(draining=draining), max_model_len=max_model_len, model=model)


class Router:
    """Pushes the views put in ``views`` on each stream; ``fail()`` breaks the open stream as an
    unreachable router does (the next watch gets the views put after)."""

    def __init__(self) -> None:
        self.views: asyncio.Queue[pb.FleetUpdate | None] = asyncio.Queue()
        self.watches = 0

    def push(self, *workers: pb.WorkerState) -> None:
        self.views.put_nowait(pb.FleetUpdate(workers=workers))

    def fail(self) -> None:
        self.views.put_nowait(None)

    async def watch(self) -> AsyncIterator[pb.FleetUpdate]:
        self.watches += 1
        while (view := await self.views.get()) is not None:
            yield view
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")


@pytest.fixture
async def router() -> AsyncIterator[Router]:
    yield Router()


async def started(router: Router, model: str = "") -> FleetView:
    view = FleetView(router.watch, backoff_s=(0.001, 0.001), model=model)
    view.start()
    return view


async def seen(view: FleetView, n: int) -> None:
    await until(lambda: asyncio.sleep(0, len(view.workers) == n), f"a view of {n} workers", WAIT_S)


@pytest.mark.parametrize(("workers", "serving"), [
    ([worker("a", "w1"), worker("b", "w2"), worker("c", "w2")], "w2"),   # the most workers'
    ([worker("a", "w2"), worker("b", "w1")], "w1"),                       # a tie: the first
    ([worker("a", "w1", healthy=False), worker("b", "w2")], "w2"),        # the healthy ones only
    ([worker("a")], ""),                                                  # workers that give none
    ([worker("a", "w1", healthy=False)], None),                           # no healthy worker
    ([], None),
])
async def test_the_fleet_serves_the_weights_of_most_healthy_workers(
    router: Router, workers: list[pb.WorkerState], serving: str | None
) -> None:
    router.push(*workers)
    view = await started(router)
    try:
        assert await view.serving() == serving
    finally:
        await view.close()


async def test_the_first_request_waits_for_the_first_view_then_each_pushed_view_replaces_it(
    router: Router
) -> None:
    view = await started(router)
    try:
        asking = asyncio.ensure_future(view.serving())
        await asyncio.sleep(0)
        assert not asking.done()  # no view yet: the first cacheable request waits for one
        router.push(worker("a", "w1"))
        assert await asking == "w1"
        router.push(worker("a", "w2"), worker("b", "w2"))
        await seen(view, 2)
        assert await view.serving() == "w2" and router.watches == 1  # pushed, never asked for
    finally:
        await view.close()


async def test_without_any_view_the_wait_is_bounded(router: Router, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet_module, "FIRST_VIEW_S", 0.01)
    view = await started(router)
    try:
        assert await view.serving() is None  # requests are not cached, not held up
    finally:
        await view.close()


async def test_a_broken_stream_keeps_the_last_view_and_is_reopened(router: Router) -> None:
    router.push(worker("a", "w1"), worker("b", "w1"))
    view = await started(router)
    try:
        await seen(view, 2)
        assert view.live
        router.fail()
        await until(lambda: asyncio.sleep(0, router.watches == 2), "the stream reopened", WAIT_S)
        assert not view.live and await view.serving() == "w1" and len(view.serving_workers()) == 2
        router.push(worker("a", "w2"))
        await seen(view, 1)
        assert view.live and await view.serving() == "w2"
    finally:
        await view.close()


async def test_a_worker_newer_than_the_view_is_looked_up_in_the_next(
    router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    router.push(worker("a", "w1"))
    view = await started(router)
    try:
        assert await view.weights_of("a") == "w1"
        asking = asyncio.ensure_future(view.weights_of("b"))
        await asyncio.sleep(0)
        assert not asking.done()
        router.push(worker("a", "w1"), worker("b", "w2"))
        assert await asking == "w2"
        monkeypatch.setattr(fleet_module, "NEWER_VIEW_S", 0.01)
        assert await view.weights_of("gone") is None
    finally:
        await view.close()


async def test_the_only_worker_is_named_while_it_is_the_only_one_serving(router: Router) -> None:
    view = await started(router)
    try:
        assert view.sole() is None  # nothing seen yet
        for workers, sole in [
            ([worker("a")], "a"),
            ([worker("a"), worker("b")], None),                  # two to choose from
            ([worker("a", draining=True)], None),
            ([worker("a", healthy=False)], None),
            ([worker("a", max_model_len=2048)], "a"),
            ([], None),
        ]:
            router.push(*workers)
            await seen(view, len(workers))
            assert (view.sole().worker_id if view.sole() else None) == sole, workers
    finally:
        await view.close()


async def test_the_serving_workers_and_the_context_length_come_from_the_view(router: Router) -> None:
    router.push(worker("a", max_model_len=4096), worker("b", draining=True), worker("c", healthy=False),
                worker("d", max_model_len=4096))
    view = await started(router)
    try:
        await seen(view, 4)
        assert [w.worker_id for w in view.serving_workers()] == ["a", "d"]
        assert [w.worker_id for w in view.serving_workers(exclude=["a"])] == ["d"]
        assert view.max_model_len() == 4096
    finally:
        await view.close()


def holding(state: pb.WorkerState, *adapters: str) -> pb.WorkerState:
    state.lora.CopyFrom(pb.LoraConfig(adapters=[pb.LoraAdapter(name=a, path=f"/{state.worker_id}/{a}")
                                                for a in adapters], max_loras=1))
    return state


async def test_the_adapters_come_from_every_worker_of_the_view_and_choose_the_workers(router: Router) -> None:
    router.push(worker("a"), holding(worker("b"), "x", "y"), holding(worker("c", healthy=False), "y", "z"))
    view = await started(router)
    try:
        await seen(view, 3)
        # Every worker's, serving now or not (one that is not is a refusal to come, not an unknown name).
        assert view.adapters() == {"x": "/b/x", "y": "/b/y", "z": "/c/z"}
        assert [w.worker_id for w in view.serving_workers(target=Target(adapter="y"))] == ["b"]
        assert [w.worker_id for w in view.serving_workers(target=Target(adapter="z"))] == []
        assert [w.worker_id for w in view.serving_workers()] == ["a", "b"]
        router.push(holding(worker("b"), "x"))
        await seen(view, 1)
        assert view.sole(Target(adapter="x")).worker_id == "b" and view.sole().worker_id == "b"
        assert view.sole(Target(adapter="y")) is None
    finally:
        await view.close()


async def test_one_base_model_goes_by_the_gateways_name_whatever_its_workers_call_it(router: Router) -> None:
    router.push(worker("a", model="/models/tiny"), holding(worker("b", model="/models/tiny"), "x"))
    view = await started(router, model="tiny")
    try:
        await seen(view, 2)
        assert view.models() == ["tiny"] and view.parent("x") == "tiny"
        # No filter on the base model: every worker serves it.
        assert view.target("") == view.target("tiny") == Target() and view.target("x") == Target(adapter="x")
        assert view.target("/models/tiny") is None and view.target("other") is None
    finally:
        await view.close()


async def test_several_base_models_each_choose_their_own_workers_weights_and_length(router: Router) -> None:
    router.push(worker("a", "wa", model="m1", max_model_len=2048),
                holding(worker("b", "wb", model="m2", max_model_len=1024), "x"),
                worker("c", "wb", model="m2"), worker("d", "wa2", model="m1", healthy=False))
    view = await started(router, model="m2")
    try:
        await seen(view, 4)
        assert view.models() == ["m2", "m1"]  # the gateway's --model first: the default
        assert view.parent("x") == "m2"
        assert view.target("") == view.target("m2") == Target("m2")
        assert view.target("m1") == Target("m1") and view.target("x") == Target("m2", "x")
        assert view.target("m3") is None
        assert [w.worker_id for w in view.serving_workers(target=Target("m1"))] == ["a"]
        assert [w.worker_id for w in view.serving_workers(target=Target("m2"))] == ["b", "c"]
        assert [w.worker_id for w in view.serving_workers(target=Target("m1", "x"))] == []
        assert (await view.serving("m1"), await view.serving("m2")) == ("wa", "wb")
        assert (view.max_model_len("m1"), view.max_model_len("m2")) == (2048, 1024)
        router.push(worker("a", "wa", model="m1"))
        await seen(view, 1)
        assert view.sole(Target("m1")).worker_id == "a" and view.sole(Target("m2")) is None
    finally:
        await view.close()


async def test_a_default_model_no_worker_serves_is_the_first_listed(router: Router) -> None:
    router.push(worker("a", model="m1"), worker("b", model="m2"))
    view = await started(router, model="tiny")
    try:
        await seen(view, 2)
        assert view.models() == ["m1", "m2"] and view.target("") == view.target("tiny") == Target("m1")
    finally:
        await view.close()
