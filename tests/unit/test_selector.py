"""The gateway's worker-selection stage: the router's pick, the fleet's only worker at once (the
router told after the request went), and while the router is away the workers the fleet view last
showed serving, the least busy first; a refusal from the router stays one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest

from prometheus_client import REGISTRY

from meshserve.gateway.errors import GatewayError
from meshserve.gateway.fleet import FleetView
from meshserve.gateway.picks import PickFailed, PickRefused
from meshserve.gateway.selector import SOLE_WORKER, WorkerSelector
from meshserve.services.gen import meshserve_pb2 as pb
from tests.integration.helpers import until


class Picks:
    """The router's picks: ``answer`` (a worker id), or ``failure`` raised."""

    def __init__(self) -> None:
        self.asked: list[pb.PickRequest] = []
        self.answer = "a"
        self.failure: PickFailed | None = None

    async def pick(self, request: pb.PickRequest, timeout_s: float) -> pb.PickResponse:
        self.asked.append(request)
        if self.failure is not None:
            raise self.failure
        return pb.PickResponse(worker_id=self.answer, address=f"{self.answer}:1", reason="kv-aware")

    async def close(self) -> None:
        pass


class Sessions:
    """What the selector asks of the gateway's sessions: which failed, how busy each is."""

    def __init__(self) -> None:
        self.failed_addresses: set[str] = set()
        self.busy: dict[str, int] = {}

    def failed(self, address: str) -> bool:
        return address in self.failed_addresses

    def in_flight(self, address: str) -> int:
        return self.busy.get(address, 0)


