"""The services' Redis client (``services.cache_keys.connect``) against a real valkey-server."""

from __future__ import annotations

import asyncio

from meshserve.services import cache_keys


async def test_a_burst_larger_than_the_pool_queues_for_its_connections(redis_url: str) -> None:
    # 300 concurrent reads (a burst of identical requests at a gateway): all answered, over at
    # most MAX_CONNECTIONS connections (valkey's own count of the connections it accepted).
    client = cache_keys.connect(redis_url, socket_timeout_s=5.0)
    try:
        await client.set("burst:key", b"value")
        accepted = (await client.info("stats"))["total_connections_received"]
        got = await asyncio.gather(*(client.get("burst:key") for _ in range(3 * cache_keys.MAX_CONNECTIONS)))
        assert got == [b"value"] * (3 * cache_keys.MAX_CONNECTIONS)
        opened = (await client.info("stats"))["total_connections_received"] - accepted
        assert 1 < opened <= cache_keys.MAX_CONNECTIONS
    finally:
        await client.aclose()
