"""Flow control (gateway.flow): places on a saturated fleet go by priority band, then by weighted
fair queuing over tokens between tenants; waiting is bounded and a refusal is at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import grpc
import pytest

from meshserve.gateway.errors import GatewayError
from meshserve.gateway.flow import LIGHT_TENANT_S, RATE_HALF_LIFE_S, FlowController


class Clock:
    now = 100.0

    def __call__(self) -> float:
        return self.now


class Fleet:
    places = 2


def controller(fleet: Fleet, clock: Clock, weights: dict[str, float] | None = None, best_priority: int = 0,
               max_queued: int = 100, max_wait_s: float = 60.0, headroom: float = 0.0) -> FlowController:
    return FlowController(lambda: fleet.places, lambda t: (weights or {}).get(t, 1.0), best_priority, max_queued,
                          max_wait_s, clock, headroom)


async def hold(flow: FlowController, order: list[str], name: str, tenant: str, priority: int = 0,
               cost: int = 100, release: asyncio.Event | None = None) -> None:
    async with flow.place(tenant, priority, 0, cost) as settle:
        order.append(name)
        if release is not None:
            await release.wait()
        settle(cost)


@pytest.fixture
async def stack() -> AsyncIterator[AsyncExitStack]:
    async with AsyncExitStack() as s:
        yield s


async def saturate(flow: FlowController, n: int) -> tuple[asyncio.Event, list[asyncio.Task[None]]]:
    """``n`` generations holding places until the event is set."""
    release = asyncio.Event()
    running = [asyncio.create_task(hold(flow, [], f"busy-{i}", "busy", release=release)) for i in range(n)]
    await asyncio.sleep(0)
    return release, running


async def one_by_one(flow: FlowController, tasks: list[asyncio.Task[None]], release: asyncio.Event) -> None:
    """Frees the places one at a time, letting the next waiter in each time."""
    release.set()
    await asyncio.gather(*tasks)


async def test_an_unsaturated_fleet_gives_a_place_at_once() -> None:
    flow = controller(Fleet(), Clock())
    order: list[str] = []
    await hold(flow, order, "a", "t")
    assert order == ["a"] and flow.dispatched == 0 and flow.queued == 0


async def test_a_fleet_of_unknown_size_holds_nothing_back() -> None:
    fleet = Fleet()
    fleet.places = 0
    flow = controller(fleet, Clock())
    release, busy = await saturate(flow, 50)
    assert flow.dispatched == 50 and flow.queued == 0
    await one_by_one(flow, busy, release)


async def test_a_tenant_that_just_arrived_goes_before_a_flood_already_queued() -> None:
    fleet, clock = Fleet(), Clock()
    flow = controller(fleet, clock)
    release, busy = await saturate(flow, 2)
    order: list[str] = []
    flood = [asyncio.create_task(hold(flow, order, f"flood-{i}", "flood")) for i in range(5)]
    await asyncio.sleep(0)
    small = asyncio.create_task(hold(flow, order, "small", "small"))
    await asyncio.sleep(0)
    assert flow.queued == 6
    await one_by_one(flow, busy, release)
    await asyncio.gather(small, *flood)
    assert order[0] == "flood-0" and order[1] == "small"  # the flood's first was tagged before it arrived


async def test_equal_tenants_get_equal_tokens_whatever_their_requests_sizes() -> None:
    fleet, clock = Fleet(), Clock()
    fleet.places = 1
    flow = controller(fleet, clock)
    release, busy = await saturate(flow, 1)
    order: list[str] = []
    longs = [asyncio.create_task(hold(flow, order, "long", "long", cost=1000)) for _ in range(4)]
    shorts = [asyncio.create_task(hold(flow, order, "short", "short", cost=100)) for _ in range(40)]
    await asyncio.sleep(0)
    await one_by_one(flow, busy, release)
    await asyncio.gather(*longs, *shorts)
    # Over the first half of the dispatches, the two tenants' tokens stay within one long request.
    first = order[:22]
    assert abs(first.count("long") * 1000 - first.count("short") * 100) <= 1000


async def test_a_heavier_weight_gets_a_larger_share() -> None:
    fleet, clock = Fleet(), Clock()
    fleet.places = 1
    flow = controller(fleet, clock, weights={"gold": 3.0})
    release, busy = await saturate(flow, 1)
    order: list[str] = []
    tasks = [asyncio.create_task(hold(flow, order, t, t)) for _ in range(12) for t in ("gold", "bronze")]
    await asyncio.sleep(0)
    await one_by_one(flow, busy, release)
    await asyncio.gather(*tasks)
    assert order[:8].count("gold") == 6  # 3 to 1


async def test_a_more_urgent_band_goes_first_and_finds_a_place_kept_for_it() -> None:
    fleet, clock = Fleet(), Clock()
    fleet.places = 10
    flow = controller(fleet, clock, best_priority=-1)
    order: list[str] = []
    # The routine band may take 10 - 1 places: one is kept for the more urgent one.
    release, busy = await saturate(flow, 9)
    routine = asyncio.create_task(hold(flow, order, "routine", "busy"))
    await asyncio.sleep(0)
    assert flow.queued == 1 and order == []
    urgent = asyncio.create_task(hold(flow, order, "urgent", "vip", priority=-1))
    await asyncio.sleep(0)
    assert order == ["urgent"]  # at once, in the kept place
    await one_by_one(flow, busy, release)
    await asyncio.gather(routine, urgent)


@pytest.mark.parametrize(("best_priority", "routine_places"), [(0, 12), (-1, 9)])
async def test_headroom_goes_to_the_most_urgent_band_only(best_priority: int, routine_places: int) -> None:
    """Of 10 running sequences with 20% headroom: with one band, it holds 12 (two wait in the
    engines, so a batch stays full); below a more urgent band, 9 (none waiting, one running
    sequence kept free, so an urgent request starts at once)."""
    fleet, clock = Fleet(), Clock()
    fleet.places = 10
    flow = controller(fleet, clock, best_priority=best_priority, headroom=0.2)
    release, busy = await saturate(flow, 20)
    assert (flow.dispatched, flow.queued) == (routine_places, 20 - routine_places)
    await one_by_one(flow, busy, release)


@pytest.mark.parametrize(("small_asked_s_ago", "flood_places"), [(1.0, 9), (LIGHT_TENANT_S + 1, 12)])
async def test_a_place_is_kept_free_from_a_backlog_for_a_light_tenant(small_asked_s_ago: float,
                                                                       flood_places: int) -> None:
    """Of 10 running sequences with 20% headroom, a tenant with requests waiting refills at most 9
    while another tenant asked lately and has none waiting: the light tenant's next request starts
    at once, not when the flood's batch ends. Once it has been quiet LIGHT_TENANT_S, the flood
    takes every place and the headroom again."""
    fleet, clock = Fleet(), Clock()
    fleet.places = 10
    flow = controller(fleet, clock, headroom=0.2)
    await hold(flow, [], "earlier", "small")
    clock.now += small_asked_s_ago
    first, batch = await saturate(flow, 12)
    second, backlog = await saturate(flow, 20)
    first.set()  # the first batch ends together, as streams of one length do
    await asyncio.gather(*batch)
    assert (flow.dispatched, flow.queued) == (flood_places, 20 - flood_places)
    order: list[str] = []
    small = asyncio.create_task(hold(flow, order, "small", "small"))
    await asyncio.sleep(0)
    assert order == (["small"] if flood_places < 10 else [])  # at once, in the kept place
    await one_by_one(flow, backlog, second)
    await small


async def test_tenants_all_backlogged_keep_every_place_and_the_headroom() -> None:
    fleet, clock = Fleet(), Clock()
    fleet.places = 10
    flow = controller(fleet, clock, headroom=0.2)
    release = asyncio.Event()
    tasks = [asyncio.create_task(hold(flow, [], f"{t}-{i}", t, release=release))
             for i in range(10) for t in ("left", "right")]
    await asyncio.sleep(0)
    assert (flow.dispatched, flow.queued) == (12, 8)
    await one_by_one(flow, tasks, release)


async def test_a_full_queue_refuses_at_once_with_a_retry_hint() -> None:
    fleet, clock = Fleet(), Clock()
    flow = controller(fleet, clock, max_queued=3)
    release, busy = await saturate(flow, 2)
    queued = [asyncio.create_task(hold(flow, [], f"q{i}", "t")) for i in range(3)]
    await asyncio.sleep(0)
    with pytest.raises(GatewayError) as e:
        await hold(flow, [], "over", "t")
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and ("retry-after", "1") in e.value.trailers
    await one_by_one(flow, busy, release)
    await asyncio.gather(*queued)


async def test_a_wait_estimated_longer_than_allowed_is_refused_at_once() -> None:
    fleet, clock = Fleet(), Clock()
    fleet.places = 1
    flow = controller(fleet, clock, max_wait_s=2.0)
    for _ in range(5):  # one place given a second for the last RATE_HALF_LIFE_S seconds: a slow fleet
        await hold(flow, [], "past", "t")
        clock.now += 1.0
    clock.now += RATE_HALF_LIFE_S
    release, busy = await saturate(flow, 1)
    first = asyncio.create_task(hold(flow, [], "first", "t"))  # next in line: no wait estimated
    await asyncio.sleep(0)
    with pytest.raises(GatewayError) as e:
        await hold(flow, [], "late", "t")  # one ahead of it, at well under a place a second
    assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED and "saturated" in e.value.message
    assert flow.queued == 1  # refused without queueing
    await one_by_one(flow, busy, release)
    await first


async def test_a_waiter_that_leaves_gives_up_its_turn() -> None:
    fleet, clock = Fleet(), Clock()
    fleet.places = 1
    flow = controller(fleet, clock)
    release, busy = await saturate(flow, 1)
    order: list[str] = []
    gone = asyncio.create_task(hold(flow, order, "gone", "t"))
    stays = asyncio.create_task(hold(flow, order, "stays", "u"))
    await asyncio.sleep(0)
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert flow.queued == 1
    await one_by_one(flow, busy, release)
    await stays
    assert order == ["stays"] and flow.dispatched == 0
