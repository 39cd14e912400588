"""How the gateway talks to a worker: one long-lived Session stream per worker, shared by every
request sent there (worker/session.py is the other end), and each request's deltas handed to the
client side as they come.

Two things keep the cost per token low. On the session, one message carries every delta the
worker produced since its previous message, for all requests: under load, one message per
engine step instead of one per token per request, and no call set-up per request. And for each
request, what queued while the client side was busy writing is handed over as one merged message
(vLLM's output collector does the same for DELTA outputs), so a busy gateway sends fewer, larger
messages instead of falling further behind. No interval is fixed: nothing waits to merge.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import grpc
from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from meshserve.services.config import SESSION_BATCH_HEADER
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

STATUS_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}  # a status sent as a number


class StreamFailed(Exception):
    """What a long-lived stream reported for one request, or why it could not: a status."""

    def __init__(self, code: grpc.StatusCode, detail: str, param: str | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail
        self.param = param  # INVALID_ARGUMENT: the request field at fault


class WorkerFailed(StreamFailed):
    """A request's stream from its worker ended badly: an error, silence, or a lost session."""


def merge(chunks: list[pb.GenerateResponse]) -> pb.GenerateResponse:
    """Consecutive deltas of one request as one: texts, thinking, token ids, logprobs and tool-call
    pieces joined; request id, worker, finish reason and usage from the last."""
    if len(chunks) == 1:
        return chunks[0]
    last = chunks[-1]
    out = pb.GenerateResponse(request_id=last.request_id, text="".join(c.text for c in chunks),
                              finish_reason=last.finish_reason, cached=last.cached, worker=last.worker,
                              reasoning="".join(c.reasoning for c in chunks))
    for c in chunks:
        out.token_ids.extend(c.token_ids)
        out.logprobs.extend(c.logprobs)
        for piece in c.tool_calls:
            add_tool_call_piece(out.tool_calls, piece)
    if last.HasField("usage"):
        out.usage.CopyFrom(last.usage)
    return out


def add_tool_call_piece(calls: RepeatedCompositeFieldContainer[pb.ToolCallDelta], piece: pb.ToolCallDelta) -> None:
    """Adds ``piece`` to ``calls`` (a repeated ToolCallDelta): joined with the call of its index
    when ``calls`` has it (its id and name, the first given; its arguments, appended), else as a
    new call. Deltas merged this way stay deltas; all of a stream's pieces joined are its calls."""
    for call in reversed(calls):
        if call.index == piece.index:
            call.id, call.name = call.id or piece.id, call.name or piece.name
            call.arguments += piece.arguments
            return
    calls.add().CopyFrom(piece)


class RequestStream:
    """One request's deltas from its session. ``next()`` returns what arrived since the previous
    call, merged. ``silence_s``: a worker that sends this request nothing for this long has
    failed (one timer per request, re-armed lazily: no timer work per delta); ``first_s``, if
    given, bounds the wait for the first delta instead. What is buffered is bounded by the
    request's ``max_tokens``: the worker sends no more."""

    def __init__(self, session: WorkerSession, request_id: str, silence_s: float,
                 first_s: float | None = None) -> None:
        self._session = session
        self.request_id = request_id
        self._silence_s = silence_s
        self._first_s = first_s  # None once the first delta came
        self._loop = asyncio.get_running_loop()
        self._pending: list[pb.GenerateResponse] = []
        self._waiter: asyncio.Future[None] | None = None
        self.ended = False
        self._error: WorkerFailed | None = None
        self._last = self._loop.time()
        self._timer = self._loop.call_later(silence_s if first_s is None else first_s, self._check_silence)

    def push(self, chunk: pb.GenerateResponse) -> None:
        self._last = self._loop.time()
        self._first_s = None
        self._pending.append(chunk)
        self._wake()

    def end(self, error: WorkerFailed | None = None) -> None:
        """No more deltas: the request finished (``error`` None) or failed."""
        if self.ended:
            return
        self.ended = True
        self._error = error
        self._timer.cancel()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _check_silence(self) -> None:
        if self.ended:
            return
        bound = self._silence_s if self._first_s is None else self._first_s
        quiet = self._loop.time() - self._last
        if quiet < bound:
            self._timer = self._loop.call_later(bound - quiet, self._check_silence)
            return
        self.end(WorkerFailed(grpc.StatusCode.DEADLINE_EXCEEDED, f"sent nothing for {bound:g}s"))
        self._session.cancel(self.request_id)

    async def next(self) -> pb.GenerateResponse | None:
        """The deltas that arrived since the last call as one message; None once the request has
        finished. Raises WorkerFailed if it failed (after what arrived before)."""
        while not self._pending:
            if self.ended:
                if self._error is not None:
                    raise self._error
                return None
            self._waiter = self._loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        chunks, self._pending = self._pending, []
        return merge(chunks)

    def close(self) -> None:
        """The client side is done: a request still running on the worker is cancelled there."""
        if not self.ended:
            self.end(WorkerFailed(grpc.StatusCode.CANCELLED, "closed"))
            self._session.cancel(self.request_id)


