"""The gateway's view of the fleet, as the router lists its workers (at most a second old):

- the weights the fleet serves (``WorkerState.weights_id``): the response cache keys answers by
  them beyond the model's name, so after new weights are rolled out under the same name no
  request is answered with the old weights' completions;
- whether the fleet is one worker: then a request has nowhere else to go, and the gateway sends
  it there without waiting for the router's pick (``Orchestrator._pick``)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Callable
from typing import Protocol

import grpc

from services.gen import meshserve_pb2 as pb

log = logging.getLogger(__name__)

REFRESH_S = 1.0       # how old the list may get before a request asks for a new one (off its path)
LIST_TIMEOUT_S = 0.5  # the router's answer; the first cacheable request of a gateway waits for it


class _Lister(Protocol):
    async def ListWorkers(self, request: pb.ListWorkersRequest, *, timeout: float | None = None
                          ) -> pb.ListWorkersResponse: ...


class FleetView:
    """The weights id most healthy workers serve, each worker's, and the fleet's only worker when
    it has one; listed again once the list is ``refresh_s`` old, by a task of its own: only a
    gateway's first cacheable request waits for a list."""

    def __init__(self, router: _Lister, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._router = router
        self._refresh_s = refresh_s
        self._clock = clock
        self._serving: str | None = None  # None: no healthy worker listed yet
        self._by_worker: dict[str, str] = {}
        self._sole: tuple[str, str] | None = None  # (id, address) of a fleet of one, healthy and undrained
        self._listed_at = -math.inf
        self._listing: asyncio.Task[None] | None = None

    async def serving(self) -> str | None:
        """The weights id the fleet serves ('' when its workers give none); None while the router
        has listed no healthy worker to this gateway (its requests are then not cached)."""
        self._refresh_if_old()
        if self._serving is None:
            await self.listed()
        return self._serving

    def sole(self) -> tuple[str, str] | None:
        """(id, address) of the fleet's only worker when the router's last list has one worker,
        healthy and not draining: a pick has nothing to choose. None otherwise, or before a list."""
        self._refresh_if_old()
        return self._sole

    async def of_worker(self, worker_id: str) -> str | None:
        """The weights id of the worker ``worker_id`` (None: not in the router's list)."""
        if worker_id not in self._by_worker:
            self._listed_at = -math.inf  # a worker newer than the list
            self._refresh_if_old()
            await self.listed()
        return self._by_worker.get(worker_id)

    async def listed(self) -> None:
        """Waits for the list being asked for, if any (not cancelling it when cancelled)."""
        if self._listing is not None:
            await asyncio.shield(self._listing)

    def _refresh_if_old(self) -> None:
        if self._clock() - self._listed_at >= self._refresh_s and (self._listing is None or self._listing.done()):
            self._listed_at = self._clock()  # one list at a time, and none more often than refresh_s
            self._listing = asyncio.get_running_loop().create_task(self._list(), name="fleet list")

    async def _list(self) -> None:
        try:
            listed = await self._router.ListWorkers(pb.ListWorkersRequest(), timeout=LIST_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            log.debug("the router did not list the workers (%s); keeping what it listed before", e.code().name)
            return
        self._by_worker = {w.worker_id: w.weights_id for w in listed.workers}
        only = listed.workers[0] if len(listed.workers) == 1 else None
        self._sole = (only.worker_id, only.address) if only and only.healthy and not only.load.draining else None
        counts = Counter(w.weights_id for w in listed.workers if w.healthy)
        if counts:
            serving = max(sorted(counts), key=counts.__getitem__)  # the most workers'; a tie, the first
            if serving != self._serving and self._serving is not None:
                log.info("the fleet serves weights %r now (was %r): the cache answers from their entries",
                         serving, self._serving)
            self._serving = serving

    async def close(self) -> None:
        if self._listing is not None and not self._listing.done():
            self._listing.cancel()
            await asyncio.gather(self._listing, return_exceptions=True)
