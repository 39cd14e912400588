"""The fleet as the router sees it, pushed to every gateway (Router/WatchFleet): each watcher gets
the whole view when it starts watching, again at once when the fleet's shape changes (a worker
joins or leaves, connects or disconnects, turns healthy or stale, drains, changes weights, model
or adapters), and otherwise at most every ``load_interval_s`` while the workers' load changes."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator, Callable, Sequence

import prometheus_client

from meshserve.router.state import WorkerTable, WorkerView
from meshserve.router.watcher import load_to_pb, lora_to_pb
from meshserve.services.gen import meshserve_pb2 as pb

WATCHERS = prometheus_client.Gauge("meshserve_router_fleet_watchers", "Streams the fleet view is pushed on")
UPDATES = prometheus_client.Counter("meshserve_router_fleet_updates_total", "Fleet views pushed, all watchers")

LOAD_INTERVAL_S = 1.0  # a view with new load only, at most this often
# How often a watcher looks at the table between changes it is told of: a worker turns stale by
# the clock alone (its reports stop), with no event to say so.
CHECK_S = 0.25


def worker_state(view: WorkerView, healthy: bool) -> pb.WorkerState:
    state = pb.WorkerState(worker_id=view.worker_id, address=view.address, healthy=healthy,
                           assigned_unreported=view.assigned_unreported, weights_id=view.weights_id,
                           max_model_len=view.max_model_len, model=view.model)
    if view.lora is not None:
        state.lora.CopyFrom(lora_to_pb(view.lora))
    if view.load is not None:
        state.load.CopyFrom(load_to_pb(view.worker_id, view.load))
    return state


def _shape(workers: Sequence[tuple[WorkerView, bool]]) -> tuple[tuple[object, ...], ...]:
    """What a gateway must learn of at once: everything about the workers but their load."""
    return tuple((v.worker_id, v.address, healthy, v.load is not None and v.load.draining, v.weights_id,
                  v.max_model_len, v.model, v.lora) for v, healthy in workers)


class FleetFeed:
    """Pushes ``workers()`` (every worker's view and whether it is healthy) to each watcher."""

    def __init__(self, table: WorkerTable, workers: Callable[[], list[tuple[WorkerView, bool]]],
                 load_interval_s: float = LOAD_INTERVAL_S, check_s: float = CHECK_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._workers = workers
        self._load_interval_s = load_interval_s
        self._check_s = check_s
        self._clock = clock
        self._changed = asyncio.Event()
        table.listen(self._wake)

    def _wake(self) -> None:
        # Watchers wait on the event they saw; a fresh one is armed for the next change.
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def updates(self) -> AsyncIterator[pb.FleetUpdate]:
        """The views for one watcher, until it stops reading."""
        shape: tuple[tuple[object, ...], ...] | None = None
        sent_at = -math.inf
        WATCHERS.inc()
        try:
            while True:
                changed = self._changed
                workers = self._workers()
                now_shape = _shape(workers)
                if now_shape != shape or self._clock() - sent_at >= self._load_interval_s:
                    shape, sent_at = now_shape, self._clock()
                    UPDATES.inc()
                    yield pb.FleetUpdate(workers=[worker_state(v, healthy) for v, healthy in workers])
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._check_s):
                        await changed.wait()
        finally:
            WATCHERS.dec()