def sample(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


async def fleet_of(*ids: str) -> FleetView:
    update = pb.FleetUpdate(workers=[pb.WorkerState(worker_id=i, address=f"{i}:1", healthy=True) for i in ids])

    async def watch() -> AsyncIterator[pb.FleetUpdate]:
        yield update
        await asyncio.Event().wait()

    view = FleetView(watch)
    view.start()
    await view.first_view()
    return view


@pytest.fixture
async def parts() -> AsyncIterator[tuple[Picks, Sessions]]:
    yield Picks(), Sessions()


async def test_the_router_picks_when_there_is_a_choice(parts: tuple[Picks, Sessions]) -> None:
    picks, sessions = parts
    fleet = await fleet_of("a", "b")
    selector = WorkerSelector(picks, fleet, sessions)
    picks.answer = "b"
    pick = await selector.pick(pb.GenerateRequest(request_id="r", prompt="p"), exclude=["a"])
    assert pick.worker_id == "b" and [list(p.exclude) for p in picks.asked] == [["a"]]
    await fleet.close()


async def test_the_only_worker_takes_the_request_at_once_and_the_router_is_told_after(
    parts: tuple[Picks, Sessions]
) -> None:
    picks, sessions = parts
    fleet = await fleet_of("a")
    selector = WorkerSelector(picks, fleet, sessions)
    req = pb.GenerateRequest(request_id="r", prompt="p")
    pick = await selector.pick(req)
    assert (pick.worker_id, pick.reason) == ("a", SOLE_WORKER) and picks.asked == []
    selector.sent(pick, req)  # the request went: now the router hears of it, off its path
    await until(lambda: asyncio.sleep(0, len(picks.asked) == 1), "the router told")
    sessions.failed_addresses.add("a:1")  # a worker this gateway saw fail is asked about again
    assert (await selector.pick(req)).reason == "kv-aware"
    await selector.close()
    await fleet.close()


async def test_the_router_is_told_of_the_only_workers_request_on_a_registry_adapter_as_picked(
    parts: tuple[Picks, Sessions]
) -> None:
    """Told after the request went, the router hears what the pick was for: an adapter of the
    gateway's LoRA registry (``lora_path`` set), loadable, even once the view no longer shows the
    worker holding it."""
    picks, sessions = parts
    updates: asyncio.Queue[pb.FleetUpdate] = asyncio.Queue()

    def holding(*adapters: str) -> pb.FleetUpdate:
        lora = pb.LoraConfig(adapters=[pb.LoraAdapter(name=n, path=f"/registry/{n}") for n in adapters], max_loras=1)
        return pb.FleetUpdate(workers=[pb.WorkerState(worker_id="a", address="a:1", healthy=True, lora=lora)])

    async def watch() -> AsyncIterator[pb.FleetUpdate]:
        while True:
            yield await updates.get()

    fleet = FleetView(watch)
    fleet.start()
    updates.put_nowait(holding("faq"))
    await fleet.first_view()
    selector = WorkerSelector(picks, fleet, sessions)
    try:
        req = pb.GenerateRequest(request_id="r", prompt="hi", model="faq", lora_path="/registry/faq")
        pick = await selector.pick(req)
        assert (pick.worker_id, pick.reason) == ("a", SOLE_WORKER) and picks.asked == []
        updates.put_nowait(holding())  # the worker dropped it before the request was told
        assert await fleet.shows(lambda: not fleet.adapters(), 1.0)
        selector.sent(pick, req)
        await until(lambda: asyncio.sleep(0, len(picks.asked) == 1), "the router told", timeout=1.0)
        assert (picks.asked[0].adapter, picks.asked[0].adapter_loadable) == ("faq", True)
    finally:
        await selector.close()
        await fleet.close()


async def test_while_the_router_is_away_the_least_busy_serving_worker_is_picked(
    parts: tuple[Picks, Sessions]
) -> None:
    picks, sessions = parts
    fleet = await fleet_of("a", "b", "c")
    selector = WorkerSelector(picks, fleet, sessions)
    picks.failure = PickFailed(grpc.StatusCode.UNAVAILABLE, "connection refused")
    sessions.busy = {"a:1": 3, "b:1": 1, "c:1": 2}
    sessions.failed_addresses = {"b:1"}
    req = pb.GenerateRequest(request_id="r", prompt="p")
    assert (await selector.pick(req)).worker_id == "c"
    assert (await selector.pick(req, exclude=["c"])).worker_id == "a"
    with pytest.raises(GatewayError) as e:
        await selector.pick(req, exclude=["a", "c"])
    assert e.value.code == grpc.StatusCode.UNAVAILABLE and "router unavailable" in e.value.message
    assert selector.serving()[0] == 3  # the router's view, while it pushes one
    await fleet.close()


async def test_a_refusal_from_the_router_is_not_overridden(parts: tuple[Picks, Sessions]) -> None:
    picks, sessions = parts
    fleet = await fleet_of("a", "b")
    selector = WorkerSelector(picks, fleet, sessions)
    picks.failure = PickRefused(grpc.StatusCode.UNAVAILABLE, "no worker available")
    with pytest.raises(GatewayError) as e:
        await selector.pick(pb.GenerateRequest(request_id="r", prompt="p"))
    assert e.value.message == "router: no worker available"
    await fleet.close()


async def test_any_worker_is_one_that_serves(parts: tuple[Picks, Sessions]) -> None:
    picks, sessions = parts
    fleet = await fleet_of("a", "b")
    selector = WorkerSelector(picks, fleet, sessions)
    sessions.failed_addresses = {"a:1"}
    assert selector.any_worker() == "b:1"
    sessions.failed_addresses = {"a:1", "b:1"}
    with pytest.raises(GatewayError) as e:
        selector.any_worker()
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    await fleet.close()


@pytest.mark.parametrize("failure", [
    PickFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "no answer in 1s"),  # this gateway stopped waiting
    PickRefused(grpc.StatusCode.DEADLINE_EXCEEDED, "the pick's deadline had passed"),  # the router dropped it
], ids=["timed-out", "shed-by-the-router"])
async def test_a_late_pick_goes_to_the_fleet_view_at_once(parts: tuple[Picks, Sessions], failure: PickFailed) -> None:
    picks, sessions = parts
    fleet = await fleet_of("a", "b")
    selector = WorkerSelector(picks, fleet, sessions, timeout_s=0.5)
    picks.failure = failure
    sessions.busy = {"a:1": 2}
    late = sample("meshserve_gateway_late_picks_total")
    pick = await selector.pick(pb.GenerateRequest(request_id="r", prompt="p"))
    assert (pick.worker_id, pick.reason) == ("b", "fallback")
    assert sample("meshserve_gateway_late_picks_total") == late + 1
    deadline = picks.asked[0].deadline_unix_ms / 1000
    assert time.time() < deadline <= time.time() + 0.5  # the router is told when the gateway stops waiting
    await fleet.close()


