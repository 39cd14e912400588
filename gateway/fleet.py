"""The gateway's one view of the fleet, pushed by the router (Router/WatchFleet; in process when
the router is embedded): every worker, whether it is healthy and draining, the weights it serves
and its context length. What the gateway asks of the fleet is answered from it:

- the weights the fleet serves: the response cache keys answers by them beyond the model's name,
  so after new weights are rolled out under the same name no request gets the old ones' answers;
- whether the fleet is one worker: a request then has nowhere else to go and is sent there
  without waiting for a pick;
- the workers a request may go to while the router is away, and a worker for tokenizing;
- the LoRA adapters the fleet serves: the names a request's model may give besides the base model.

While the router's stream is down the last view stays; it is reopened with capped backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence

import grpc

from meshserve.services.gen import meshserve_pb2 as pb

log = logging.getLogger(__name__)

FIRST_VIEW_S = 0.5  # how long the first cacheable request waits for the router's first view
NEWER_VIEW_S = 0.5  # how long a lookup of a worker the view does not hold yet waits for the next


class FleetView:
    """Reads the views ``watch()`` yields (a Router/WatchFleet stream, or the embedded router's);
    ``start`` in the event loop, ``close`` to stop."""

    def __init__(self, watch: Callable[[], AsyncIterator[pb.FleetUpdate]], backoff_s: tuple[float, float] = (0.1, 1.0)
                 ) -> None:
        self._watch = watch
        self._backoff_s = backoff_s
        self.workers: tuple[pb.WorkerState, ...] = ()
        self.live = False  # the stream is open and has sent a view
        self._viewed = False  # a view has come, ever
        self._serving: str | None = None
        self._by_id: dict[str, pb.WorkerState] = {}
        self._adapters: dict[str, str] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._listeners: list[Callable[[], None]] = []

    def listen(self, callback: Callable[[], None]) -> None:
        """Calls ``callback`` after each new view."""
        self._listeners.append(callback)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._follow(), name="fleet view")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    # -- what the gateway asks ----------------------------------------------------------------

    async def first_view(self) -> None:
        """Waits for the router's first view, up to FIRST_VIEW_S (a gateway's first requests)."""
        if not self._viewed:
            await self._next_view(FIRST_VIEW_S)

    async def serving(self) -> str | None:
        """The weights id most healthy workers serve ('' when they give none); None while no view
        has had a healthy worker (requests are then not cached)."""
        await self.first_view()
        return self._serving

    async def weights_of(self, worker_id: str) -> str | None:
        """The weights id of worker ``worker_id``; None when the view does not hold it (after
        waiting up to NEWER_VIEW_S for a view that does: a worker newer than the last one)."""
        await self.first_view()
        if worker_id not in self._by_id and self.live:
            await self._next_view(NEWER_VIEW_S)
        state = self._by_id.get(worker_id)
        return None if state is None else state.weights_id

    def sole(self, adapter: str = "") -> pb.WorkerState | None:
        """The fleet's only worker when the view has one, healthy, not draining and serving the
        LoRA ``adapter`` ("": the base model) (a pick has nothing to choose); None otherwise, or
        before the first view."""
        if len(self.workers) == 1 and _serves(self.workers[0]) and holds(self.workers[0], adapter):
            return self.workers[0]
        return None

    def serving_workers(self, exclude: Sequence[str] = (), adapter: str = "") -> list[pb.WorkerState]:
        """The workers of the view that are healthy, not draining and serve the LoRA ``adapter``
        ("": the base model), less those in ``exclude``."""
        return [w for w in self.workers if _serves(w) and w.worker_id not in exclude and holds(w, adapter)]

    def adapters(self) -> dict[str, str]:
        """The LoRA adapters the fleet's workers serve (whether they can take a request now or
        not), name -> path, in the order the view first lists them."""
        return self._adapters

    def sequences(self) -> int:
        """The sequences the serving workers run at once, in all (their max_num_seqs)."""
        return sum(w.load.max_num_seqs for w in self.serving_workers())

    @property
    def max_model_len(self) -> int | None:
        """The workers' context length, as the first of them that says it (every worker serves
        the one model); None before."""
        return next((w.max_model_len for w in self.workers if w.max_model_len), None)

    async def shows(self, check: Callable[[], bool], timeout_s: float) -> bool:
        """Whether ``check()`` holds of the view within ``timeout_s`` (asked again on each new view)."""
        try:
            async with asyncio.timeout(timeout_s):
                while not check():
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True

    # -- following the router -----------------------------------------------------------------

    async def _next_view(self, timeout_s: float) -> None:
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await changed.wait()

    def _apply(self, update: pb.FleetUpdate) -> None:
        self.workers = tuple(update.workers)
        self._by_id = {w.worker_id: w for w in self.workers}
        adapters: dict[str, str] = {}
        for worker in self.workers:
            for adapter in worker.lora.adapters:
                adapters.setdefault(adapter.name, adapter.path)
        self._adapters = adapters
        counts = Counter(w.weights_id for w in self.workers if w.healthy)
        serving = max(sorted(counts), key=counts.__getitem__) if counts else None  # a tie: the first
        if serving is not None:  # none healthy for a moment: the weights the fleet served still key the cache
            if self._serving is not None and serving != self._serving:
                log.info("the fleet serves weights %r now (was %r): the cache answers from their entries",
                         serving, self._serving)
            self._serving = serving
        self._viewed = self.live = True
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        for callback in self._listeners:
            callback()

    async def _follow(self) -> None:
        backoff = self._backoff_s[0]
        while True:
            try:
                async for update in self._watch():
                    self._apply(update)
                    backoff = self._backoff_s[0]
                log.warning("the router ended the fleet stream; keeping the last view and reopening it")
            except grpc.aio.AioRpcError as e:
                log.log(logging.WARNING if self.live else logging.DEBUG,
                        "the router's fleet stream failed (%s); keeping the last view", e.code().name)
            self.live = False
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self._backoff_s[1])


def _serves(worker: pb.WorkerState) -> bool:
    return worker.healthy and not worker.load.draining


def holds(worker: pb.WorkerState, adapter: str) -> bool:
    """Whether ``worker`` serves the LoRA ``adapter`` ("": the base model, which every worker does)."""
    return not adapter or any(a.name == adapter for a in worker.lora.adapters)
