"""The worker's Session stream: many requests over one long-lived call from a gateway.

Each ``generate`` in the stream (alone in a message, or in a batch of actions) runs the worker's
own Generate handler (same validation, admission, engine path, metrics and SERVER span,
"Worker/Generate", continuing the trace the request carries); one writer sends whatever all of
them produced since its last message as one ``SessionResponse``. Under load every running
request gets a token per engine step, so a step becomes one message, not one per request; a lone
request still gets each token at once.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import grpc
from opentelemetry import trace

from meshserve.services import telemetry, validation
from meshserve.services.config import SESSION_BATCH_HEADER
from meshserve.services.gen import meshserve_pb2 as pb

log = logging.getLogger(__name__)

SPAN_NAME = "Worker/Generate"  # the same span as a Generate call's, so a trace reads the same
Generate = Callable[[pb.GenerateRequest, Any], AsyncIterator[pb.GenerateResponse]]


class RequestAborted(grpc.aio.AbortError):
    """A session request ended by ``context.abort``: reported to the gateway, the session goes on."""

    def __init__(self, code: grpc.StatusCode, details: str, trailing_metadata: Any = ()) -> None:
        super().__init__(details)
        self.code = code
        self.details = details
        self.param = validation.param_of(trailing_metadata)


class RequestContext:
    """What a Generate handler uses of its ServicerContext, for one request of a session."""

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise RequestAborted(code, details, trailing_metadata)


class Session:
    """Serves one Session call. ``generate``: the worker's Generate handler. ``ended``: true once
    the worker drains; an idle session then ends, so shutting down waits for no idle gateway."""

    def __init__(self, generate: Generate, ended: Callable[[], bool]) -> None:
        self._generate = generate
        self._ended = ended
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._deltas: list[pb.GenerateResponse] = []
        self._errors: list[pb.SessionError] = []
        self._changed = asyncio.Event()
        self._reading = True

    def wake(self) -> None:
        """Something changed (output, a request done, the worker draining): the writer looks."""
        self._changed.set()

    async def serve(self, requests: AsyncIterator[pb.SessionRequest], context: grpc.aio.ServicerContext) -> None:
        await context.send_initial_metadata(((SESSION_BATCH_HEADER, "1"),))  # the gateway may batch
        reader = asyncio.create_task(self._read(requests))
        try:
            while True:
                await self._changed.wait()
                self._changed.clear()
                if self._deltas or self._errors:
                    out = pb.SessionResponse(deltas=self._deltas, errors=self._errors)
                    self._deltas, self._errors = [], []
                    await context.write(out)
                    continue  # more may have come meanwhile
                if not self._tasks and (not self._reading or self._ended()):
                    return
        finally:
            reader.cancel()
            tasks = [reader, *self._tasks.values()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _read(self, requests: AsyncIterator[pb.SessionRequest]) -> None:
        try:
            async for msg in requests:
                for one in msg.batch or (msg,):
                    action = one.WhichOneof("action")
                    if action == "generate":
                        self._start(one.generate, one.trace_context)
                    elif action == "cancel" and (task := self._tasks.get(one.cancel)) is not None:
                        task.cancel()
        except grpc.aio.AioRpcError:  # the gateway went away: serve() ends with the call
            pass
        finally:
            self._reading = False
            self.wake()

    def _start(self, request: pb.GenerateRequest, trace_context: Any) -> None:
        request_id = request.request_id
        if not request_id or request_id in self._tasks:
            self._fail(request_id, grpc.StatusCode.INVALID_ARGUMENT,
                       f"request id {request_id!r} is empty or already running on this session", "request_id")
            return
        parent = telemetry.incoming_context(trace_context.items())
        task = self._tasks[request_id] = asyncio.create_task(self._run(request, parent), name=f"session {request_id}")
        task.add_done_callback(lambda _: self._done(request_id))

    def _done(self, request_id: str) -> None:
        # Here, not in _run: a request cancelled before its task ran (a cancel in the same batch)
        # never enters _run. The entry is this task's: _start refuses an id while it is running.
        del self._tasks[request_id]
        self.wake()

    async def _run(self, request: pb.GenerateRequest, parent: Any) -> None:
        request_id = request.request_id
        attributes = {"rpc.system": "grpc", "rpc.method": "/meshserve.v1.Worker/Session"}
        with telemetry.server_span(SPAN_NAME, parent, attributes) as span:
            try:
                async with aclosing(self._generate(request, RequestContext())) as stream:
                    async for chunk in stream:
                        self._deltas.append(chunk)
                        self._changed.set()
            except RequestAborted as e:
                span.set_attribute("rpc.grpc.status_code", e.code.value[0])
                span.set_status(trace.Status(trace.StatusCode.ERROR, f"{e.code.name}: {e.details}"))
                self._fail(request_id, e.code, e.details, e.param)
            except asyncio.CancelledError as e:  # by the gateway: no one to tell
                telemetry.mark_failed(span, e)
                raise
            except Exception as e:  # a bug: this request fails, the session goes on
                telemetry.mark_failed(span, e)
                log.exception("request %s failed on its session", request_id)
                self._fail(request_id, grpc.StatusCode.INTERNAL, f"worker failed: {e}")

    def _fail(self, request_id: str, code: grpc.StatusCode, message: str, param: str | None = None) -> None:
        self._errors.append(pb.SessionError(request_id=request_id, code=code.value[0], message=message,
                                            param=param or ""))
        self.wake()
