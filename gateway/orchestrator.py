"""The gateway's request pipeline, one stage a module:

    Admission (+ tenant limits) -> ResponseCache -> Coalescer -> flow control -> WorkerSelector
    -> StreamSupervisor -> store; each client request's usage -> the ledger

Plain async Python over protobuf messages; the servicers in ``gateway.server`` and
``gateway.openai_servicer`` only map ``GatewayError`` to a status.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, aclosing, asynccontextmanager, nullcontext
from typing import TypeVar

import grpc

from meshserve.gateway import metrics
from meshserve.gateway.admission import Admission
from meshserve.gateway.clients import Clients
from meshserve.gateway.coalescer import Coalescer, generate_while
from meshserve.gateway.errors import GatewayError, invalid
from meshserve.gateway.fleet import FleetView
from meshserve.gateway.flights import Flight
from meshserve.gateway.flow import FlowController
from meshserve.gateway.ledger import Bill, Ledger, Sent
from meshserve.gateway.limits import Limits
from meshserve.gateway.registry import LoraRegistry
from meshserve.gateway.relay import add_tool_call_piece
from meshserve.gateway.response_cache import CacheKey, ResponseCache
from meshserve.gateway.selector import WorkerSelector
from meshserve.gateway.stream_supervisor import Place, StreamSupervisor
from meshserve.services import cache_keys, telemetry, tenants, validation
from meshserve.services.config import GatewayConfig
from meshserve.services.offload import Offload
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.request_record import RequestRecord, Timings

log = logging.getLogger(__name__)

T = TypeVar("T")
TOKENIZE_TIMEOUT_S = 10.0  # a worker tokenizing a prompt (a long chat through its template)
TIMINGS = Timings(metrics.TIME_TO_FIRST_TOKEN, metrics.INTER_TOKEN_LATENCY, metrics.E2E_REQUEST_LATENCY,
                  metrics.TIME_PER_OUTPUT_TOKEN)


class Orchestrator:
    """Serves Generate/Complete for the gateway; one instance per gateway process (``start`` it
    in the event loop)."""

    def __init__(self, cfg: GatewayConfig, clients: Clients, clock: Callable[[], float] = time.monotonic) -> None:
        self._cfg = cfg
        self._clients = clients
        self._clock = clock
        self.fleet = FleetView(clients.watch_fleet, model=cfg.model)
        self.tenants = tenants.load_keys(cfg.api_keys_file)  # each tenant's settings
        registry = LoraRegistry(cfg.lora_registry).path if cfg.lora_registry else (lambda _: None)
        self._admission = Admission(cfg.model, cfg.max_in_flight, self.tenants.of, self.fleet.adapters, cfg, registry,
                                    self.fleet.models)
        redis = cache_keys.connect(cfg.redis_url, socket_timeout_s=cfg.limits_timeout_s) if cfg.redis_url else None
        self._limits = Limits(self.tenants.of, redis, cfg.tenant_key_prefix, cfg.flow_fleet_share,
                              cfg.limits_timeout_s, clock)
        self.ledger = Ledger(redis, cfg.tenant_key_prefix, cfg.limits_timeout_s)
        self._redis = redis
        self._flow: FlowController | None = None
        if cfg.flow_control == "on":
            best = min((s.priority for s in self.tenants.settings.values()), default=tenants.DEFAULT.priority)
            self._flow = FlowController(self._places, lambda t: self.tenants.of(t).weight,
                                        min(best, tenants.DEFAULT.priority), cfg.flow_max_queued,
                                        cfg.flow_max_wait_s, clock, cfg.flow_headroom)
            self.fleet.listen(self._flow.pump)
        self._cache = ResponseCache(cfg, clients.cache, clients.entries, clock)
        self._coalescer = Coalescer()
        self._selector = WorkerSelector(clients.picks, self.fleet, clients, cfg.pick_timeout_s, clock)
        self._streams = StreamSupervisor(self._selector, clients, cfg, clock)
        # A large request (a long prompt, a JSON schema) is checked off the event loop.
        self.checks = Offload("gateway-checks")
        metrics.FLIGHTS.set_function(lambda: len(self._coalescer))

    def start(self) -> None:
        self.fleet.start()
        self._limits.start()
        self.ledger.start()

    @asynccontextmanager
    async def account(self, reqs: Sequence[pb.GenerateRequest], tenant: str) -> AsyncIterator[Bill]:
        """One client request of ``reqs`` choices (OpenAI's ``n``; 1 otherwise), admitted within its
        tenant's limits (GatewayError when one is exceeded); when it ends, its reservation is settled
        to the usage it was sent (the bill its choices are generated into) and that usage goes to
        the ledger."""
        reservation = await self._limits.admit(reqs, tenant)
        bill = Bill.of(len(reqs))
        try:
            yield bill
        finally:
            self._limits.settle(reservation, bill.tokens(validation.prompt_tokens_estimate(reqs[0])))
            self.ledger.add(tenant, bill)

    def _own_account(self, req: pb.GenerateRequest, tenant: str, sent: Sent | None
                     ) -> AbstractAsyncContextManager[Sent]:
        """``sent`` (a choice of a request accounted for by the caller), or ``req``'s own account."""
        if sent is not None:
            return nullcontext(sent)

        @asynccontextmanager
        async def own() -> AsyncIterator[Sent]:
            async with self.account([req], tenant) as bill:
                yield bill.choices[0]

        return own()

    async def generate(self, request: pb.GenerateRequest, tenant: str, sent: Sent | None = None
                       ) -> AsyncIterator[pb.GenerateResponse]:
        """Streams the completion of ``request``; raises GatewayError to end with a status.
        ``sent``: where the chunks are tallied when ``request`` is a choice of a client request the
        caller accounts for (``account``); else the request is its own.

        1. Admission: the request is checked and given an id of the gateway's (the client's own,
           if it sent one, is what its chunks carry), then admitted (within the gateway's bound and
           its tenant's limits) or refused at once.
        2. A deterministic request's answer is shared: the cache's, or the one generation of its
           identical requests in flight (a flight), stored once finished.
        3. Otherwise (sampled, or the cache off) the request is streamed from a worker the
           selector picks, failed over and migrated by the stream supervisor.
        """
        record = RequestRecord("", TIMINGS, self._clock)  # ids once checked: a client's may be any text
        status, detail = grpc.StatusCode.OK, ""
        last: pb.GenerateResponse | None = None
        try:
            if request.model and request.model != self._cfg.model and self.fleet.target(request.model) is None:
                await self.fleet.first_view()  # a gateway's first requests: the model it names may be there
            req = await self.checks.run(validation.check_cost(request), self._admission.checked, request, tenant)
            record.request_id = req.request_id
            record.client_request_id = request.request_id
            shown = request.request_id or req.request_id  # the id the client knows its chunks by
            with self._admission.admitted():
                async with self._own_account(req, tenant, sent) as tally, \
                        aclosing(await self._answer(req, tenant, record)) as chunks:
                    async for chunk in chunks:
                        if last is None:
                            record.cached = chunk.cached  # an answer from the cache is all cached
                        last = chunk
                        record.output(len(chunk.token_ids))
                        # A chunk of this request's own generation may be its flight's too (the
                        # leader's): relabelled with the leader's id, which readers relabel again.
                        if chunk.request_id != shown:
                            chunk.request_id = shown
                        tally.add(chunk)
                        yield chunk
        except GatewayError as e:
            status, detail = e.code, e.message
            # Trailers given to abort() replace the x-trace-id set by the tracing interceptor.
            if e.trailers and not any(k == telemetry.TRACE_ID_METADATA for k, _ in e.trailers):
                e.trailers = (*e.trailers, *telemetry.trace_metadata())
            raise
        except (asyncio.CancelledError, GeneratorExit):
            status = grpc.StatusCode.CANCELLED
            raise
        except BaseException:
            status = grpc.StatusCode.INTERNAL
            raise
        finally:
            if last is not None:
                record.worker = last.worker or record.worker  # the worker that finished it (a migrated stream's last)
                record.prompt_tokens = last.usage.prompt_tokens
            self._finish(record, status, detail)

    async def _answer(self, req: pb.GenerateRequest, tenant: str, record: RequestRecord
                      ) -> AsyncGenerator[pb.GenerateResponse, None]:
        """Where ``req``'s chunks come from: a flight (shared) or the stream supervisor (its own)."""
        mode = validation.cache_mode(req, self._cfg.cache_mode)
        shared = mode != validation.CACHE_OFF and (self._cache.available or self._cfg.coalesce)
        # The weights the fleet serves are part of the key: none known yet, nothing shared.
        # (Those of the request's base model: each model's answers are keyed by its own.)
        weights = None
        if shared:
            await self.fleet.first_view()
            weights = await self.fleet.serving(self._selector.target(req.model, bool(req.lora_path)).model)
        if weights is None:
            if shared:
                metrics.WEIGHTS_UNKNOWN.inc()
            return self._streams.stream(req, lambda pick: setattr(record, "worker", pick.worker_id),
                                        self._place(req, tenant))
        key = self._cache.key(req, tenant, mode, weights)
        flight = key.flight if self._cfg.coalesce else req.request_id  # else a flight of its own
        read = functools.partial(self._cache.read, key) if self._cache.reads_entries else None
        return self._coalescer.answer(req, flight, read, functools.partial(self._fly, req=req, key=key))

    async def _fly(self, flight: Flight, missed: bool, *, req: pb.GenerateRequest, key: CacheKey) -> None:
        """A flight's task: the cache (unless it was just read and ``missed``), else one
        generation (looked up by meaning meanwhile), stored once finished under the weights of
        the worker that generated it."""
        try:
            hit = None if missed else await self._cache.read(key)
            if hit is None:
                generation = self._streams.stream(req, lambda pick: setattr(flight, "worker", pick.worker_id),
                                                  self._place(req, key.tenant))
                hit = await generate_while(flight, generation, self._cache.by_meaning(key))
            if hit is not None:
                flight.cache_kind, flight.cache_age_s, flight.cache_similarity = hit.kind, hit.age_s, hit.similarity
                for stored in hit.chunks:
                    flight.push(stored)
                flight.finish()
                return
        except GatewayError as e:
            flight.finish(e)
            return
        except asyncio.CancelledError:
            flight.finish(GatewayError(grpc.StatusCode.CANCELLED, "every request waiting for this answer left"))
            raise
        except Exception as e:
            log.exception("request %s: generation failed", req.request_id)
            flight.finish(GatewayError(grpc.StatusCode.INTERNAL, f"generation failed: {e}"))
            return
        flight.finish()
        # Store: the readers have their answer already; until it is stored, the finished flight
        # answers identical requests from memory; from then on the cache does.
        if flight.chunks[-1].finish_reason not in validation.FINISHED:
            return
        generated_by = await self.fleet.weights_of(flight.worker)
        if generated_by is None:  # a worker the fleet view no longer holds: its weights are not known
            self._coalescer.landed(flight)
            return
        if generated_by != key.weights:  # while new weights roll out, another worker's than the fleet's
            key = self._cache.key(req, key.tenant, key.mode, generated_by)
        await self._cache.store(key, flight.chunks, lambda: self._coalescer.landed(flight))

    def _place(self, req: pb.GenerateRequest, tenant: str) -> Place | None:
        """A place on the fleet for ``req``'s generation (None: flow control off)."""
        if self._flow is None:
            return None
        return self._flow.place(tenant, req.priority, validation.prompt_tokens_estimate(req), validation.max_tokens(req))

    def _places(self) -> int:
        """Generations this gateway may keep running on the fleet: its share of the serving
        workers' sequences (0: none serving, or their sizes not known yet)."""
        return math.ceil(self.fleet.sequences() * self._cfg.flow_fleet_share)

    async def complete(self, request: pb.GenerateRequest, tenant: str, sent: Sent | None = None
                       ) -> pb.CompleteResponse:
        """The same pipeline as ``generate``, aggregated into one message."""
        out = pb.CompleteResponse(request_id=request.request_id)
        texts: list[str] = []
        thinking: list[str] = []
        joined = pb.GenerateResponse()  # its tool_calls: the pieces joined, one per call
        async with aclosing(self.generate(request, tenant, sent)) as stream:
            async for chunk in stream:
                texts.append(chunk.text)
                thinking.append(chunk.reasoning)
                out.token_ids.extend(chunk.token_ids)
                out.logprobs.extend(chunk.logprobs)
                for piece in chunk.tool_calls:
                    add_tool_call_piece(joined.tool_calls, piece)
                out.request_id, out.cached, out.worker = chunk.request_id, chunk.cached, chunk.worker
                out.cache_kind, out.cache_age_s = chunk.cache_kind, chunk.cache_age_s
                out.cache_similarity = chunk.cache_similarity
                if chunk.finish_reason:
                    out.finish_reason = chunk.finish_reason
                if chunk.HasField("usage"):
                    out.usage.CopyFrom(chunk.usage)
        out.text = "".join(texts)
        out.reasoning = "".join(thinking)
        out.tool_calls.extend(pb.ToolCall(id=c.id, name=c.name, arguments=c.arguments)
                              for c in sorted(joined.tool_calls, key=lambda c: c.index))
        return out

    # -- what the OpenAI edge asks besides generations ---------------------------------------------

    async def weights(self, model: str = "") -> str | None:
        """The weights the fleet serves for a request naming ``model`` (WorkerInfo.weights_id; ''
        when its workers give none, None before the fleet view has a healthy worker of it): what
        the cache keys answers by."""
        target = self.fleet.target(model)
        return None if target is None else await self.fleet.serving(target.model)

    async def serving_workers(self) -> tuple[int, str]:
        """How many workers could take a request now, and why none can when it is 0."""
        await self.fleet.first_view()
        return self._selector.serving()

    async def models(self) -> list[str]:
        """The base models the fleet serves, the default first (after the fleet view's first view)."""
        await self.fleet.first_view()
        return self.fleet.models()

    async def adapters(self) -> dict[str, str]:
        """The LoRA adapters the fleet serves, name -> path (after the fleet view's first view)."""
        await self.fleet.first_view()
        return self.fleet.adapters()

    def parent(self, adapter: str) -> str:
        """The base model (as ``models`` names it) of a LoRA adapter ``adapters`` lists."""
        return self.fleet.parent(adapter)

    async def max_model_len(self, model: str = "") -> int | None:
        """The context length of the workers of ``model``, a base model ``models`` lists ("": the
        default); None while the fleet view has no worker that says it."""
        await self.fleet.first_view()
        target = self.fleet.target(model)
        return None if target is None else self.fleet.max_model_len(target.model)

    async def tokenize(self, request: pb.GenerateRequest) -> pb.TokenizeResponse:
        """The prompt token ids a worker's engine would get for ``request`` (one of its model's)."""
        return await self._ask_worker(request.model, lambda w: w.Tokenize(request, timeout=TOKENIZE_TIMEOUT_S))

    async def detokenize(self, request: pb.DetokenizeRequest) -> pb.DetokenizeResponse:
        return await self._ask_worker(request.model, lambda w: w.Detokenize(request, timeout=TOKENIZE_TIMEOUT_S))

    async def _ask_worker(self, model: str, call: Callable[[pb_grpc.WorkerStub], Awaitable[T]]) -> T:
        """``call`` on a worker of ``model`` (any of them: they have its tokenizer); its failure
        as a GatewayError."""
        await self.fleet.first_view()
        worker = self._clients.worker(self._selector.any_worker(model))
        try:
            return await call(worker)
        except grpc.aio.AioRpcError as e:
            raise invalid(e.code(), e.details() or e.code().name, validation.param_of(e.trailing_metadata())) from None

    async def close(self) -> None:
        """Lets pending cache stores finish (bounded by the cache timeout), then closes channels."""
        await self._coalescer.close(self._cfg.cache_timeout_s)
        await self._limits.close()
        await self.ledger.close()
        if self._redis is not None:
            await self._redis.aclose()
        await self.fleet.close()
        await self._selector.close()
        await self._clients.close()
        self.checks.close()

    def _finish(self, record: RequestRecord, status: grpc.StatusCode, detail: str) -> None:
        metrics.REQUESTS.labels(status.name).inc()
        source = "cache" if record.cached else "engine"
        metrics.OUTPUT_TOKENS.labels(source).inc(record.tokens)
        metrics.STREAM_MESSAGES.labels(source).inc(record.messages)
        # Refusals come in floods under overload: counted in REQUESTS{code}, logged at DEBUG only.
        level = logging.DEBUG if status == grpc.StatusCode.RESOURCE_EXHAUSTED else logging.INFO
        record.finish(log, status.name, detail, level)
