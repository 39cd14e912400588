"""The gateway's request pipeline: validate -> admit -> cache -> pick -> stream (with failover) -> store.

Plain async Python over protobuf messages; the servicer in ``gateway.server`` only maps
``GatewayError`` to a gRPC status.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import redis.exceptions
from opentelemetry import trace

from gateway import metrics
from gateway.breaker import Breaker
from gateway.clients import Clients
from gateway.fleet import FleetView
from gateway.flights import Flight, Flights
from gateway.picks import PickFailed, PickRefused
from gateway.relay import WorkerFailed, add_tool_call_piece, merge
from services import cache_keys, telemetry, validation
from services.config import GatewayConfig
from services.gen import meshserve_pb2 as pb
from services.gen import meshserve_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 2                 # the first worker, then one other after a failure before any token
PICK_TIMEOUT_S = 5.0
HEALTH_TIMEOUT_S = 1.0  # a probe's answer: the router's list, or the gateway's own view
T = TypeVar("T")
TOKENIZE_TIMEOUT_S = 10.0  # a worker tokenizing a prompt (a long chat through its template)
RETRY_AFTER_S = 1
INDEX_TIMEOUT_S = 1.0  # the cache service queueing a stored entry to be indexed by meaning (after the answer)
COALESCED = "coalesced"          # cache_kind of a request that streamed an identical one's answer
# Worker errors that are the request's fault: another worker would say the same.
CLIENT_ERRORS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE})


class GatewayError(Exception):
    """Ends a request with a gRPC status (and optional trailing metadata)."""

    def __init__(
        self, code: grpc.StatusCode, message: str, trailers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = trailers


@dataclass
class _Outcome:
    """What the per-request log line and metrics report."""

    request_id: str
    worker: str = ""
    cached: bool = False
    ttft: float | None = None
    tokens: int = 0
    messages: int = 0
    code: grpc.StatusCode = grpc.StatusCode.OK
    detail: str = ""


def _overloaded(what: str) -> GatewayError:
    return GatewayError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"{what}; retry after {RETRY_AFTER_S}s",
        (("retry-after", str(RETRY_AFTER_S)),),
    )


class Orchestrator:
    """Serves Generate/Complete for the gateway; one instance per gateway process."""

    def __init__(
        self, cfg: GatewayConfig, clients: Clients, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._cfg = cfg
        self._clients = clients
        self._clock = clock
        self._in_flight = 0
        self._flights = Flights()
        metrics.FLIGHTS.set_function(lambda: len(self._flights))
        self._fleet = FleetView(clients.router)  # the weights the cache keys answers by; a fleet of one
        self._told: set[asyncio.Task[pb.PickResponse | None]] = set()  # picks asked, not waited for
        self._router_ok = True  # the same for the router
        self._max_model_len: int | None = None  # the workers' context length, once one said it
        self._breaker = Breaker(cfg.cache_breaker_failures, cfg.cache_breaker_s, clock)
        # A gateway that reads exact entries from Redis itself asks the cache service only by
        # meaning: a cache service that is down or too slow (its embedder behind) then costs the
        # semantic hits, not the exact ones, so its calls have a breaker of their own.
        self._semantic_breaker = (Breaker(cfg.cache_breaker_failures, cfg.cache_breaker_s, clock,
                                          metrics.SEMANTIC_BREAKER_OPEN)
                                  if cfg.redis_url else self._breaker)
        # Per breaker: warn once when its calls start failing, not on every request.
        self._cache_ok = {self._breaker: True, self._semantic_breaker: True}

    async def generate(self, request: pb.GenerateRequest, tenant: str) -> AsyncIterator[pb.GenerateResponse]:
        """Streams the completion of ``request``; raises GatewayError to end with a status."""
        started = self._clock()
        outcome = _Outcome(request.request_id)
        try:
            # 1. Validate, and give the request an id the worker, the cache and the logs share.
            req = self._validated(request)
            outcome.request_id = req.request_id
            # 2. Admission: past the bound, refuse at once rather than queue.
            if self._in_flight >= self._cfg.max_in_flight:
                raise _overloaded(f"gateway at capacity ({self._in_flight} requests in flight)")
            self._in_flight += 1
            metrics.IN_FLIGHT.inc()
            try:
                last = started
                async with aclosing(self._serve(req, tenant, outcome)) as stream:
                    async for chunk in stream:
                        now = self._clock()
                        if outcome.ttft is None:
                            outcome.ttft = now - started
                            metrics.TIME_TO_FIRST_TOKEN.observe(outcome.ttft)
                            trace.get_current_span().add_event("first_token")
                        elif not outcome.cached:
                            metrics.INTER_TOKEN_LATENCY.observe(now - last)
                        last = now
                        outcome.tokens += len(chunk.token_ids)
                        outcome.messages += 1
                        yield chunk
            finally:
                self._in_flight -= 1
                metrics.IN_FLIGHT.dec()
        except GatewayError as e:
            outcome.code, outcome.detail = e.code, e.message
            # Trailers given to abort() replace the x-trace-id set by the tracing interceptor.
            if e.trailers and not any(k == telemetry.TRACE_ID_METADATA for k, _ in e.trailers):
                e.trailers = (*e.trailers, *telemetry.trace_metadata())
            raise
        except (asyncio.CancelledError, GeneratorExit):
            outcome.code = grpc.StatusCode.CANCELLED
            raise
        except BaseException:
            outcome.code = grpc.StatusCode.INTERNAL
            raise
        finally:
            self._finish(outcome, started)

    async def complete(self, request: pb.GenerateRequest, tenant: str) -> pb.CompleteResponse:
        """The same pipeline as ``generate``, aggregated into one message."""
        out = pb.CompleteResponse(request_id=request.request_id)
        texts: list[str] = []
        thinking: list[str] = []
        joined = pb.GenerateResponse()  # its tool_calls: the pieces joined, one per call
        async with aclosing(self.generate(request, tenant)) as stream:
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

    async def close(self) -> None:
        """Lets pending cache stores finish (bounded by the cache timeout), then closes channels."""
        await self._flights.close(self._cfg.cache_timeout_s)
        await self._fleet.close()
        for told in self._told:
            told.cancel()
        await asyncio.gather(*self._told, return_exceptions=True)
        await self._clients.close()

    # -- pipeline steps ---------------------------------------------------------------------------

    def _validated(self, request: pb.GenerateRequest) -> pb.GenerateRequest:
        try:
            validation.validate(request)
        except validation.InvalidRequest as e:
            raise GatewayError(grpc.StatusCode.INVALID_ARGUMENT, str(e), validation.param_metadata(e.param)) from None
        if request.continue_token_ids:
            raise GatewayError(
                grpc.StatusCode.INVALID_ARGUMENT,
                "'continue_token_ids' is set by the gateway when it migrates a stream; clients may not set it",
                validation.param_metadata("continue_token_ids"),
            )
        if request.model and request.model != self._cfg.model:
            raise GatewayError(grpc.StatusCode.NOT_FOUND, validation.unknown_model(request.model, self._cfg.model),
                               validation.param_metadata("model"))
        req = pb.GenerateRequest()
        req.CopyFrom(request)
        if not req.request_id:
            req.request_id = uuid.uuid4().hex
        return req

    async def _serve(
        self, req: pb.GenerateRequest, tenant: str, outcome: _Outcome
    ) -> AsyncIterator[pb.GenerateResponse]:
        mode = validation.cache_mode(req, self._cfg.cache_mode)
        cached = mode != validation.CACHE_OFF and (self._clients.cache is not None or self._cfg.coalesce)
        # The weights the fleet serves are part of the key: none known yet, nothing shared.
        weights = await self._fleet.serving() if cached else None
        if weights is None:
            if cached:
                metrics.WEIGHTS_UNKNOWN.inc()
            # Sampled (or opted out): this request's own generation, nothing shared or stored.
            async with aclosing(self._stream_with_failover(req, outcome)) as stream:
                async for chunk in stream:
                    yield chunk
            return
        # 3. Deterministic: identical requests in flight share one answer (gateway.flights), which
        # is a cache hit or one generation; the leader's flight stores what it generated. The
        # mode is part of the key: an "exact" request must not get a "semantic" one's hit.
        view, exact = self._cache_key(req, tenant, weights)  # for the lookup, the flight and the store
        key = f"{exact}/{mode}" if self._cfg.coalesce else req.request_id  # else a flight of its own
        missed = False
        if self._clients.entries is not None and key not in self._flights:
            # An exact entry the gateway reads itself is answered here, without a flight (a task
            # and a reader's wake-up each): a hit is one Redis GET and one message.
            mark = self._flights.landings
            hit = await self._lookup(view, tenant, mode, exact)
            if hit is not None:
                metrics.CACHE_HITS.labels(hit.kind).inc()
                outcome.cached = True
                yield self._hit_chunk(req, hit)
                return
            # The flight need not read it again: one that started meanwhile is joined, unless it
            # also stored its answer and landed meanwhile (then the flight reads that entry).
            missed = not self._flights.landed_since(key, mark)
        flight, leader = self._flights.join(
            key, req.request_id, lambda f: self._fly(f, req, view, tenant, mode, exact, weights, missed))
        if not leader:
            metrics.COALESCED.inc()
            trace.get_current_span().set_attribute("meshserve.coalesced_with", flight.leader_request_id)
        try:
            async with aclosing(flight.read()) as batches:
                async for batch in batches:
                    outcome.worker = flight.worker
                    outcome.cached = bool(flight.cache_kind)
                    yield self._as_reader(req, flight, batch, leader)
        except GatewayError as e:
            raise GatewayError(e.code, e.message, e.trailers) from None  # one copy per reader
        finally:
            self._flights.leave(flight)

    @staticmethod
    def _hit_chunk(req: pb.GenerateRequest, hit: pb.LookupResponse) -> pb.GenerateResponse:
        """A cache hit's stored answer as one chunk of ``req``, saying how it was answered."""
        chunk = merge(list(hit.chunks))
        chunk.request_id, chunk.cached, chunk.worker = req.request_id, True, ""
        chunk.cache_kind, chunk.cache_age_s, chunk.cache_similarity = hit.kind, hit.age_s, hit.similarity
        return chunk

    @staticmethod
    def _as_reader(
        req: pb.GenerateRequest, flight: Flight, batch: list[pb.GenerateResponse], leader: bool
    ) -> pb.GenerateResponse:
        """A flight's batch as one chunk of this request: its own id, and how it was answered."""
        chunk = merge(batch)
        if leader and not flight.cache_kind:
            return chunk  # the leader's own generation, as the worker sent it
        if chunk is batch[0]:
            chunk = pb.GenerateResponse()
            chunk.CopyFrom(batch[0])
        chunk.request_id = req.request_id
        if flight.cache_kind:
            chunk.cached, chunk.worker = True, ""
            chunk.cache_kind, chunk.cache_age_s = flight.cache_kind, flight.cache_age_s
            chunk.cache_similarity = flight.cache_similarity
        else:
            chunk.cache_kind = COALESCED
        return chunk

    async def _fly(
        self, flight: Flight, req: pb.GenerateRequest, view: pb.GenerateRequest, tenant: str, mode: str, exact: str,
        weights: str, missed: bool = False,
    ) -> None:
        """A flight's task: the cache (unless its exact entry was just ``missed``), else one
        generation, stored once it finished under the weights of the worker that generated it
        (``view`` and ``exact`` are scoped by ``weights``, the fleet's)."""
        outcome = _Outcome(req.request_id)
        try:
            hit = None if missed else await self._lookup(view, tenant, mode, exact)
            if hit is None:
                # A gateway that read the exact entry itself asks by meaning while it generates.
                by_meaning = None
                if self._clients.entries is not None and mode == validation.CACHE_SEMANTIC \
                        and self._semantic_breaker.allow():
                    by_meaning = self._lookup_by_meaning(view, tenant)
                hit = await self._generate_while(flight, req, outcome, by_meaning)
            if hit is not None:
                metrics.CACHE_HITS.labels(hit.kind).inc()
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
        # 6. Store: the readers have their answer already; until the entry is stored, the finished
        # flight answers identical requests from memory; from then on the cache does, while the
        # entry is indexed by meaning (a call to the cache service, off every request's path).
        if flight.chunks[-1].finish_reason not in validation.FINISHED:
            return
        generated_by = await self._fleet.of_worker(flight.worker)
        if generated_by is None:  # a worker the router no longer lists: its weights are not known
            self._flights.landed(flight)
            return
        if generated_by != weights:  # while new weights roll out, another worker's than the fleet's
            view, exact = self._cache_key(req, tenant, generated_by)
        await self._store(view, tenant, mode, exact, flight.chunks, lambda: self._flights.landed(flight))

    async def _generate_while(
        self, flight: Flight, req: pb.GenerateRequest, outcome: _Outcome,
        lookup: Coroutine[Any, Any, pb.LookupResponse | None] | None,
    ) -> pb.LookupResponse | None:
        """Generates ``req`` into ``flight``; with a ``lookup`` (by meaning: an embedding and a
        cache-service call, tens of ms) running meanwhile, so a miss costs the slower of the two,
        not their sum: chunks that come before its answer are held back, a hit cancels the
        generation and is returned (its chunks are the answer), a miss lets the chunks through."""
        held: list[pb.GenerateResponse] | None = [] if lookup is not None else None  # None: let through

        async def generate() -> None:
            async with aclosing(self._stream_with_failover(req, outcome)) as stream:
                async for chunk in stream:
                    flight.worker = outcome.worker
                    if held is None:
                        flight.push(chunk)
                    else:
                        held.append(chunk)

        if lookup is None:
            await generate()
            return None
        generation = asyncio.ensure_future(generate())
        try:
            hit = await lookup
            if hit is not None:
                generation.cancel()
                await asyncio.gather(generation, return_exceptions=True)  # its error, if any, is moot
                return hit
            for chunk in held:
                flight.push(chunk)
            held = None
            await generation
            return None
        finally:
            if not generation.done():  # cancelled meanwhile, or the lookup failed unexpectedly
                generation.cancel()
                await asyncio.gather(generation, return_exceptions=True)

    async def _lookup(
        self, req: pb.GenerateRequest, tenant: str, mode: str, exact: str
    ) -> pb.LookupResponse | None:
        """The cache's answer to ``req`` (None: a miss, or the cache failed): its exact entry
        ``exact`` read from Redis when the gateway has its URL (its match by meaning is then
        ``_lookup_by_meaning``, which ``_fly`` runs while the request is generated), else the cache
        service's, in ``mode``."""
        cache = self._clients.cache
        if cache is None or not self._breaker.allow():
            return None
        entries = self._clients.entries
        if entries is None:
            with telemetry.tracer.start_as_current_span("cache lookup") as span:
                return await self._ask_cache(req, tenant, mode, False, span, self._breaker)
        with telemetry.tracer.start_as_current_span("cache read") as span:
            started = time.perf_counter()
            try:
                entry = await entries.get(exact)
            except (redis.exceptions.RedisError, TimeoutError) as e:
                metrics.CACHE_READS.labels("error").inc()
                span.set_attribute("meshserve.cache.result", "error")
                self._cache_failed("lookup", req, f"Redis: {type(e).__name__}: {e}")
                return None
            metrics.CACHE_READ_SECONDS.observe(time.perf_counter() - started)
            metrics.CACHE_READS.labels("miss" if entry is None else "hit").inc()
            self._cache_worked()
            span.set_attributes({"meshserve.cache.result": "miss" if entry is None else "hit",
                                 "meshserve.cache.kind": cache_keys.KIND_EXACT})
        if entry is None:
            return None
        return pb.LookupResponse(hit=True, kind=cache_keys.KIND_EXACT, chunks=entry.chunks,
                                 age_s=max(0.0, time.time() - entry.stored_at))

    async def _lookup_by_meaning(self, req: pb.GenerateRequest, tenant: str) -> pb.LookupResponse | None:
        """The cache service's semantic match for ``req``, whose exact entry the gateway missed."""
        with telemetry.tracer.start_as_current_span("cache lookup") as span:
            return await self._ask_cache(req, tenant, validation.CACHE_SEMANTIC, True, span, self._semantic_breaker)

    async def _ask_cache(
        self, req: pb.GenerateRequest, tenant: str, mode: str, exact_missed: bool, span: trace.Span, breaker: Breaker
    ) -> pb.LookupResponse | None:
        """The cache service's answer (None: a miss, or it failed: counted by ``breaker``)."""
        assert self._clients.cache is not None
        try:
            resp = await self._clients.cache.Lookup(
                pb.LookupRequest(request=req, tenant=tenant, mode=mode, exact_missed=exact_missed),
                timeout=self._cfg.cache_timeout_s,
                metadata=telemetry.outgoing_metadata(),
            )
        except grpc.aio.AioRpcError as e:
            span.set_attribute("meshserve.cache.result", "error")
            self._cache_failed("lookup", req, f"{e.code().name} {e.details()}", breaker)
            return None
        self._cache_worked(breaker)
        hit = resp.hit and bool(resp.chunks)
        span.set_attributes({"meshserve.cache.result": "hit" if hit else "miss",
                             "meshserve.cache.kind": resp.kind or mode})
        if hit and resp.similarity:
            span.set_attribute("meshserve.cache.similarity", resp.similarity)
        return resp if hit else None

    def _cache_key(self, req: pb.GenerateRequest, tenant: str, weights_id: str) -> tuple[pb.GenerateRequest, str]:
        """The request as the cache keys it, and its entry's Redis key: an unnamed model is the
        served model, and the weights that answer it are part of the model's name
        (``name@weights_id``) when the workers say which (WorkerInfo.weights_id): new weights under
        the same name have entries of their own."""
        model = req.model or self._cfg.model
        if weights_id:
            model = f"{model}@{weights_id}"
        view = req
        if model != req.model:
            view = pb.GenerateRequest()
            view.CopyFrom(req)
            view.model = model
        return view, cache_keys.exact_key(view, tenant, self._cfg.cache_key_prefix)

    async def weights(self) -> str | None:
        """The weights the fleet serves (WorkerInfo.weights_id; '' when its workers give none, None
        before the router listed a healthy worker): what the cache keys answers by."""
        return await self._fleet.serving()

    async def serving_workers(self) -> tuple[int, str]:
        """How many workers could take a request now, and why none can when it is 0: the
        router's healthy, undrained workers or, while the router is away, those this gateway
        would pick without it."""
        try:
            listed = await self._clients.router.ListWorkers(pb.ListWorkersRequest(), timeout=HEALTH_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            reachable = self._clients.reachable()
            return reachable, f"router unavailable ({e.code().name}) and no worker reachable without it"
        serving = sum(1 for w in listed.workers if w.healthy and not w.load.draining)
        return serving, f"the router has {len(listed.workers)} workers, none healthy and undrained"

    async def max_model_len(self) -> int | None:
        """The workers' context length, as a worker says (every worker serves the one model);
        None while none can be asked. Asked once, then remembered."""
        if self._max_model_len is None:
            with contextlib.suppress(GatewayError, grpc.aio.AioRpcError):
                info = await (await self._any_worker()).Info(pb.InfoRequest(), timeout=HEALTH_TIMEOUT_S)
                self._max_model_len = info.max_model_len
        return self._max_model_len

    async def tokenize(self, request: pb.GenerateRequest) -> pb.TokenizeResponse:
        """The prompt token ids a worker's engine would get for ``request``."""
        return await self._ask_worker(lambda w: w.Tokenize(request, timeout=TOKENIZE_TIMEOUT_S))

    async def detokenize(self, request: pb.DetokenizeRequest) -> pb.DetokenizeResponse:
        return await self._ask_worker(lambda w: w.Detokenize(request, timeout=TOKENIZE_TIMEOUT_S))

    async def _ask_worker(self, call: Callable[[pb_grpc.WorkerStub], Awaitable[T]]) -> T:
        """``call`` on a worker (any: every worker has the model's tokenizer); its failure as a
        GatewayError."""
        worker = await self._any_worker()
        try:
            return await call(worker)
        except grpc.aio.AioRpcError as e:
            param = validation.param_of(e.trailing_metadata())
            raise GatewayError(e.code(), e.details() or e.code().name, validation.param_metadata(param)) from None

    async def _any_worker(self) -> pb_grpc.WorkerStub:
        """A healthy worker, from the router's list or, while the router is away, one this
        gateway reaches; GatewayError UNAVAILABLE when there is none."""
        try:
            listed = await self._clients.router.ListWorkers(pb.ListWorkersRequest(), timeout=HEALTH_TIMEOUT_S)
            addresses = [w.address for w in listed.workers if w.healthy and not w.load.draining]
        except grpc.aio.AioRpcError:
            pick = self._clients.fallback(())
            addresses = [pick.address] if pick is not None else []
        if not addresses:
            raise GatewayError(grpc.StatusCode.UNAVAILABLE, "no worker can serve")
        return self._clients.worker(addresses[0])

    async def _pick(self, req: pb.GenerateRequest, exclude: Sequence[str]) -> pb.PickResponse:
        """The worker for ``req``: the router's pick; or, when the fleet is one worker (healthy and
        undrained in the router's last list) that this gateway's session to has not seen fail,
        that worker at once: the router is still asked, off the request's path, so its view of
        the worker's load, its metrics and its span in the trace stay whole."""
        if not exclude and (sole := self._fleet.sole()) is not None and not self._clients.failed(sole[1]):
            only = pb.PickResponse(worker_id=sole[0], address=sole[1], reason="sole worker")
            self._clients.picked(only)
            metrics.SOLE_WORKER_PICKS.inc()
            told = asyncio.get_running_loop().create_task(self._tell_router(req))
            self._told.add(told)
            told.add_done_callback(self._told.discard)
            return only
        pick = await self._ask_router(req, exclude)
        assert pick is not None  # a pick waited for is an answer or a GatewayError
        return pick

    async def _tell_router(self, req: pb.GenerateRequest) -> pb.PickResponse | None:
        await asyncio.sleep(0)  # the request's own message to its worker goes first
        return await self._ask_router(req, (), waited=False)

    async def _ask_router(
        self, req: pb.GenerateRequest, exclude: Sequence[str], waited: bool = True
    ) -> pb.PickResponse | None:
        """The router's pick; when the request does not wait for it (``waited`` false: it went to
        the fleet's only worker), None if the router did not answer."""
        try:
            with telemetry.tracer.start_as_current_span("router pick") as span:
                span.set_attributes({"meshserve.router.excluded": len(exclude), "meshserve.router.waited": waited})
                asked = time.perf_counter()
                pick = await self._clients.picks.pick(
                    pb.PickRequest(request_id=req.request_id, prompt=req.prompt, messages=req.messages,
                                   exclude=exclude, session_key=req.user,
                                   trace_context=dict(telemetry.outgoing_metadata())),
                    PICK_TIMEOUT_S,
                )
                if waited:
                    metrics.PICK_SECONDS.observe(time.perf_counter() - asked)
                span.set_attributes({"meshserve.worker": pick.worker_id,
                                     "meshserve.router.reason": pick.reason,
                                     "meshserve.router.predicted_cached_tokens": pick.predicted_cached_tokens})
                self._clients.picked(pick)
                if not self._router_ok:
                    log.info("router is answering again")
                    self._router_ok = True
                return pick
        except PickFailed as e:
            if not waited:  # the request went on without it; a router that is away shows on the next wait
                log.debug("request %s: the router's pick, not waited for, failed: %s", req.request_id, e.detail)
                return None
            if isinstance(e, PickRefused):  # the router answered: a refusal stays one
                raise GatewayError(e.code, f"router: {e.detail}") from None
            if e.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise GatewayError(e.code, f"router: {e.detail}") from None
            # The router is away (restarting, rescheduled): serve on the workers it named before.
            fallback = self._clients.fallback(exclude)
            if fallback is None:
                raise GatewayError(grpc.StatusCode.UNAVAILABLE, f"router unavailable: {e.detail}") from None
            if self._router_ok:
                log.warning("router unavailable (%s); picking from the workers it named before", e.detail)
                self._router_ok = False
            metrics.FALLBACK_PICKS.inc()
            trace.get_current_span().set_attribute("meshserve.router.fallback", True)
            return fallback

    async def _stream_with_failover(
        self, req: pb.GenerateRequest, outcome: _Outcome
    ) -> AsyncIterator[pb.GenerateResponse]:
        """The request's stream from a worker. A worker that fails before the first token is
        replaced (failover, once); one lost after it is continued on another (``_migrate``)."""
        exclude: list[str] = []
        for attempt in range(1, MAX_ATTEMPTS + 1):
            pick = await self._pick(req, exclude)
            outcome.worker = pick.worker_id
            streamed: list[int] = []  # the token ids the client has: what a continuation starts from
            forwarded = 0
            try:
                async with aclosing(self._stream_worker(pick, req, attempt)) as stream:
                    async for chunk in stream:
                        forwarded += 1
                        streamed.extend(chunk.token_ids)
                        yield chunk
                return
            except WorkerFailed as e:
                exclude.append(pick.worker_id)
                if forwarded:
                    async with aclosing(self._migrate(req, outcome, streamed, pick.worker_id, e, exclude)) as rest:
                        async for chunk in rest:
                            yield chunk
                    return
                if e.code in CLIENT_ERRORS:
                    raise GatewayError(e.code, e.detail, validation.param_metadata(e.param)) from None
                if attempt == MAX_ATTEMPTS:
                    what = (
                        f"worker {pick.worker_id} failed before the first token, after a failover: {e.detail}"
                    )
                    if e.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                        raise _overloaded(what) from None
                    raise GatewayError(grpc.StatusCode.UNAVAILABLE, what) from None
                log.warning("request %s: worker %s failed before the first token (%s: %s); failing over",
                            req.request_id, pick.worker_id, e.code.name, e.detail)
                metrics.FAILOVERS.inc()

    async def _migrate(
        self, req: pb.GenerateRequest, outcome: _Outcome, streamed: list[int], lost: str, error: WorkerFailed,
        exclude: list[str],
    ) -> AsyncIterator[pb.GenerateResponse]:
        """Continues a stream whose worker was lost mid-stream on another worker: the same request
        with the token ids the client already has put after its prompt; that worker generates
        and sends only the rest, so the client's stream goes on with no gap and no duplicate.
        Bounded: at most --migrations moves, each continuation's first token within
        --migration-timeout-s of the loss; then UNAVAILABLE."""
        migrations = 0
        lost_at = self._clock()
        while True:
            what = f"worker lost mid-stream ({lost}: {error.code.name}: {error.detail}) after {len(streamed)} tokens"
            if error.code in CLIENT_ERRORS:
                raise GatewayError(error.code, error.detail, validation.param_metadata(error.param)) from None
            if req.parse_tool_calls:  # its tool-call parser's state was in the lost worker
                metrics.MIGRATIONS.labels("failed").inc()
                raise GatewayError(grpc.StatusCode.UNAVAILABLE,
                                   f"{what}; a stream whose tool calls a worker parses cannot move to another")
            if migrations == self._cfg.migrations:
                metrics.MIGRATIONS.labels("failed").inc()
                raise GatewayError(grpc.StatusCode.UNAVAILABLE,
                                   f"{what}, and no worker could continue the stream "
                                   f"({migrations} of at most {self._cfg.migrations} migrations tried)")
            migrations += 1
            log.warning("request %s: %s; continuing it on another worker", req.request_id, what)
            cont = pb.GenerateRequest()
            cont.CopyFrom(req)
            cont.continue_token_ids[:] = streamed
            continued = False
            try:
                left = self._cfg.migration_timeout_s - (self._clock() - lost_at)
                try:
                    async with asyncio.timeout(max(left, 0.0)):
                        pick = await self._pick(cont, exclude)
                except TimeoutError:
                    raise WorkerFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "no worker picked in time") from None
                except GatewayError as e:  # no worker left to continue on, or no router
                    raise WorkerFailed(grpc.StatusCode.UNAVAILABLE, e.message) from None
                outcome.worker = lost = pick.worker_id
                exclude.append(pick.worker_id)  # should this one fail too, the next goes elsewhere
                left = self._cfg.migration_timeout_s - (self._clock() - lost_at)
                async with aclosing(self._stream_worker(pick, cont, MAX_ATTEMPTS + migrations, max(left, 0.001))) as stream:
                    async for chunk in stream:
                        if not continued:
                            continued = True
                            metrics.MIGRATIONS.labels("ok").inc()
                            metrics.MIGRATION_GAP.observe(self._clock() - lost_at)
                        streamed.extend(chunk.token_ids)
                        yield chunk
                return
            except WorkerFailed as e:
                error = e
                if continued:  # lost again, later: a new splice with a budget of its own
                    lost_at = self._clock()

    async def _stream_worker(
        self, pick: pb.PickResponse, req: pb.GenerateRequest, attempt: int, first_token_s: float | None = None
    ) -> AsyncIterator[pb.GenerateResponse]:
        """One request's stream from its worker, over the gateway's session to it (deltas that
        queued while the client side was busy come merged); any failure, silence included,
        becomes WorkerFailed."""
        # Not the current span: this generator yields, so it must not attach contexts.
        span = telemetry.tracer.start_span(
            "worker stream",
            attributes={"meshserve.worker": pick.worker_id, "meshserve.worker.address": pick.address,
                        "meshserve.attempt": attempt, "meshserve.continued_tokens": len(req.continue_token_ids)},
        )
        trace_context = dict(telemetry.outgoing_metadata(trace.set_span_in_context(span)))
        stream = self._clients.session(pick.address).start(req, trace_context, self._cfg.first_token_timeout_s,
                                                           first_token_s)
        last: pb.GenerateResponse | None = None
        tokens = 0
        try:
            while (msg := await stream.next()) is not None:
                if last is None:
                    span.add_event("first_token")
                last = msg
                tokens += len(msg.token_ids)
                yield msg
            if last is None or not last.finish_reason:
                raise WorkerFailed(grpc.StatusCode.UNAVAILABLE, "stream ended without a finish_reason")
            span.set_attribute("meshserve.finish_reason", last.finish_reason)
        except WorkerFailed as e:
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{e.code.name}: {e.detail}"))
            raise
        finally:
            # Covers the client going away while we wait at `yield`: the worker aborts the request.
            stream.close()
            span.set_attribute("meshserve.tokens", tokens)
            span.end()

    async def _store(
        self, req: pb.GenerateRequest, tenant: str, mode: str, exact: str, chunks: list[pb.GenerateResponse],
        stored: Callable[[], None],
    ) -> None:
        """Stores a finished generation: in Redis by the gateway itself when it has the cache's
        URL (then, for a semantic request, the cache service indexes it by meaning), else by the
        cache service. ``stored()`` as soon as the entry is written (or the attempt is over)."""
        if self._clients.cache is None or not self._breaker.allow():
            stored()
            return
        with telemetry.tracer.start_as_current_span("cache store") as span:
            entries = self._clients.entries
            if entries is not None:
                try:
                    reason = await entries.put(exact, req, chunks)
                except (redis.exceptions.RedisError, TimeoutError) as e:
                    metrics.CACHE_WRITES.labels("error").inc()
                    span.set_attribute("meshserve.cache.result", "error")
                    self._cache_failed("store", req, f"Redis: {type(e).__name__}: {e}")
                    return
                finally:
                    stored()
                self._cache_worked()
                metrics.CACHE_WRITES.labels("refused" if reason else "stored").inc()
                span.set_attribute("meshserve.cache.result", "refused" if reason else "stored")
                if reason:
                    log.debug("request %s: not cached: %s", req.request_id, reason)
                elif mode == validation.CACHE_SEMANTIC and not self._semantic_breaker.is_open:
                    await self._index(req, tenant)
                return
            try:
                resp = await self._clients.cache.Store(
                    pb.StoreRequest(request=req, tenant=tenant, chunks=chunks),
                    timeout=self._cfg.cache_timeout_s,
                    metadata=telemetry.outgoing_metadata(),
                )
            except grpc.aio.AioRpcError as e:
                span.set_attribute("meshserve.cache.result", "error")
                self._cache_failed("store", req, f"{e.code().name} {e.details()}")
                return
            finally:
                stored()
            span.set_attribute("meshserve.cache.result", "stored" if resp.stored else "refused")
        self._cache_worked()
        if not resp.stored:
            log.debug("request %s: not cached: %s", req.request_id, resp.reason)

    async def _index(self, req: pb.GenerateRequest, tenant: str) -> None:
        """Asks the cache service to index an entry the gateway stored by meaning. After the answer
        and off every request's path: a failure loses a future semantic hit, costs no request
        anything, and does not count for the breaker (lookups do; while theirs is open, none is sent)."""
        assert self._clients.cache is not None
        try:
            await self._clients.cache.Store(pb.StoreRequest(request=req, tenant=tenant, index_only=True),
                                            timeout=INDEX_TIMEOUT_S, metadata=telemetry.outgoing_metadata())
        except grpc.aio.AioRpcError as e:
            metrics.CACHE_ERRORS.labels("index").inc()
            log.debug("request %s: not indexed by meaning: %s %s", req.request_id, e.code().name, e.details())

    def _cache_failed(self, op: str, req: pb.GenerateRequest, detail: str, breaker: Breaker | None = None) -> None:
        breaker = breaker or self._breaker
        metrics.CACHE_ERRORS.labels(op).inc()
        level = logging.WARNING if self._cache_ok[breaker] else logging.DEBUG
        self._cache_ok[breaker] = False
        log.log(level, "request %s: cache %s failed, serving uncached: %s", req.request_id, op, detail)
        if breaker.failed():
            what = "semantic lookups'" if breaker is not self._breaker else "cache"
            log.warning("%s breaker open: %d cache calls failed in a row; not making them for %gs",
                        what, self._cfg.cache_breaker_failures, self._cfg.cache_breaker_s)

    def _cache_worked(self, breaker: Breaker | None = None) -> None:
        breaker = breaker or self._breaker
        breaker.worked()
        if not self._cache_ok[breaker]:
            log.info("%s answering again", "the cache service is" if breaker is not self._breaker else "cache is")
            self._cache_ok[breaker] = True

    def _finish(self, outcome: _Outcome, started: float) -> None:
        e2e = self._clock() - started
        metrics.REQUESTS.labels(outcome.code.name).inc()
        metrics.E2E_REQUEST_LATENCY.observe(e2e)
        source = "cache" if outcome.cached else "engine"
        metrics.OUTPUT_TOKENS.labels(source).inc(outcome.tokens)
        metrics.STREAM_MESSAGES.labels(source).inc(outcome.messages)
        if outcome.ttft is not None and outcome.tokens > 1 and not outcome.cached:
            metrics.TIME_PER_OUTPUT_TOKEN.observe((e2e - outcome.ttft) / (outcome.tokens - 1))
        span = trace.get_current_span()  # the gateway's span of this call (tracing interceptor)
        if span.is_recording():
            span.set_attributes({
                "meshserve.request_id": outcome.request_id,
                "meshserve.worker": outcome.worker,
                "meshserve.cached": outcome.cached,
                "meshserve.tokens": outcome.tokens,
                "meshserve.e2e_s": e2e,
                "meshserve.status": outcome.code.name,
            })
            if outcome.ttft is not None:
                span.set_attribute("meshserve.ttft_s", outcome.ttft)
        # Refusals come in floods under overload: counted in REQUESTS{code}, logged at DEBUG only.
        level = logging.DEBUG if outcome.code == grpc.StatusCode.RESOURCE_EXHAUSTED else logging.INFO
        log.log(
            level,
            "request %s worker=%s cached=%s ttft=%s tokens=%d e2e=%.3fs status=%s%s",
            outcome.request_id or "-",
            outcome.worker or "-",
            outcome.cached,
            "-" if outcome.ttft is None else f"{outcome.ttft:.3f}s",
            outcome.tokens,
            e2e,
            outcome.code.name,
            f" ({outcome.detail})" if outcome.detail else "",
        )