async def test_a_request_on_an_adapter_goes_only_to_a_worker_that_serves_it(parts: tuple[Picks, Sessions]) -> None:
    picks, sessions = parts
    lora = pb.LoraConfig(adapters=[pb.LoraAdapter(name="support", path="/a/support")], max_loras=1)
    update = pb.FleetUpdate(workers=[pb.WorkerState(worker_id="a", address="a:1", healthy=True),
                                     pb.WorkerState(worker_id="b", address="b:1", healthy=True, lora=lora)])

    async def watch() -> AsyncIterator[pb.FleetUpdate]:
        yield update
        await asyncio.Event().wait()

    fleet = FleetView(watch)
    fleet.start()
    await fleet.first_view()
    selector = WorkerSelector(picks, fleet, sessions)
    try:
        await selector.pick(pb.GenerateRequest(request_id="r", prompt="hi", model="support"))
        assert picks.asked[-1].adapter == "support"  # the router is told which
        picks.failure = PickFailed(grpc.StatusCode.UNAVAILABLE, "router away")
        sessions.busy = {"b:1": 5}  # busier, but the only one that serves it
        assert (await selector.pick(pb.GenerateRequest(request_id="r", prompt="hi", model="support"))).worker_id == "b"
        assert (await selector.pick(pb.GenerateRequest(request_id="r", prompt="hi"))).worker_id == "a"
        with pytest.raises(GatewayError) as refused:
            await selector.pick(pb.GenerateRequest(request_id="r", prompt="hi", model="support"), exclude=["b"])
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        await selector.close()
        await fleet.close()


async def test_a_request_and_its_failover_keep_to_the_workers_of_its_base_model(parts: tuple[Picks, Sessions]) -> None:
    """A migration or failover is a pick that excludes the failed worker: it stays on the model."""
    picks, sessions = parts
    lora = pb.LoraConfig(adapters=[pb.LoraAdapter(name="support", path="/a/support")], max_loras=1)
    update = pb.FleetUpdate(workers=[
        pb.WorkerState(worker_id="a1", address="a1:1", healthy=True, model="m1"),
        pb.WorkerState(worker_id="b1", address="b1:1", healthy=True, model="m2", lora=lora),
        pb.WorkerState(worker_id="b2", address="b2:1", healthy=True, model="m2")])

    async def watch() -> AsyncIterator[pb.FleetUpdate]:
        yield update
        await asyncio.Event().wait()

    fleet = FleetView(watch, model="m1")
    fleet.start()
    await fleet.first_view()
    selector = WorkerSelector(picks, fleet, sessions)
    try:
        await selector.pick(pb.GenerateRequest(request_id="r", prompt="hi", model="m2"))
        await selector.pick(pb.GenerateRequest(request_id="r", prompt="hi", model="support"))
        await selector.pick(pb.GenerateRequest(request_id="r", prompt="hi"))
        # The router is told the base model (as the workers name it) and the adapter.
        assert [(p.model, p.adapter) for p in picks.asked] == [("m2", ""), ("m2", "support"), ("m1", "")]
        picks.failure = PickFailed(grpc.StatusCode.UNAVAILABLE, "router away")
        sessions.busy = {"b1:1": 5, "b2:1": 5}  # busier than a1, which serves another model
        req = pb.GenerateRequest(request_id="r", prompt="hi", model="m2")
        assert (await selector.pick(req, exclude=["b1"])).worker_id == "b2"
        with pytest.raises(GatewayError) as refused:
            await selector.pick(req, exclude=["b1", "b2"])
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        assert selector.any_worker("m2") in {"b1:1", "b2:1"} and selector.any_worker() == "a1:1"
    finally:
        await selector.close()
        await fleet.close()
