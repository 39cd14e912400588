"""Which worker holds which KV-cache block: block hash -> the set of workers (a bitmask), kept
from the workers' KV-event streams (precise) or from the router's own picks (approximate).

``match`` answers, for a prompt's block-hash chain, how many leading blocks each worker holds
(``held``: the same as a column over a fleet's rows, for a pick);
an engine can reuse only a prefix of its blocks, so a worker's count stops at the first block it
lacks. The work per event and per match is linear in the blocks it names, never in the index.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping, Sequence

import numpy as np


class KvIndex:
    """Block hash -> workers holding it, for any number of workers (one bit each)."""

    def __init__(self) -> None:
        self._holders: dict[int, int] = {}                    # block hash -> bitmask of slots
        self._slot: dict[str, int] = {}                       # worker -> its bit
        self._blocks: dict[str, OrderedDict[int, float]] = {}  # worker -> its blocks (-> when), oldest first
        self._worker_at: dict[int, str] = {}                  # slot -> worker
        self._free_slots: list[int] = []
        self._slots_version = 0  # changes whenever a worker takes or gives up a slot
        self._row_of_slot: tuple[Mapping[str, int], int, np.ndarray] | None = None  # for held()
        self.ignored = 0  # removals of blocks the worker never reported storing

    def __len__(self) -> int:
        """Distinct blocks held by at least one worker."""
        return len(self._holders)

    def workers(self) -> list[str]:
        return list(self._slot)

    def num_blocks(self, worker: str) -> int:
        return len(self._blocks.get(worker, ()))

    def reset(self, worker: str, hashes: Iterable[int]) -> None:
        """``worker`` holds exactly ``hashes`` now."""
        self.drop(worker)
        self.stored(worker, hashes)

    def stored(self, worker: str, hashes: Iterable[int], at: float = 0.0) -> None:
        """``worker`` holds ``hashes`` (since ``at``, for ``expire``)."""
        bit = 1 << self._slot_of(worker)
        blocks = self._blocks[worker]
        for h in hashes:
            if h in blocks:
                blocks.move_to_end(h)
                blocks[h] = at
                continue
            blocks[h] = at
            self._holders[h] = self._holders.get(h, 0) | bit

    def removed(self, worker: str, hashes: Iterable[int]) -> None:
        blocks = self._blocks.get(worker)
        if blocks is None:
            return
        bit = 1 << self._slot[worker]
        for h in hashes:
            if blocks.pop(h, None) is not None:
                self._unhold(h, bit)
            else:
                self.ignored += 1

    def evict_oldest(self, worker: str, keep: int) -> None:
        """Forgets the worker's least recently stored blocks beyond ``keep`` (approximate index)."""
        blocks = self._blocks.get(worker)
        if blocks is None:
            return
        bit = 1 << self._slot[worker]
        while len(blocks) > keep:
            h, _ = blocks.popitem(last=False)
            self._unhold(h, bit)

    def expire(self, before: float) -> None:
        """Forgets every block stored before ``before`` (the router's record of recent picks)."""
        for worker, blocks in self._blocks.items():
            bit = 1 << self._slot[worker]
            while blocks and next(iter(blocks.values())) < before:
                h, _ = blocks.popitem(last=False)
                self._unhold(h, bit)

    def drop(self, worker: str) -> None:
        """Forgets everything ``worker`` held (its stream ended, or it resets)."""
        blocks = self._blocks.pop(worker, None)
        if blocks is None:
            return
        slot = self._slot.pop(worker)
        del self._worker_at[slot]
        self._slots_version += 1
        bit = 1 << slot
        for h in blocks:
            self._unhold(h, bit)
        self._free_slots.append(slot)

    def match(self, hashes: Sequence[int]) -> dict[str, int]:
        """Leading blocks of the chain ``hashes`` each worker holds (workers with none omitted)."""
        worker_at, out = self._worker_at, {}
        for bits, n in self._runs(hashes):
            while bits:
                low = bits & -bits
                out[worker_at[low.bit_length() - 1]] = n
                bits ^= low
        return out

    def held(self, hashes: Sequence[int], rows: Mapping[str, int]) -> HeldBlocks:
        """``match`` as a column over ``rows`` (worker -> row, a fleet's): a pick over hundreds of
        workers reads it in a few array operations. Workers not in ``rows`` are left out."""
        counts = np.zeros(len(rows), dtype=np.int64)
        runs = self._runs(hashes)
        if runs:
            row_of_slot = self._rows_by_slot(rows)
            for bits, n in runs:
                raw = np.frombuffer(bits.to_bytes((bits.bit_length() + 7) // 8, "little"), dtype=np.uint8)
                at = row_of_slot[np.flatnonzero(np.unpackbits(raw, bitorder="little"))]
                counts[at[at >= 0]] = n
        return HeldBlocks(rows, counts)

    def _runs(self, hashes: Sequence[int]) -> list[tuple[int, int]]:
        """The workers holding a leading run of ``hashes``, by the run's length: (their bits, length)."""
        if not hashes:
            return []
        alive = self._holders.get(hashes[0], 0)
        if not alive:
            return []
        holders = self._holders
        ended: list[tuple[int, int]] = []  # (the workers whose run stopped here, as bits; its length)
        for i in range(1, len(hashes)):
            held = alive & holders.get(hashes[i], 0)
            if held != alive:
                ended.append((alive & ~held, i))
                alive = held
                if not alive:
                    break
        if alive:
            ended.append((alive, len(hashes)))
        return ended

    def _rows_by_slot(self, rows: Mapping[str, int]) -> np.ndarray:
        """Each slot's row in ``rows`` (-1: none), remade only when the slots or the rows change."""
        cached = self._row_of_slot
        if cached is not None and cached[0] is rows and cached[1] == self._slots_version:
            return cached[2]
        row_of_slot = np.full(max(self._worker_at, default=-1) + 1, -1, dtype=np.int64)
        for slot, worker in self._worker_at.items():
            row_of_slot[slot] = rows.get(worker, -1)
        self._row_of_slot = (rows, self._slots_version, row_of_slot)
        return row_of_slot

    def _slot_of(self, worker: str) -> int:
        slot = self._slot.get(worker)
        if slot is None:
            slot = self._free_slots.pop() if self._free_slots else len(self._slot)
            self._slot[worker] = slot
            self._worker_at[slot] = worker
            self._slots_version += 1
            self._blocks[worker] = OrderedDict()
        return slot

    def _unhold(self, h: int, bit: int) -> None:
        left = self._holders.get(h, 0) & ~bit
        if left:
            self._holders[h] = left
        else:
            self._holders.pop(h, None)


class HeldBlocks(Mapping[str, int]):
    """Leading blocks of a prompt each worker holds (workers with none omitted), kept as a column
    over a fleet's rows (``KvIndex.held``): a mapping for whoever asks by worker, an array for
    a policy scoring the rows."""

    def __init__(self, rows: Mapping[str, int], counts: np.ndarray) -> None:
        self.rows = rows       # worker -> row
        self.counts = counts   # blocks, by row

    def __getitem__(self, worker: str) -> int:
        n = int(self.counts[self.rows[worker]])
        if not n:
            raise KeyError(worker)
        return n

    def __iter__(self) -> Iterator[str]:
        return (worker for worker, row in self.rows.items() if self.counts[row])

    def __len__(self) -> int:
        return int(np.count_nonzero(self.counts))

    def most(self, other: HeldBlocks) -> HeldBlocks:
        """Each worker's larger count of the two (over the same rows)."""
        assert other.rows is self.rows
        return HeldBlocks(self.rows, np.maximum(self.counts, other.counts))
