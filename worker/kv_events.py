"""What an engine's prefix cache holds, kept as the mesh's block hashes, and its changes streamed to
every watcher (the router's ``WatchKvEvents``).

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


class _Watcher:
    def __init__(self) -> None:
        self.pending: dict[int, bool] = {}  # block hash -> stored (True) or removed (False)
        self.resync = True                  # the first read is the whole cache
        self.ready = asyncio.Event()
        self.ready.set()


class KvCacheView:
    """The set of cached block hashes of one engine, and the watchers of its changes."""

    def __init__(self, block_size: int, max_pending: int = 200_000) -> None:
        self.block_size = block_size
        self.max_pending = max_pending
        self._blocks: dict[int, None] = {}
        self._watchers: list[_Watcher] = []

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

    async def watch(self) -> AsyncIterator[KvBatch]:
        """The whole cache (``reset``), then every change, batched by how fast it is read."""
        w = _Watcher()
        self._watchers.append(w)
        try:
            while True:
                await w.ready.wait()
                w.ready.clear()
                if w.resync:
                    w.resync = False
                    w.pending.clear()
                    for batch in _chunks(list(self._blocks), reset=True):
                        yield batch
                elif w.pending:
                    changes, w.pending = w.pending, {}
                    stored = [h for h, s in changes.items() if s]
                    removed = [h for h, s in changes.items() if not s]
                    for i in range(0, max(len(stored), len(removed)), MAX_HASHES_PER_MESSAGE):
                        yield KvBatch(stored=stored[i : i + MAX_HASHES_PER_MESSAGE],
                                      removed=removed[i : i + MAX_HASHES_PER_MESSAGE])
        finally:
            self._watchers.remove(w)


def _chunks(hashes: list[int], reset: bool) -> Iterable[KvBatch]:
    for i in range(0, max(1, len(hashes)), MAX_HASHES_PER_MESSAGE):
        yield KvBatch(reset=reset and i == 0, stored=hashes[i : i + MAX_HASHES_PER_MESSAGE])
