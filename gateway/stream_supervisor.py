"""The gateway's streaming stage: a request's tokens from a worker, whatever happens to it.

A worker that fails before the first token is replaced (failover, once). One lost after it (its
stream ended badly or went silent) is continued on another: the same request with the token ids
the client already has put after its prompt, so the client's stream goes on with no gap and no
duplicate (migration). Bounded: at most ``--migrations`` moves, each continuation's first token
within ``--migration-timeout-s`` of the loss; past that the stream ends with a clear error.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import aclosing
from typing import Protocol

import grpc
from opentelemetry import trace

from meshserve.gateway import metrics
from meshserve.gateway.errors import CLIENT_ERRORS, GatewayError, invalid, overloaded
from meshserve.gateway.relay import StreamFailed, WorkerFailed
from meshserve.services import telemetry
from meshserve.services.config import GatewayConfig
from meshserve.services.gen import meshserve_pb2 as pb

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 2  # the first worker, then one other after a failure before any token

Picked = Callable[[pb.PickResponse], None]  # told of each worker the request goes to
# A place on the fleet (gateway.flow): held while the stream lasts; told the tokens it generated.
Place = contextlib.AbstractAsyncContextManager[Callable[[int], None]]


def _unsettled(tokens: int) -> None:
    """No place held (flow control off): nothing to settle."""


class Selector(Protocol):
    """Where workers come from (gateway.selector.WorkerSelector)."""

    async def pick(self, req: pb.GenerateRequest, exclude: Sequence[str] = ()) -> pb.PickResponse: ...

    def sent(self, pick: pb.PickResponse, req: pb.GenerateRequest) -> None: ...


class RequestStream(Protocol):
    async def next(self) -> pb.GenerateResponse | None: ...

    def close(self) -> None: ...


class Session(Protocol):
    def start(self, request: pb.GenerateRequest, trace_context: dict[str, str], silence_s: float,
              first_s: float | None = None) -> RequestStream: ...


class Sessions(Protocol):
    """This gateway's session to each worker (gateway.clients.Clients)."""

    def session(self, address: str) -> Session: ...


class StreamSupervisor:
    def __init__(self, selector: Selector, clients: Sessions, cfg: GatewayConfig,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._selector = selector
        self._clients = clients
        self._cfg = cfg
        self._clock = clock

    async def stream(self, req: pb.GenerateRequest, picked: Picked, place: Place | None = None
                     ) -> AsyncIterator[pb.GenerateResponse]:
        """``req``'s stream, failed over before its first token and migrated after it; with a
        ``place`` (flow control), held from before the first pick to the end, and told the tokens
        the stream used."""
        async with place or contextlib.nullcontext(_unsettled) as settle:
            streamed: list[int] = []  # the token ids the client has: what a continuation starts from
            try:
                exclude: list[str] = []
                for attempt in range(1, MAX_ATTEMPTS + 1):
                    pick = await self._selector.pick(req, exclude)
                    picked(pick)
                    forwarded = False
                    try:
                        async with aclosing(self._from_worker(pick, req, attempt)) as chunks:
                            async for chunk in chunks:
                                forwarded = True
                                streamed.extend(chunk.token_ids)
                                yield chunk
                        return
                    except WorkerFailed as e:
                        exclude.append(pick.worker_id)
                        if forwarded:
                            lost = e
                            break
                        self._failed_before_first_token(req, pick, e, last=attempt == MAX_ATTEMPTS)
                async with aclosing(self._migrate(req, streamed, pick.worker_id, lost, exclude, picked)) as rest:
                    async for chunk in rest:
                        yield chunk
            finally:
                settle(len(streamed))

    @staticmethod
    def _failed_before_first_token(req: pb.GenerateRequest, pick: pb.PickResponse, e: WorkerFailed,
                                   last: bool) -> None:
        """Counts a failover, or ends the request when there is none to make."""
        if e.code in CLIENT_ERRORS:
            raise invalid(e.code, e.detail, e.param)
        if last:
            what = f"worker {pick.worker_id} failed before the first token, after a failover: {e.detail}"
            if e.code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise overloaded(what)
            raise GatewayError(grpc.StatusCode.UNAVAILABLE, what)
        log.warning("request %s: worker %s failed before the first token (%s: %s); failing over",
                    req.request_id, pick.worker_id, e.code.name, e.detail)
        metrics.FAILOVERS.inc()

    async def _migrate(
        self, req: pb.GenerateRequest, streamed: list[int], lost: str, error: StreamFailed, exclude: list[str],
        picked: Picked,
    ) -> AsyncIterator[pb.GenerateResponse]:
        """Continues on another worker a stream whose worker ``lost`` failed with ``error``."""
        migrations = 0
        lost_at = self._clock()
        while True:
            what = f"worker lost mid-stream ({lost}: {error.code.name}: {error.detail}) after {len(streamed)} tokens"
            if error.code in CLIENT_ERRORS:
                raise invalid(error.code, error.detail, error.param)
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
            pick = await self._pick_within(cont, exclude, self._left(lost_at))
            if isinstance(pick, StreamFailed):  # no worker to continue on (yet): another try, if any is left
                error = pick
                continue
            picked(pick)
            lost = pick.worker_id
            exclude.append(lost)  # should this one fail too, the next goes elsewhere
            continued = False
            try:
                async with aclosing(self._from_worker(pick, cont, MAX_ATTEMPTS + migrations,
                                                      max(self._left(lost_at), 0.001))) as chunks:
                    async for chunk in chunks:
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

    def _left(self, lost_at: float) -> float:
        """What is left of a continuation's budget for its first token."""
        return self._cfg.migration_timeout_s - (self._clock() - lost_at)

    async def _pick_within(self, req: pb.GenerateRequest, exclude: Sequence[str], left_s: float
                           ) -> pb.PickResponse | StreamFailed:
        """A worker to continue on, or why there is none within ``left_s``."""
        try:
            async with asyncio.timeout(max(left_s, 0.0)):
                return await self._selector.pick(req, exclude)
        except TimeoutError:
            return StreamFailed(grpc.StatusCode.DEADLINE_EXCEEDED, "no worker picked in time")
        except GatewayError as e:  # no worker left to continue on, or no router
            return StreamFailed(grpc.StatusCode.UNAVAILABLE, e.message)

    async def _from_worker(
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
        self._selector.sent(pick, req)
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
