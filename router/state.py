"""The router's live view of the workers: last load report, connection state and the picks each
worker has not reported yet. Policies read immutable snapshots of it (a ``Fleet``); watchers and
picks write it.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NamedTuple

import numpy as np


@dataclass(frozen=True)
class WorkerLoad:
    """A worker's load report (the ``LoadReport`` message as a plain value)."""

    num_running: int = 0
    num_waiting: int = 0
    kv_cache_usage: float = 0.0
    prefix_cache_hit_rate: float = 0.0
    max_num_seqs: int = 0
    draining: bool = False
    sequence: int = 0
    num_in_flight: int = 0
    requests_received: int = 0
    active_adapters: tuple[str, ...] = ()  # the LoRA adapters in its slots, least recently used first
    running_adapters: tuple[str, ...] = ()  # of them, those its running requests use
    waiting_adapters: tuple[str, ...] = ()  # adapters whose requests wait for a slot


@dataclass(frozen=True)
class LoraSlots:
    """The LoRA adapters a worker serves and its slots for them (``WorkerInfo.lora``)."""

    adapters: tuple[tuple[str, str], ...] = ()  # (name, path), in the worker's order
    max_loras: int = 0
    max_lora_rank: int = 0
    max_cpu_loras: int = 0

    def serves(self, adapter: str) -> bool:
        return any(name == adapter for name, _ in self.adapters)


class WorkerView(NamedTuple):
    """One worker as the policies see it at the moment of a pick (a tuple: a router with
    hundreds of workers reads one per worker per pick). Views are made by ``WorkerView.of``
    when the worker changes, not per pick: the table hands out the same objects until then."""

    worker_id: str
    address: str
    connected: bool = False              # its WatchLoad stream is open
    load: WorkerLoad | None = None       # the last report (None before the first)
    reported_at: float | None = None     # when that report came (the table's clock)
    assigned_unreported: int = 0         # picks the worker has not reported receiving
    # Requests the worker holds or is about to receive: the engine's running + waiting, or the
    # streams it accepted if more (its engine has not queued them yet), plus the unreported picks.
    outstanding: int = 0
    weights_id: str = ""                 # WorkerInfo.weights_id, from its connection
    max_model_len: int = 0               # WorkerInfo.max_model_len, from its connection
    model: str = ""                      # WorkerInfo.model: the base model it serves
    lora: LoraSlots | None = None        # WorkerInfo.lora: its adapters and slots (None: LoRA off)
    # The LoRA adapters of its unreported picks: the slots it is about to fill, before a report says so.
    picked_adapters: tuple[str, ...] = ()
    # How many requests on each LoRA adapter it was sent lately (picks, halved every
    # ADAPTER_DEMAND_HALF_LIFE_S, as of the view): which of its adapters has the fewest to move.
    adapter_demand: Mapping[str, float] = MappingProxyType({})

    @classmethod
    def of(cls, worker_id: str, address: str, connected: bool = False, load: WorkerLoad | None = None,
           reported_at: float | None = None, assigned_unreported: int = 0, weights_id: str = "",
           max_model_len: int = 0, model: str = "", lora: LoraSlots | None = None,
           picked_adapters: tuple[str, ...] = (),
           adapter_demand: Mapping[str, float] = MappingProxyType({})) -> WorkerView:
        engine = 0 if load is None else max(load.num_running + load.num_waiting, load.num_in_flight)
        return cls(worker_id, address, connected, load, reported_at, assigned_unreported,
                   engine + assigned_unreported, weights_id, max_model_len, model, lora, picked_adapters,
                   adapter_demand)

    def held_adapters(self) -> set[str]:
        """The LoRA adapters its slots hold or are about to: in a slot (its last report), picked
        for it since, or waiting there for a slot."""
        load = self.load or WorkerLoad()
        return {*load.active_adapters, *self.picked_adapters, *load.waiting_adapters}

    def busy_slots(self) -> set[str]:
        """The adapters that take its slots now or next: those its running requests use, its
        unreported picks' and those waiting for a slot (an idle adapter's slot is free to load into)."""
        load = self.load or WorkerLoad()
        return {*load.running_adapters, *self.picked_adapters, *load.waiting_adapters}

    def serves(self, adapter: str) -> bool:
        """Whether it serves the LoRA adapter ``adapter`` ("": the base model, which every worker does)."""
        return not adapter or (self.lora is not None and self.lora.serves(adapter))

    def is_healthy(self, stale_after_s: float, now: float) -> bool:
        """Connected, and its last report is fresh at clock time ``now``."""
        return self.connected and self.reported_at is not None and now - self.reported_at <= stale_after_s


def rendezvous_seed(worker_id: str) -> int:
    """A worker's 64-bit seed for rendezvous hashing (policies mix it with a request's key)."""
    return int.from_bytes(hashlib.blake2b(worker_id.encode(), digest_size=8).digest(), "big")


