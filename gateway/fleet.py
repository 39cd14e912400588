"""The gateway's one view of the fleet, pushed by the router (Router/WatchFleet; in process when
the router is embedded): every worker, whether it is healthy and draining, the weights it serves
and its context length. What the gateway asks of the fleet is answered from it:

- the weights the fleet serves: the response cache keys answers by them beyond the model's name,
  so after new weights are rolled out under the same name no request gets the old ones' answers;
- whether the fleet is one worker: a request then has nowhere else to go and is sent there
  without waiting for a pick;
- the workers a request may go to while the router is away, and a worker for tokenizing;
- the base models and LoRA adapters the fleet serves: the names a request's ``model`` may give,
  and which workers serve each (``target``). A fleet of one base model is named as the gateway's
  ``--model`` says, whatever its workers call it; a fleet of several is named as its workers do,
  and a request that names none goes to the gateway's ``--model`` (else the first listed).

While the router's stream is down the last view stays; it is reopened with capped backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from typing import NamedTuple

import grpc

from meshserve.services.gen import meshserve_pb2 as pb

log = logging.getLogger(__name__)

FIRST_VIEW_S = 0.5  # how long the first cacheable request waits for the router's first view
NEWER_VIEW_S = 0.5  # how long a lookup of a worker the view does not hold yet waits for the next


class Target(NamedTuple):
    """What a request's ``model`` names, as the workers serving it report it."""

    model: str = ""    # the base model (WorkerInfo.model); "": any worker (a fleet of one base model)
    adapter: str = ""  # the LoRA adapter on it; "": the base model itself


class FleetView:
    """Reads the views ``watch()`` yields (a Router/WatchFleet stream, or the embedded router's);
    ``start`` in the event loop, ``close`` to stop."""

    def __init__(self, watch: Callable[[], AsyncIterator[pb.FleetUpdate]], backoff_s: tuple[float, float] = (0.1, 1.0),
                 model: str = "") -> None:
        self._watch = watch
        self._model = model  # the gateway's --model: the name of a fleet of one base model, the default of several
        self._backoff_s = backoff_s
        self.workers: tuple[pb.WorkerState, ...] = ()
        self.live = False  # the stream is open and has sent a view
        self._viewed = False  # a view has come, ever
        self._serving: dict[str, str] = {}  # base model ("": all workers) -> the weights most of its workers serve
        self._by_id: dict[str, pb.WorkerState] = {}
        self._adapters: dict[str, str] = {}
        self._parents: dict[str, str] = {}  # adapter -> the base model its first worker serves
        self._models: tuple[str, ...] = ()  # the workers' base models, in the order the view first lists them
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

    async def serving(self, model: str = "") -> str | None:
        """The weights id most healthy workers of the base ``model`` serve ("": of all of them; ''
        when they give none); None while no view has had a healthy worker of it (requests are
        then not cached)."""
        await self.first_view()
        return self._serving.get(model)

    def models(self) -> list[str]:
        """The base models a request may name: the gateway's --model for a fleet of one (or
        none yet), else every base model the workers serve, the default first."""
        if len(self._models) <= 1:
            return [self._model]
        default = self._default()
        return [default, *(m for m in self._models if m != default)]

    def parent(self, adapter: str) -> str:
        """The base model, as ``models`` names it, of the LoRA ``adapter`` the fleet serves."""
        return self._parents[adapter] if len(self._models) > 1 else self._model

    def model_of(self, worker: pb.WorkerState) -> str:
        """The base model ``worker`` serves, as ``models`` names it."""
        return worker.model if len(self._models) > 1 else self._model

    def target(self, model: str) -> Target | None:
        """What a request naming ``model`` runs on ("" or the gateway's --model: the default base
        model); None when the fleet serves no base model or adapter of that name."""
        several = len(self._models) > 1
        if not model or model == self._model:
            return Target(self._default() if several else "")
        if model in self._adapters:
            return Target(self._parents[model] if several else "", model)
        if several and model in self._models:
            return Target(model)
        return None

    def _default(self) -> str:
        return self._model if self._model in self._models else self._models[0]

    async def weights_of(self, worker_id: str) -> str | None:
        """The weights id of worker ``worker_id``; None when the view does not hold it (after
        waiting up to NEWER_VIEW_S for a view that does: a worker newer than the last one)."""
        await self.first_view()
        if worker_id not in self._by_id and self.live:
            await self._next_view(NEWER_VIEW_S)
        state = self._by_id.get(worker_id)
        return None if state is None else state.weights_id

    def sole(self, target: Target = Target()) -> pb.WorkerState | None:
        """The fleet's only worker when the view has one, healthy, not draining and serving
        ``target`` (a pick has nothing to choose); None otherwise, or before the first view."""
        if len(self.workers) == 1 and _serves(self.workers[0]) and holds(self.workers[0], target):
            return self.workers[0]
        return None

    def serving_workers(self, exclude: Sequence[str] = (), target: Target = Target()) -> list[pb.WorkerState]:
        """The workers of the view that are healthy, not draining and serve ``target``, less
        those in ``exclude``."""
        return [w for w in self.workers if _serves(w) and w.worker_id not in exclude and holds(w, target)]

    def adapters(self) -> dict[str, str]:
        """The LoRA adapters the fleet's workers serve (whether they can take a request now or
        not), name -> path, in the order the view first lists them."""
        return self._adapters

    def sequences(self) -> int:
        """The sequences the serving workers run at once, in all (their max_num_seqs)."""
        return sum(w.load.max_num_seqs for w in self.serving_workers())

    def max_model_len(self, model: str = "") -> int | None:
        """The context length of the base ``model``'s workers ("": any worker's), as the first of
        them that says it; None before."""
        return next((w.max_model_len for w in self.workers if w.max_model_len and (not model or w.model == model)),
                    None)

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
        parents: dict[str, str] = {}
        for worker in self.workers:
            for adapter in worker.lora.adapters:
                adapters.setdefault(adapter.name, adapter.path)
                parents.setdefault(adapter.name, worker.model)
        self._adapters, self._parents = adapters, parents
        self._models = tuple(dict.fromkeys(w.model for w in self.workers))
        for model in ("", *self._models):
            counts = Counter(w.weights_id for w in self.workers if w.healthy and (not model or w.model == model))
            serving = max(sorted(counts), key=counts.__getitem__) if counts else None  # a tie: the first
            if serving is None:  # none healthy for a moment: the weights it served still key the cache
                continue
            if model in self._serving and serving != self._serving[model]:
                log.info("the fleet serves weights %r%s now (was %r): the cache answers from their entries",
                         serving, f" of {model!r}" if model else "", self._serving[model])
            self._serving[model] = serving
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


def holds(worker: pb.WorkerState, target: Target) -> bool:
    """Whether ``worker`` serves ``target``: its base model, and its LoRA adapter if it names one."""
    return ((not target.model or worker.model == target.model)
            and (not target.adapter or any(a.name == target.adapter for a in worker.lora.adapters)))
