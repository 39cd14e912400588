"""A worker's view of its engine's prefix cache and the stream of its changes."""

from __future__ import annotations

import asyncio

from meshserve.worker import kv_events
from meshserve.worker.kv_events import KvBatch, KvCacheView


async def next_batch(stream, timeout: float = 1.0) -> KvBatch:  # noqa: ANN001
    return await asyncio.wait_for(anext(stream), timeout)


async def test_a_watcher_gets_the_whole_cache_then_net_changes() -> None:
    view = KvCacheView(block_size=16)
    view.stored([1, 2])
    stream = view.watch()
    first = await next_batch(stream)
    assert first.reset and sorted(first.stored) == [1, 2]
    view.stored([3])
    view.removed([1])
    view.stored([1])   # evicted and cached again before the watcher read: stored, once
    view.stored([2])   # already held: no change
    view.removed([42])  # never stored: no change
    batch = await next_batch(stream)
    assert not batch.reset
    assert sorted(batch.stored) == [1, 3] and batch.removed == []
    view.removed([3])
    assert (await next_batch(stream)).removed == [3]
    await stream.aclose()


async def test_a_slow_watcher_is_resynced_not_buffered_without_bound() -> None:
    view = KvCacheView(block_size=16, max_pending=10)
    stream = view.watch()
    assert (await next_batch(stream)).reset
    view.stored(range(100, 150))   # more changes than it may hold: dropped, resync pending
    view.removed(range(100, 140))
    batch = await next_batch(stream)
    assert batch.reset and sorted(batch.stored) == list(range(140, 150))
    await stream.aclose()


async def test_cleared_cache_resets_every_watcher() -> None:
    view = KvCacheView(block_size=16)
    view.stored([1])
    stream = view.watch()
    await next_batch(stream)
    view.cleared()
    batch = await next_batch(stream)
    assert batch.reset and batch.stored == []
    assert len(view) == 0
    await stream.aclose()


async def test_a_large_snapshot_goes_in_several_messages(monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setattr(kv_events, "MAX_HASHES_PER_MESSAGE", 4)
    view = KvCacheView(block_size=16)
    view.stored(range(10))
    stream = view.watch()
    batches = [await next_batch(stream) for _ in range(3)]
    assert [b.reset for b in batches] == [True, False, False]
    assert sorted(h for b in batches for h in b.stored) == list(range(10))
    await stream.aclose()