@dataclass(frozen=True)
class Fleet:
    """The workers at one pick: their views, and the fields the policies read as columns (one
    row per worker, in the views' order), so a filter or a scorer is a few array operations
    however many workers there are. ``WorkerTable.fleet`` keeps the columns up to date as the
    workers change; ``Fleet.of`` makes them from views."""

    views: Sequence[WorkerView]
    connected: np.ndarray     # bool: its WatchLoad stream is open
    reported_at: np.ndarray   # float: when its last report came; -inf before the first
    draining: np.ndarray      # bool
    outstanding: np.ndarray   # int64: WorkerView.outstanding
    waiting: np.ndarray       # int64: the requests its engine queued rather than ran (last report)
    kv_usage: np.ndarray      # float: the share of its KV cache its requests hold (last report)
    seeds: np.ndarray         # uint64: rendezvous_seed(worker_id)
    rows: Mapping[str, int]   # address -> row

    def __len__(self) -> int:
        return len(self.views)

    @classmethod
    def of(cls, views: Sequence[WorkerView]) -> Fleet:
        columns = _Columns()
        columns.rebuild(views)
        return columns.fleet(views)


class _Columns:
    """A table's columns, written in place as its workers change (one row each)."""

    def __init__(self) -> None:
        self.rebuild([])

    def rebuild(self, views: Sequence[WorkerView]) -> None:
        n = len(views)
        self.connected = np.zeros(n, dtype=bool)
        self.reported_at = np.full(n, -np.inf)
        self.draining = np.zeros(n, dtype=bool)
        self.outstanding = np.zeros(n, dtype=np.int64)
        self.waiting = np.zeros(n, dtype=np.int64)
        self.kv_usage = np.zeros(n)
        self.seeds = np.zeros(n, dtype=np.uint64)
        self.ids: list[str] = [""] * n
        self.rows = {v.address: i for i, v in enumerate(views)}
        for i, v in enumerate(views):
            self.set(i, v)

    def append(self, v: WorkerView) -> None:
        self.connected = np.append(self.connected, False)
        self.reported_at = np.append(self.reported_at, -np.inf)
        self.draining = np.append(self.draining, False)
        self.outstanding = np.append(self.outstanding, np.int64(0))
        self.waiting = np.append(self.waiting, np.int64(0))
        self.kv_usage = np.append(self.kv_usage, 0.0)
        self.seeds = np.append(self.seeds, np.uint64(0))
        self.ids.append("")
        self.rows = {**self.rows, v.address: len(self.ids) - 1}  # a new dict: fleets keep theirs
        self.set(len(self.ids) - 1, v)

    def set(self, i: int, v: WorkerView) -> None:
        self.connected[i] = v.connected
        self.reported_at[i] = -np.inf if v.reported_at is None else v.reported_at
        self.draining[i] = v.load is not None and v.load.draining
        self.outstanding[i] = v.outstanding
        self.waiting[i] = 0 if v.load is None else v.load.num_waiting
        self.kv_usage[i] = 0.0 if v.load is None else v.load.kv_cache_usage
        if self.ids[i] != v.worker_id:
            self.ids[i] = v.worker_id
            self.seeds[i] = rendezvous_seed(v.worker_id)

    def fleet(self, views: Sequence[WorkerView]) -> Fleet:
        return Fleet(views, self.connected.copy(), self.reported_at.copy(), self.draining.copy(),
                     self.outstanding.copy(), self.waiting.copy(), self.kv_usage.copy(), self.seeds.copy(),
                     self.rows)


