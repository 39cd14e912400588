"""The gateway's worker-selection stage: which worker a request goes to.

Every way below picks among the workers that serve what the request's ``model`` names (its base
model, and its LoRA adapter if it names one; gateway.fleet.FleetView.target): a request never
runs on another model's weights, on a first pick, a failover or a migration.

- The router's pick (the router service over one long-lived stream, or the router's code in this
  process with ``--router embedded``): KV-aware scoring over the live fleet.
- The fleet's only worker, at once, when the fleet view has one that this gateway has not seen
  fail: there is nothing to choose. The router is still told (after the request has gone), so its
  view of the worker's load, its metrics and its span in the trace stay whole.
- While the router is away (unreachable) or late (no answer within ``--pick-timeout-s``): of the
  workers the fleet view last showed serving, not excluded and not seen failing by this gateway,
  the one running the fewest of its requests, at once. A pick carries its deadline, so a router
  that reads it late drops it instead of working it out.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import grpc
from opentelemetry import trace

from meshserve.gateway import metrics
from meshserve.gateway.errors import GatewayError
from meshserve.gateway.fleet import FleetView, Target
from meshserve.gateway.picks import PickFailed, PickRefused, Picks
from meshserve.services import telemetry
from meshserve.services.gen import meshserve_pb2 as pb

log = logging.getLogger(__name__)

SOLE_WORKER = "sole worker"
PICK_FAILURE_LOG_S = 60.0  # a router away or late: warned of at most this often


class Sessions(Protocol):
    """What the selector asks of this gateway's sessions to the workers (gateway.clients.Clients)."""

    def failed(self, address: str) -> bool: ...

    def in_flight(self, address: str) -> int: ...


