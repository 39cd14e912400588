"""The router's live view of the workers: last load report, connection state and the picks each
worker has not reported yet. Policies read immutable snapshots of it; watchers and picks write it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple


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


class WorkerView(NamedTuple):
    """One worker as the policies see it at the moment of a pick (a tuple: a router with
    hundreds of workers makes one per worker per pick)."""

    worker_id: str
    address: str
    connected: bool = False              # its WatchLoad stream is open
    load: WorkerLoad | None = None       # the last report (None before the first)
    report_age_s: float | None = None    # seconds since that report
    assigned_unreported: int = 0         # picks the worker has not reported receiving

    @property
    def outstanding(self) -> int:
        """Requests the worker holds or is about to receive. Streams the worker accepted but its
        engine has not queued yet count too (``num_in_flight``), so the larger figure wins."""
        engine = 0
        if self.load is not None:
            engine = max(self.load.num_running + self.load.num_waiting, self.load.num_in_flight)
        return engine + self.assigned_unreported

    def is_healthy(self, stale_after_s: float) -> bool:
        """Connected, and its last report is fresh."""
        return self.connected and self.report_age_s is not None and self.report_age_s <= stale_after_s


class WorkerTable:
    """Every known worker, keyed by address (from discovery); ids come from the workers.

    Picks count against a worker until its reports show them arrived: each report carries the
    number of requests the worker has received, and every new one settles the oldest pick. A
    report sent before a pick arrived therefore leaves it counted. A pick that never arrives
    (its caller gave up first) stops counting after ``pick_ttl_s``."""

    def __init__(
        self, addresses: list[str], clock: Callable[[], float] = time.monotonic, pick_ttl_s: float = 2.0
    ) -> None:
        self._clock = clock
        self._pick_ttl_s = pick_ttl_s
        self._workers = {a: _Entry(WorkerView(worker_id=a, address=a)) for a in addresses}

    def addresses(self) -> list[str]:
        return list(self._workers)

    def add(self, address: str) -> None:
        """A new worker: unconnected and unreported until its watcher says otherwise."""
        if address not in self._workers:
            self._workers[address] = _Entry(WorkerView(worker_id=address, address=address))

    def remove(self, address: str) -> None:
        """Forgets the worker: its view and its unsettled picks."""
        self._workers.pop(address, None)

    def snapshot(self) -> list[WorkerView]:
        now = self._clock()
        views = []
        for e in self._workers.values():
            while e.picks and e.picks[0] < now - self._pick_ttl_s:
                e.picks.popleft()
            v = e.view
            views.append(WorkerView(
                v.worker_id, v.address, v.connected, v.load,
                None if e.reported_at is None else now - e.reported_at, len(e.picks),
            ))
        return views

    def on_connected(self, address: str, worker_id: str) -> None:
        entry = self._workers[address]
        entry.view = entry.view._replace(worker_id=worker_id or address, connected=True)
        entry.received = None  # the next report starts the count on this stream

    def on_report(self, address: str, load: WorkerLoad) -> None:
        entry = self._workers[address]
        entry.reported_at = self._clock()
        if entry.received is None or load.requests_received < entry.received:
            # A new stream (or a restarted worker): its load includes whatever arrived.
            entry.picks.clear()
        else:
            for _ in range(min(load.requests_received - entry.received, len(entry.picks))):
                entry.picks.popleft()
        entry.received = load.requests_received
        entry.view = entry.view._replace(load=load)

    def on_disconnected(self, address: str) -> None:
        entry = self._workers[address]
        entry.view = entry.view._replace(connected=False)

    def on_assigned(self, address: str) -> None:
        self._workers[address].picks.append(self._clock())


class _Entry:
    __slots__ = ("view", "reported_at", "received", "picks")

    def __init__(self, view: WorkerView) -> None:
        self.view = view
        self.reported_at: float | None = None
        self.received: int | None = None           # requests_received of the last report
        self.picks: deque[float] = deque()          # when each unsettled pick was made
