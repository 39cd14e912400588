"""What an engine's prefix cache holds, kept as the mesh's block hashes, and its changes streamed to
every watcher (the router's ``WatchLoad`` stream, or ``WatchKvEvents``).

Engines report blocks stored, removed and all cleared; each watcher gets the net change since
its last read (a block stored and evicted in between is one entry, its last state), so a slow
watcher costs a bounded amount of memory: past ``max_pending`` changes it is marked for a resync
and its next read is the whole cache again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field

# Hashes per message: a full-cache snapshot of a large pool goes out in several messages.
MAX_HASHES_PER_MESSAGE = 16384


@dataclass
class KvBatch:
    """One message of the stream: ``reset`` replaces everything the watcher knew."""

    reset: bool = False
    stored: list[int] = field(default_factory=list)
    removed: list[int] = field(default_factory=list)


class KvWatcher:
    """One reader of a view's changes (``KvCacheView.subscribe``)."""

    def __init__(self, ready: asyncio.Event) -> None:
        self.pending: dict[int, bool] = {}  # block hash -> stored (True) or removed (False)
        self.resync = True                  # the first read is the whole cache
        self.ready = ready                  # set on every change (and at first)
        self.ready.set()


class KvCacheView:
    """The set of cached block hashes of one engine, and the watchers of its changes."""

    def __init__(self, block_size: int, max_pending: int = 200_000) -> None:
        self.block_size = block_size
        self.max_pending = max_pending
        self._blocks: dict[int, None] = {}
        self._watchers: list[KvWatcher] = []

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, block_hash: int) -> bool:
        return block_hash in self._blocks

    def stored(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            if h not in self._blocks:
                self._blocks[h] = None
                self._change(h, True)

    def removed(self, hashes: Iterable[int]) -> None:
        for h in hashes:
            if self._blocks.pop(h, 0) is None:
                self._change(h, False)

    def cleared(self) -> None:
        self._blocks.clear()
        for w in self._watchers:
            w.pending.clear()
            w.resync = True
            w.ready.set()

    def _change(self, h: int, stored: bool) -> None:
        for w in self._watchers:
            if w.resync:
                continue  # its next read is a snapshot anyway
            w.pending[h] = stored
            if len(w.pending) > self.max_pending:
                w.pending.clear()
                w.resync = True
            w.ready.set()

    def subscribe(self, ready: asyncio.Event | None = None) -> KvWatcher:
        """A watcher of the changes from now on, each of them setting ``ready``; its first
        ``take`` is the whole cache. ``unsubscribe`` it when done."""
        w = KvWatcher(ready or asyncio.Event())
        self._watchers.append(w)
        return w

    def unsubscribe(self, w: KvWatcher) -> None:
        self._watchers.remove(w)

    def take(self, w: KvWatcher) -> list[KvBatch]:
        """The watcher's messages now, without waiting: the whole cache (``reset``) if it must
        resync, else its net changes since its last take ([] if none)."""
        if w.resync:
            w.resync = False
            w.pending.clear()
            return list(_chunks(list(self._blocks), reset=True))
        if not w.pending:
            return []
        changes, w.pending = w.pending, {}
        stored = [h for h, s in changes.items() if s]
        removed = [h for h, s in changes.items() if not s]
        return [KvBatch(stored=stored[i : i + MAX_HASHES_PER_MESSAGE], removed=removed[i : i + MAX_HASHES_PER_MESSAGE])
                for i in range(0, max(len(stored), len(removed)), MAX_HASHES_PER_MESSAGE)]

    async def watch(self) -> AsyncIterator[KvBatch]:
        """The whole cache (``reset``), then every change, batched by how fast it is read."""
        w = self.subscribe()
        try:
            while True:
                await w.ready.wait()
                w.ready.clear()
                for batch in self.take(w):
                    yield batch
        finally:
            self.unsubscribe(w)


def _chunks(hashes: list[int], reset: bool) -> Iterable[KvBatch]:
    for i in range(0, max(1, len(hashes)), MAX_HASHES_PER_MESSAGE):
        yield KvBatch(reset=reset and i == 0, stored=hashes[i : i + MAX_HASHES_PER_MESSAGE])