class WorkerSelector:
    def __init__(self, picks: Picks, fleet: FleetView, clients: Sessions, timeout_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._picks = picks
        self._fleet = fleet
        self._clients = clients
        self._timeout_s = timeout_s
        self._clock = clock
        self._router_ok = True  # warned when the router goes away or falls behind, told when it answers again
        self._warned_at = -PICK_FAILURE_LOG_S
        self._told: set[asyncio.Task[pb.PickResponse | None]] = set()  # picks told, not waited for

    async def pick(self, req: pb.GenerateRequest, exclude: Sequence[str] = ()) -> pb.PickResponse:
        """The worker for ``req``, none of ``exclude``; GatewayError when no worker can take it."""
        target = self.target(req.model, bool(req.lora_path))
        sole = self._fleet.sole(target)
        if not exclude and sole is not None and not self._clients.failed(sole.address):
            metrics.SOLE_WORKER_PICKS.inc()
            return pb.PickResponse(worker_id=sole.worker_id, address=sole.address, reason=SOLE_WORKER)
        pick = await self._ask_router(req, target, exclude)
        assert pick is not None  # a pick waited for is an answer or a GatewayError
        return pick

    def sent(self, pick: pb.PickResponse, req: pb.GenerateRequest) -> None:
        """``req`` went to ``pick``'s worker: a pick the router did not make is told to it now,
        for what ``pick`` chose it for (an adapter of the LoRA registry as loadable)."""
        if pick.reason != SOLE_WORKER:
            return
        try:
            target = self.target(req.model, bool(req.lora_path))
        except GatewayError:  # its workers left since: the router has nothing to count it against
            return
        told = asyncio.get_running_loop().create_task(self._ask_router(req, target, (), waited=False))
        self._told.add(told)
        told.add_done_callback(self._told.discard)

    def target(self, model: str, loadable: bool = False) -> Target:
        """What a request naming ``model`` runs on (``loadable``: an adapter of the gateway's LoRA
        registry, which while no worker holds it runs on the default model's workers, loaded on
        demand); GatewayError UNAVAILABLE when the fleet no longer serves it (its workers left
        after the request was admitted)."""
        target = self._fleet.target(model)
        if target is None and loadable:
            target = Target((self._fleet.target("") or Target()).model, model)
        if target is None:
            raise GatewayError(grpc.StatusCode.UNAVAILABLE, f"no worker serves the model {model!r} any more")
        return target

    def any_worker(self, model: str = "") -> str:
        """The address of a worker to ask what any worker of the base model or adapter ``model``
        can answer (tokenizing: they have its tokenizer); GatewayError UNAVAILABLE when none serves."""
        candidates = self._reachable((), self.target(model))
        if not candidates:
            raise GatewayError(grpc.StatusCode.UNAVAILABLE, "no worker can serve")
        return candidates[0].address

    def serving(self) -> tuple[int, str]:
        """How many workers could take a request now, and why none can when it is 0."""
        if self._fleet.live:
            return (len(self._fleet.serving_workers()),
                    f"the router has {len(self._fleet.workers)} workers, none healthy and undrained")
        return len(self._reachable((), Target())), "router unavailable and no worker reachable without it"

    async def close(self) -> None:
        for told in self._told:
            told.cancel()
        await asyncio.gather(*self._told, return_exceptions=True)

    def _reachable(self, exclude: Sequence[str], target: Target) -> list[pb.WorkerState]:
        """The fleet view's serving workers that serve ``target``, less ``exclude`` and those
        this gateway saw fail, the fewest of its requests first."""
        return sorted((w for w in self._fleet.serving_workers(exclude, target) if not self._clients.failed(w.address)),
                      key=lambda w: self._clients.in_flight(w.address))

    async def _ask_router(self, req: pb.GenerateRequest, target: Target, exclude: Sequence[str], waited: bool = True
                          ) -> pb.PickResponse | None:
        """The router's pick; when the request does not wait for it (``waited`` false: it went to
        the fleet's only worker), None if the router did not answer."""
        try:
            with telemetry.tracer.start_as_current_span("router pick") as span:
                span.set_attributes({"meshserve.router.excluded": len(exclude), "meshserve.router.waited": waited})
                asked = time.perf_counter()
                pick = await self._picks.pick(
                    pb.PickRequest(request_id=req.request_id, prompt=req.prompt, messages=req.messages,
                                   exclude=exclude, session_key=req.user, adapter=target.adapter,
                                   adapter_loadable=bool(req.lora_path), model=target.model,
                                   trace_context=dict(telemetry.outgoing_metadata()),
                                   deadline_unix_ms=int((time.time() + self._timeout_s) * 1000)),
                    self._timeout_s)
                if waited:
                    metrics.PICK_SECONDS.observe(time.perf_counter() - asked)
                span.set_attributes({"meshserve.worker": pick.worker_id, "meshserve.router.reason": pick.reason,
                                     "meshserve.router.predicted_cached_tokens": pick.predicted_cached_tokens})
        except PickFailed as e:
            if not waited:  # the request went on without it; a router that is away shows on the next wait
                log.debug("request %s: the router's pick, not waited for, failed: %s", req.request_id, e.detail)
                return None
            return self._without_router(e, exclude, req, target)
        if not self._router_ok:
            log.info("router is answering in time again")
            self._router_ok = True
        return pick

    def _without_router(self, e: PickFailed, exclude: Sequence[str], req: pb.GenerateRequest, target: Target
                        ) -> pb.PickResponse:
        """A router that is away or late: the request goes to a worker the fleet view shows. One
        that refused (no worker fits) is a refusal still."""
        late = e.code == grpc.StatusCode.DEADLINE_EXCEEDED  # no answer in time, or dropped by a router behind
        if not late and (isinstance(e, PickRefused) or e.code != grpc.StatusCode.UNAVAILABLE):
            raise GatewayError(e.code, f"router: {e.detail}") from None
        candidates = self._reachable(exclude, target)
        if not candidates and req.lora_path:  # an adapter no worker holds: one of its model with LoRA enabled loads it
            candidates = [w for w in self._reachable(exclude, target._replace(adapter="")) if w.HasField("lora")]
        if not candidates:
            raise GatewayError(grpc.StatusCode.UNAVAILABLE, f"router unavailable: {e.detail}") from None
        if self._clock() - self._warned_at >= PICK_FAILURE_LOG_S:
            self._warned_at = self._clock()
            log.warning("%s (%s); picking from the workers of the fleet view",
                        "router late" if late else "router unavailable", e.detail)
        self._router_ok = False
        metrics.FALLBACK_PICKS.inc()
        if late:
            metrics.LATE_PICKS.inc()
        trace.get_current_span().set_attribute("meshserve.router.fallback", "late" if late else "unavailable")
        return pb.PickResponse(worker_id=candidates[0].worker_id, address=candidates[0].address, reason="fallback")
