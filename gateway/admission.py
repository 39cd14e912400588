"""The gateway's first stage: a request is checked and admitted, or refused at once.

Checked: the request itself (services.validation: every field a client sets, what it may hold:
the gateway's RequestLimits, sizes and counts first, and the model it names: a base model, a
LoRA adapter the fleet serves, or one of the gateway's registry, which a worker loads on demand) and
against its tenant's settings (services.tenants: the priority
it may ask for, its default, the most tokens a choice may ask for); admitted: while fewer than
``max_in_flight`` requests are being served by this gateway; past that bound the caller gets
RESOURCE_EXHAUSTED with a retry hint rather than a place in a queue. (Flow control, gateway.flow,
orders the requests that wait for a place on a saturated fleet.)"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager

import grpc

from meshserve.gateway import metrics
from meshserve.gateway.errors import invalid, overloaded
from meshserve.services import validation
from meshserve.services.config import RequestLimits
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.tenants import DEFAULT, TenantSettings


class Admission:
    def __init__(self, model: str, max_in_flight: int, settings: Callable[[str], TenantSettings] = lambda _: DEFAULT,
                 adapters: Callable[[], Collection[str]] = tuple, limits: RequestLimits | None = None,
                 registry: Callable[[str], str | None] = lambda _: None,
                 models: Callable[[], Sequence[str]] | None = None) -> None:
        self._model = model  # the default: a request that names it, or none, runs on it
        self._adapters = adapters  # the LoRA adapters the fleet serves now
        self._registry = registry  # an adapter's folder, for those a worker may load on demand
        self._models = models or (lambda: [model])  # the base models the fleet serves now
        self._max_in_flight = max_in_flight
        self._settings = settings
        self._limits = limits or RequestLimits()
        self.in_flight = 0

    def checked(self, request: pb.GenerateRequest, tenant: str = "") -> pb.GenerateRequest:
        """A copy of ``request`` the pipeline may change, with an id of the gateway's own that the
        worker (its key for the request), the router, the cache and the logs share, its priority
        (the tenant's default when it asks for none) and as its model the base model or LoRA
        adapter it names (the default model's name is cleared: whatever its workers call it); GatewayError naming the field when it is not a request
        this mesh serves, or not one its tenant may ask.

        A client's ``request_id`` is the client's: it is given back in every chunk (the
        orchestrator) and logged beside the gateway's, never used as a key. Two clients, or two
        tenants, may send the same one at once: each request is keyed by its own id."""
        try:
            validation.validate(request, limits=self._limits)
        except validation.InvalidRequest as e:
            raise invalid(grpc.StatusCode.INVALID_ARGUMENT, str(e), e.param) from None
        if request.continue_token_ids:
            raise invalid(grpc.StatusCode.INVALID_ARGUMENT, "'continue_token_ids' is set by the gateway when it "
                          "migrates a stream; clients may not set it", "continue_token_ids")
        if request.lora_path:
            raise invalid(grpc.StatusCode.INVALID_ARGUMENT, "'lora_path' is set by the gateway from its LoRA "
                          "registry; clients may not set it", "lora_path")
        on_demand = None  # the folder of an adapter no worker holds that the registry has
        if (request.model and request.model != self._model and request.model not in (models := self._models())
                and request.model not in (adapters := self._adapters())):
            on_demand = self._registry(request.model)
            if on_demand is None:
                raise invalid(grpc.StatusCode.NOT_FOUND, validation.unknown_model(request.model, models, adapters),
                              "model")
        own = self._settings(tenant)
        if request.HasField("priority") and request.priority < own.priority:
            raise invalid(grpc.StatusCode.INVALID_ARGUMENT, f"'priority' {request.priority} is more urgent than "
                          f"tenant {tenant or '(anonymous)'} may ask for: {own.priority} or higher", "priority")
        if own.max_tokens and request.HasField("max_tokens") and request.max_tokens > own.max_tokens:
            raise invalid(grpc.StatusCode.INVALID_ARGUMENT, f"'max_tokens' is {request.max_tokens}; tenant "
                          f"{tenant or '(anonymous)'} may ask for at most {own.max_tokens}", "max_tokens")
        req = pb.GenerateRequest()
        req.CopyFrom(request)
        if req.model == self._model:  # the default model: its workers serve it under whatever name
            req.ClearField("model")
        req.request_id = uuid.uuid4().hex
        if on_demand is not None:
            req.lora_path = on_demand
        if not req.HasField("priority"):
            req.priority = own.priority
        if own.max_tokens and not req.HasField("max_tokens") and validation.max_tokens(req) > own.max_tokens:
            req.max_tokens = own.max_tokens  # the default, within the tenant's cap
        return req

    @contextmanager
    def admitted(self) -> Iterator[None]:
        """Holds one of the gateway's places while the request is served; GatewayError
        RESOURCE_EXHAUSTED (with retry-after) when none is free."""
        if self.in_flight >= self._max_in_flight:
            raise overloaded(f"gateway at capacity ({self.in_flight} requests in flight)")
        self.in_flight += 1
        metrics.IN_FLIGHT.inc()
        try:
            yield
        finally:
            self.in_flight -= 1
            metrics.IN_FLIGHT.dec()