class Outbox:
    """The messages one long-lived bidirectional call sends, written in order by one task
    (grpc.aio takes one write at a time). A failed write ends the call; whoever reads it sees
    the status."""

    def __init__(self, call: grpc.aio.StreamStreamCall, name: str,
                 batch: Callable[[list[Any]], object] | None = None) -> None:
        self._call = call
        self._queued: list[object] = []
        self._ready = asyncio.Event()
        self.batch = batch  # set: whatever queued during a write goes as one message
        self.task = asyncio.create_task(self._write_all(), name=name)

    def send(self, msg: object) -> None:
        self._queued.append(msg)
        self._ready.set()

    async def _write_all(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
            while True:
                await self._ready.wait()
                self._ready.clear()
                msgs, self._queued = self._queued, []
                if self.batch is not None:
                    msgs = [self.batch(msgs)]
                for msg in msgs:
                    await self._call.write(msg)


async def end_call(call: grpc.aio.StreamStreamCall | None, *tasks: asyncio.Task[None] | None) -> None:
    """Cancels a long-lived call and the tasks that read and write it, and waits for them."""
    if call is not None:
        call.cancel()
    running = [t for t in tasks if t is not None]
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)


def _batched(actions: list[pb.SessionRequest]) -> pb.SessionRequest:
    return actions[0] if len(actions) == 1 else pb.SessionRequest(batch=actions)


class WorkerSession:
    """One Session stream to a worker, shared by every request this gateway sends it. A task
    writes what the requests queue (generates, cancels) in order; a task reads the worker's
    messages and hands each delta to its request. If the stream breaks, every request on it
    fails with the stream's status (before its first token the gateway then fails over) and the
    session is ``closed``: the next request opens a new one."""

    def __init__(self, stub: pb_grpc.WorkerStub, address: str) -> None:
        self.address = address
        self._call = stub.Session()
        self._requests: dict[str, RequestStream] = {}
        self._outbox = Outbox(self._call, f"session writer {address}")
        self.closed = False
        self._reader = asyncio.create_task(self._read_all(), name=f"session reader {address}")

    def start(self, request: pb.GenerateRequest, trace_context: dict[str, str], silence_s: float,
              first_s: float | None = None) -> RequestStream:
        """Sends ``request`` (its request_id must be set) and returns its stream of deltas."""
        stream = RequestStream(self, request.request_id, silence_s, first_s)
        if self.closed:
            stream.end(WorkerFailed(grpc.StatusCode.UNAVAILABLE, "session to the worker is closed"))
        elif request.request_id in self._requests:
            stream.end(WorkerFailed(grpc.StatusCode.INVALID_ARGUMENT,
                                    f"request id {request.request_id!r} is already running on this worker",
                                    "request_id"))
        else:
            self._requests[request.request_id] = stream
            self._outbox.send(pb.SessionRequest(generate=request, trace_context=trace_context))
        return stream

    @property
    def in_flight(self) -> int:
        """This gateway's requests running on the worker now."""
        return len(self._requests)

    def cancel(self, request_id: str) -> None:
        if self._requests.pop(request_id, None) is not None and not self.closed:
            self._outbox.send(pb.SessionRequest(cancel=request_id))

    async def _read_all(self) -> None:
        error = WorkerFailed(grpc.StatusCode.UNAVAILABLE, "the worker ended the session")
        try:
            if dict(await self._call.initial_metadata() or ()).get(SESSION_BATCH_HEADER) == "1":
                self._outbox.batch = _batched  # the worker reads batches: a burst is one message
            while (msg := await self._call.read()) is not grpc.aio.EOF:
                for chunk in msg.deltas:
                    stream = self._requests.get(chunk.request_id)
                    if stream is None:
                        continue  # cancelled meanwhile
                    stream.push(chunk)
                    if chunk.finish_reason:
                        del self._requests[chunk.request_id]
                        stream.end()
                for failed in msg.errors:
                    stream = self._requests.pop(failed.request_id, None)
                    if stream is not None:
                        code = STATUS_BY_VALUE.get(failed.code, grpc.StatusCode.UNKNOWN)
                        stream.end(WorkerFailed(code, failed.message or code.name, failed.param or None))
        except grpc.aio.AioRpcError as e:
            error = WorkerFailed(e.code(), e.details() or e.code().name)
        except asyncio.CancelledError:
            error = WorkerFailed(grpc.StatusCode.UNAVAILABLE, "the gateway is closing")
        finally:
            self.closed = True
            requests, self._requests = self._requests, {}
            for stream in requests.values():
                stream.end(error)
            self._outbox.task.cancel()
            if requests:
                log.warning("session to worker %s ended (%s: %s); %d requests on it failed",
                            self.address, error.code.name, error.detail, len(requests))

    async def close(self) -> None:
        await end_call(self._call, self._reader, self._outbox.task)
