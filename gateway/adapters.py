"""LoRA adapters loaded and unloaded while the mesh serves (the Adapters service: vLLM's
/v1/load_lora_adapter and /v1/unload_lora_adapter), across the workers of one base model.

The base model is the one the request's ``base_model_name`` names, or when it names none the only
one whose workers have LoRA enabled (with several, the caller must choose). A load goes to every
serving worker of it with LoRA enabled, all or none: when one refuses (no adapter in the folder, a
rank above its --max-lora-rank) or cannot be reached, those that loaded it unload it again and the
caller gets the refusal, with vLLM's reason. An unload goes to every worker that holds the adapter
(of the base model named, if one is). Each returns once this gateway's fleet view (pushed by the router from the workers' own
load streams) shows the change, so the next request here is routed by it and /v1/models lists it.
One change at a time per gateway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

import grpc

from meshserve.gateway.errors import GatewayError
from meshserve.gateway.fleet import FleetView, Target, holds
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


class AdapterChanges:
    """Loads and unloads adapters on the workers of ``fleet`` (``worker(address)``: a stub)."""

    def __init__(self, fleet: FleetView, worker: Callable[[str], pb_grpc.WorkerStub], base_model: str,
                 timeout_s: float) -> None:
        self._fleet = fleet
        self._worker = worker
        self._base_model = base_model
        self._timeout_s = timeout_s
        self._one_at_a_time = asyncio.Lock()

    async def load(self, name: str, path: str, base_model: str = "") -> list[str]:
        """Loads ``path`` as ``name`` on every serving worker with LoRA enabled of ``base_model``
        (``_lora_model``); their ids."""
        if not name or not path:
            raise GatewayError(grpc.StatusCode.INVALID_ARGUMENT, "Both 'lora_name' and 'lora_path' must be provided.")
        async with self._one_at_a_time:
            await self._fleet.first_view()
            if name == self._base_model:
                raise GatewayError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"The lora adapter '{name}' conflicts with a served base model.")
            if name in self._fleet.adapters():
                raise GatewayError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"The lora adapter '{name}' has already been loaded.")
            base_model, base = self._lora_model(base_model)
            targets = [w for w in self._fleet.serving_workers(target=base) if w.HasField("lora")]
            if not targets:
                raise GatewayError(grpc.StatusCode.UNAVAILABLE, f"no worker of the base model '{base_model}' "
                                   "with LoRA enabled is serving now (healthy, not draining)")
            request = pb.LoadLoraAdapterRequest(lora_name=name, lora_path=path)
            failures = await self._on_each(targets, lambda stub: stub.LoadLoraAdapter(request, timeout=self._timeout_s))
            if failures:
                loaded = [w for w in targets if w.worker_id not in failures]
                await self._on_each(loaded, lambda stub: stub.UnloadLoraAdapter(
                    pb.UnloadLoraAdapterRequest(lora_name=name), timeout=self._timeout_s))
                raise _refusal(failures, "no worker keeps it")
            await self._until_shown(lambda: all(holds(w, Target(adapter=name)) for w in self._listed(targets)), "load of", name)
            log.info("LoRA adapter %s=%s loaded on %s (base model %s)", name, path,
                     ", ".join(w.worker_id for w in targets), base_model)
            return [w.worker_id for w in targets]

    async def unload(self, name: str, base_model: str = "") -> list[str]:
        """Unloads ``name`` from every worker that holds it, of ``base_model`` when it names one
        (``_lora_model``; a load gives an adapter's name to one base model's workers only, so
        without it the holders are those); their ids."""
        if not name:
            raise GatewayError(grpc.StatusCode.INVALID_ARGUMENT,
                               "'lora_name' needs to be provided to unload a LoRA adapter.")
        async with self._one_at_a_time:
            await self._fleet.first_view()
            base_model, base = self._lora_model(base_model) if base_model else ("any", Target())
            holders = [w for w in self._fleet.workers if w.healthy and holds(w, base._replace(adapter=name))]
            if not holders:
                raise GatewayError(grpc.StatusCode.NOT_FOUND, f"The lora adapter '{name}' cannot be found.")
            request = pb.UnloadLoraAdapterRequest(lora_name=name)
            failures = await self._on_each(holders, lambda stub: stub.UnloadLoraAdapter(request, timeout=self._timeout_s))
            # A worker that does not hold it any more has done what was asked.
            failures = {w: e for w, e in failures.items() if e.code() != grpc.StatusCode.NOT_FOUND}
            if failures:
                raise _refusal(failures, "the others unloaded it")
            await self._until_shown(lambda: not any(holds(w, Target(adapter=name)) for w in self._listed(holders)), "unload of", name)
            log.info("LoRA adapter %s unloaded from %s (base model %s)", name,
                     ", ".join(w.worker_id for w in holders), base_model)
            return [w.worker_id for w in holders]

    def _lora_model(self, asked: str) -> tuple[str, Target]:
        """The base model a change acts on, as /v1/models names it, and its workers: the one
        ``asked`` names (vLLM's ``base_model_name``; the gateway's --model names the default, as
        in a request), or when it names none the only one whose workers have LoRA enabled
        (whether they serve now or not: the choice does not change while a worker drains)."""
        lora = {self._fleet.model_of(w): Target(w.model) for w in self._fleet.workers if w.HasField("lora")}
        if not lora:
            raise GatewayError(grpc.StatusCode.FAILED_PRECONDITION,
                               f"no serving worker has LoRA enabled ({len(self._fleet.workers)} in the fleet): "
                               "start the workers with --enable-lora to load adapters at run time")
        choices = ", ".join(map(repr, lora))
        if not asked:
            if len(lora) > 1:
                raise GatewayError(grpc.StatusCode.INVALID_ARGUMENT,
                                   f"the workers of several base models have LoRA enabled ({choices}): "
                                   "name one in 'base_model_name'")
            model = next(iter(lora))
        else:
            model = self._fleet.models()[0] if asked == self._base_model else asked
        if model not in lora:
            raise GatewayError(grpc.StatusCode.NOT_FOUND, "no worker with LoRA enabled serves the base model "
                               f"{asked!r}; those with LoRA enabled serve {choices}")
        return model, lora[model]

    async def _on_each(self, workers: Sequence[pb.WorkerState],
                       call: Callable[[pb_grpc.WorkerStub], Awaitable[pb.LoraAdapterResponse]]
                       ) -> dict[str, grpc.aio.AioRpcError]:
        """Calls each worker at once; the failures by worker id."""
        results = await asyncio.gather(*(call(self._worker(w.address)) for w in workers), return_exceptions=True)
        failures: dict[str, grpc.aio.AioRpcError] = {}
        for worker, result in zip(workers, results, strict=True):
            if isinstance(result, grpc.aio.AioRpcError):
                failures[worker.worker_id] = result
            elif isinstance(result, BaseException):
                raise result
        return failures

    def _listed(self, workers: Sequence[pb.WorkerState]) -> list[pb.WorkerState]:
        """``workers`` as the fleet view shows them now (those it still holds)."""
        ids = {w.worker_id for w in workers}
        return [w for w in self._fleet.workers if w.worker_id in ids]

    async def _until_shown(self, check: Callable[[], bool], what: str, name: str) -> None:
        if not await self._fleet.shows(check, self._timeout_s):
            raise GatewayError(grpc.StatusCode.DEADLINE_EXCEEDED,
                               f"the workers took the {what} LoRA adapter '{name}', but the router's fleet view "
                               f"did not show it within {self._timeout_s:g}s")


def _refusal(failures: dict[str, grpc.aio.AioRpcError], after: str) -> GatewayError:
    """The caller's answer for the workers that failed: a refusal of the request itself (vLLM's
    reason: the same on every worker) as it is; otherwise the first failure, naming its worker."""
    for error in failures.values():
        if error.code() in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):
            return GatewayError(error.code(), error.details() or "")
    worker, error = next(iter(failures.items()))
    code = error.code()
    if code not in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.DEADLINE_EXCEEDED):
        code = grpc.StatusCode.UNAVAILABLE
    return GatewayError(code, f"worker {worker}: {error.details()}; {after}")


class AdaptersServicer(pb_grpc.AdaptersServicer):
    """Thin: who may change the adapters, then ``AdapterChanges``. Off unless the gateway runs
    with --allow-runtime-lora-updating; with API keys, only for a tenant marked admin=1."""

    def __init__(self, changes: AdapterChanges, allowed: bool,
                 tenant: Callable[[grpc.aio.ServicerContext], Awaitable[str]],
                 admin: Callable[[str], bool] | None) -> None:
        self._changes = changes
        self._allowed = allowed
        self._tenant = tenant
        self._admin = admin  # None: no API keys, every caller is trusted (as with auth off)

    async def LoadLoraAdapter(self, request: pb.LoadLoraAdapterRequest, context: grpc.aio.ServicerContext
                              ) -> pb.LoraAdapterResponse:
        try:
            await self._authorize(context)
            workers = await self._changes.load(request.lora_name, request.lora_path, request.base_model_name)
        except GatewayError as e:
            await context.abort(e.code, e.message)
            raise  # unreachable: abort raises
        return pb.LoraAdapterResponse(message=f"Success: LoRA adapter '{request.lora_name}' added successfully.",
                                      workers=workers)

    async def UnloadLoraAdapter(self, request: pb.UnloadLoraAdapterRequest, context: grpc.aio.ServicerContext
                                ) -> pb.LoraAdapterResponse:
        try:
            await self._authorize(context)
            workers = await self._changes.unload(request.lora_name, request.base_model_name)
        except GatewayError as e:
            await context.abort(e.code, e.message)
            raise  # unreachable: abort raises
        return pb.LoraAdapterResponse(message=f"Success: LoRA adapter '{request.lora_name}' removed successfully.",
                                      workers=workers)

    async def _authorize(self, context: grpc.aio.ServicerContext) -> None:
        if not self._allowed:
            raise GatewayError(grpc.StatusCode.PERMISSION_DENIED,
                               "loading and unloading LoRA adapters at run time is off: start the gateway with "
                               "--allow-runtime-lora-updating (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING)")
        if self._admin is not None and not self._admin(tenant := await self._tenant(context)):
            raise GatewayError(grpc.StatusCode.PERMISSION_DENIED,
                               f"tenant {tenant!r} may not change the fleet's LoRA adapters: only a tenant whose line "
                               "of the API keys file says admin=1")