class WorkerTable:
    """Every known worker, keyed by address (from discovery); ids come from the workers.

    Picks count against a worker until its reports show them arrived: each report carries the
    number of requests the worker has received, and every new one settles the oldest pick. A
    report sent before a pick arrived therefore leaves it counted. A pick that never arrives
    (its caller gave up first) stops counting after ``pick_ttl_s``.

    Each worker's view is remade when the worker changes (a report, a pick, its stream), so a
    snapshot is a copy of a list, not a view made per worker per pick.

    ``listen(callback)``: called when a worker joins or leaves, connects or disconnects, starts or
    stops draining, or changes its adapters (what the fleet's watchers are told at once; load
    alone is not)."""

    def __init__(
        self, addresses: list[str], clock: Callable[[], float] = time.monotonic, pick_ttl_s: float = 2.0
    ) -> None:
        self._clock = clock
        self._pick_ttl_s = pick_ttl_s
        self._workers: dict[str, _Entry] = {}
        self._views: list[WorkerView] = []
        self._columns = _Columns()
        # Every pick in the order made, with its worker's entry: expiring looks at the oldest
        # ones only. A pick already settled by a report is skipped when its turn comes.
        self._picks: deque[tuple[float, _Entry]] = deque()
        self._listeners: list[Callable[[], None]] = []
        for a in addresses:
            self.add(a)

    def addresses(self) -> list[str]:
        return list(self._workers)

    def listen(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def _changed(self) -> None:
        for callback in self._listeners:
            callback()

    def now(self) -> float:
        """The table's clock: the time its views' ``reported_at`` are on."""
        return self._clock()

    def add(self, address: str) -> None:
        """A new worker: unconnected and unreported until its watcher says otherwise."""
        if address not in self._workers:
            entry = _Entry(WorkerView.of(address, address), len(self._views))
            self._workers[address] = entry
            self._views.append(entry.view)
            self._columns.append(entry.view)
            self._changed()

    def remove(self, address: str) -> None:
        """Forgets the worker: its view and its unsettled picks."""
        if self._workers.pop(address, None) is not None:
            for i, entry in enumerate(self._workers.values()):
                entry.index = i
            self._views = [e.view for e in self._workers.values()]
            self._columns.rebuild(self._views)
            self._changed()

    def snapshot(self) -> list[WorkerView]:
        self._expire(self._clock())
        return list(self._views)

    def fleet(self) -> Fleet:
        """The workers now, as the policies read them."""
        views = self.snapshot()
        return self._columns.fleet(views)

    def _expire(self, now: float) -> None:
        """Stops counting the picks older than the TTL (the oldest first; O(expired picks))."""
        cutoff = now - self._pick_ttl_s
        changed: set[_Entry] = set()
        while self._picks and self._picks[0][0] < cutoff:
            made, e = self._picks.popleft()
            # Still unsettled (reports settle the oldest first), and its worker still known.
            if e.picks and e.picks[0][0] <= made and self._workers.get(e.view.address) is e:
                e.picks.popleft()
                changed.add(e)
        for e in changed:
            self._refresh(e)

    def on_connected(self, address: str, worker_id: str, weights_id: str = "", max_model_len: int = 0,
                     model: str = "", lora: LoraSlots | None = None) -> None:
        entry = self._workers[address]
        entry.received = None  # the next report starts the count on this stream
        self._refresh(entry, worker_id=worker_id or address, connected=True, weights_id=weights_id,
                      max_model_len=max_model_len, model=model, lora=lora)
        self._changed()

    def on_report(self, address: str, load: WorkerLoad) -> None:
        entry = self._workers[address]
        if entry.received is None or load.requests_received < entry.received:
            # A new stream (or a restarted worker): its load includes whatever arrived.
            entry.picks.clear()
        else:
            for _ in range(min(load.requests_received - entry.received, len(entry.picks))):
                entry.picks.popleft()
        entry.received = load.requests_received
        draining_changed = entry.view.load is None or entry.view.load.draining != load.draining
        self._refresh(entry, load=load, reported_at=self._clock())
        if draining_changed:
            self._changed()

    def on_lora(self, address: str, lora: LoraSlots) -> None:
        """The worker's adapters as its load stream says them now (loaded or unloaded at run time)."""
        entry = self._workers[address]
        if entry.view.lora != lora:
            self._refresh(entry, lora=lora)
            self._changed()

    def on_disconnected(self, address: str) -> None:
        self._refresh(self._workers[address], connected=False)
        self._changed()

    def on_assigned(self, address: str, adapter: str = "") -> None:
        """A pick of the worker, for a request on the LoRA ``adapter`` ("": the base model)."""
        entry = self._workers[address]
        now = self._clock()
        entry.picks.append((now, adapter))
        self._picks.append((now, entry))
        if adapter:
            entry.demand.add(adapter, now)
        self._refresh(entry)

    def _refresh(self, entry: _Entry, **changed: Any) -> None:
        """Remakes the worker's view with ``changed`` fields and its current unsettled picks."""
        v = entry.view._replace(**changed)
        picked = tuple(dict.fromkeys(a for _, a in entry.picks if a)) if v.lora is not None else ()
        entry.view = WorkerView.of(v.worker_id, v.address, v.connected, v.load, v.reported_at, len(entry.picks),
                                   v.weights_id, v.max_model_len, v.model, v.lora, picked,
                                   entry.demand.at(self._clock()))
        self._views[entry.index] = entry.view
        self._columns.set(entry.index, entry.view)


ADAPTER_DEMAND_HALF_LIFE_S = 10.0


class _Demand:
    """Picks per LoRA adapter, each halved every ADAPTER_DEMAND_HALF_LIFE_S."""

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[str, tuple[float, float]] = {}  # adapter -> (count, as of when)

    def add(self, adapter: str, now: float) -> None:
        self._counts[adapter] = (self._decayed(adapter, now) + 1.0, now)

    def at(self, now: float) -> Mapping[str, float]:
        if not self._counts:
            return MappingProxyType({})
        return MappingProxyType({a: self._decayed(a, now) for a in self._counts})

    def _decayed(self, adapter: str, now: float) -> float:
        count, then = self._counts.get(adapter, (0.0, now))
        return count * 0.5 ** (max(now - then, 0.0) / ADAPTER_DEMAND_HALF_LIFE_S)


class _Entry:
    __slots__ = ("demand", "index", "picks", "received", "view")

    def __init__(self, view: WorkerView, index: int) -> None:
        self.view = view                            # the worker as picks see it (remade on change)
        self.index = index                          # its place in the table's list of views
        self.received: int | None = None           # requests_received of the last report
        self.picks: deque[tuple[float, str]] = deque()  # when each unsettled pick was made, its adapter
        self.demand = _Demand()                     # its recent picks per LoRA adapter
