"""The gateway's view of the fleet (gateway.fleet), from the router's list: the weights it serves,
and its only worker when it has one."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import pytest

from gateway.fleet import FleetView
from services.gen import meshserve_pb2 as pb


class Router:
    """Lists ``workers`` ((id, weights id, healthy)), those in ``draining`` draining; ``down``: fails
    as an unreachable router."""

    def __init__(self, *workers: tuple[str, str, bool]) -> None:
        self.workers = list(workers)
        self.draining: set[str] = set()
        self.down = False
        self.lists = 0

    async def ListWorkers(self, request: pb.ListWorkersRequest, *, timeout: float | None = None
                          ) -> pb.ListWorkersResponse:
        self.lists += 1
        if self.down:
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "down")
        return pb.ListWorkersResponse(workers=[
            pb.WorkerState(worker_id=w, address=f"{w}:1", weights_id=weights, healthy=healthy,
                           load=pb.LoadReport(draining=w in self.draining))
            for w, weights, healthy in self.workers
        ])


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(("workers", "serving"), [
    ([("a", "w1", True), ("b", "w2", True), ("c", "w2", True)], "w2"),   # the most workers'
    ([("a", "w2", True), ("b", "w1", True)], "w1"),                       # a tie: the first
    ([("a", "w1", False), ("b", "w2", True)], "w2"),                      # the healthy ones only
    ([("a", "", True)], ""),                                              # workers that give none
    ([("a", "w1", False)], None),                                         # no healthy worker
    ([], None),
])
async def test_the_fleet_serves_the_weights_of_most_healthy_workers(
    workers: list[tuple[str, str, bool]], serving: str | None
) -> None:
    weights = FleetView(Router(*workers))
    assert await weights.serving() == serving


async def test_the_first_request_waits_for_a_list_and_later_ones_are_answered_from_the_last() -> None:
    router, clock = Router(("a", "w1", True)), Clock()
    weights = FleetView(router, refresh_s=1.0, clock=clock)
    assert await weights.serving() == "w1" and router.lists == 1
    router.workers = [("a", "w2", True)]
    clock.now = 0.5
    assert await weights.serving() == "w1" and router.lists == 1  # the list is fresh
    clock.now = 1.0
    assert await weights.serving() == "w1"  # the old list answers; a new one is asked meanwhile
    await weights.listed()
    assert router.lists == 2 and await weights.serving() == "w2"


async def test_a_router_that_cannot_list_leaves_what_it_listed_before() -> None:
    router, clock = Router(("a", "w1", True)), Clock()
    weights = FleetView(router, refresh_s=1.0, clock=clock)
    router.down = True
    assert await weights.serving() is None  # nothing listed yet: requests are not cached
    router.down = False
    assert await weights.serving() is None and router.lists == 1  # asked again after refresh_s only
    clock.now = 1.0
    assert await weights.serving() == "w1"
    router.down, clock.now = True, 2.0
    await weights.serving()
    await weights.listed()
    assert router.lists == 3 and await weights.serving() == "w1"


async def test_a_worker_newer_than_the_list_is_looked_up_in_a_new_one() -> None:
    router = Router(("a", "w1", True))
    weights = FleetView(router, clock=Clock())
    assert await weights.of_worker("a") == "w1" and router.lists == 1
    router.workers.append(("b", "w2", True))
    assert await weights.of_worker("b") == "w2" and router.lists == 2
    assert await weights.of_worker("gone") is None and router.lists == 3


async def test_the_only_worker_is_named_while_it_is_the_only_one_healthy_and_undrained() -> None:
    router, clock = Router(("a", "w1", True)), Clock()
    fleet = FleetView(router, refresh_s=1.0, clock=clock)
    assert fleet.sole() is None  # nothing listed yet; a list is asked for
    await fleet.listed()
    assert fleet.sole() == ("a", "a:1")

    async def after(change: Callable[[], None]) -> tuple[str, str] | None:
        change()
        clock.now += 1.0
        fleet.sole()  # asks for a new list
        await fleet.listed()
        return fleet.sole()

    assert await after(lambda: router.workers.append(("b", "w1", True))) is None  # two to choose from
    assert await after(lambda: router.workers.pop()) == ("a", "a:1")
    assert await after(lambda: router.draining.add("a")) is None
    assert await after(router.draining.clear) == ("a", "a:1")
    assert await after(lambda: router.workers.__setitem__(0, ("a", "w1", False))) is None  # unhealthy
    assert await after(router.workers.clear) is None
