"""The limits' Lua scripts on a real Valkey, through two gateways' Limits: a burst from both takes
no more than the limit; a gateway's holds lapse when its id does (it died); settling gives
back what a request did not use."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from meshserve.gateway.errors import GatewayError
from meshserve.gateway.limits import Limits, Reservation
from meshserve.services.cache_keys import connect
from meshserve.services.tenants import TenantSettings

SETTINGS = TenantSettings(max_concurrency=5, tpm=600)


@pytest.fixture
async def gateways(redis_url: str) -> AsyncIterator[tuple[Limits, Limits]]:
    prefix = f"test:{uuid.uuid4().hex}:tenants:"
    clients = [connect(redis_url, socket_timeout_s=5.0) for _ in range(2)]
    limits = [Limits(lambda _: SETTINGS, c, prefix, 0.5, timeout_s=5.0) for c in clients]
    yield limits[0], limits[1]
    for lim, client in zip(limits, clients, strict=True):
        await lim.close()
        await client.aclose()


async def taken(limits: Limits, choices: int, tokens: int) -> Reservation | None:
    try:
        return await limits.reserve("t", choices, tokens)
    except GatewayError:
        return None


async def test_a_burst_from_two_gateways_takes_no_more_than_the_limit(gateways: tuple[Limits, Limits]) -> None:
    a, b = gateways
    held = await asyncio.gather(*(taken((a, b)[i % 2], 1, 1) for i in range(40)))
    assert sum(r is not None for r in held) == SETTINGS.max_concurrency
    assert all(r.where == "redis" for r in held if r is not None)


async def test_settling_gives_back_places_and_unused_tokens(gateways: tuple[Limits, Limits]) -> None:
    a, b = gateways
    r = await taken(a, 2, 500)
    assert r is not None and await taken(b, 1, 200) is None  # 500 + 200 tokens > 600
    a.settle(r, used=100)
    await asyncio.gather(*a._tasks)  # noqa: SLF001 (the settlement runs off the request's path)
    assert await taken(b, 3, 450) is not None  # 2 places and 400 tokens given back


async def test_the_holds_of_a_gateway_that_died_lapse(gateways: tuple[Limits, Limits], redis_url: str) -> None:
    a, b = gateways
    assert await taken(a, 5, 1) is not None and await taken(b, 1, 1) is None
    client = connect(redis_url)
    try:  # a's id expires, as it does ALIVE_TTL_S after a gateway stops renewing it
        assert await client.delete(f"{a._prefix}gateway:{a._id}") == 1  # noqa: SLF001
    finally:
        await client.aclose()
    assert await taken(b, 5, 1) is not None
