"""The gateway's picks over one long-lived Router/PickBatches stream: the picks asked while the
last batch was being written go as the next batch (one message), each answer found by its
``pick_id``. A unary Pick call costs each Python end far more than a message on an open stream
(measured here: ~400 us per call, both ends together, against tens of microseconds per
message), and every request needs a pick before its first token; under load each message also
waits its turn in both processes (a pick per message queued ~180 ms at 300 users), so a burst
goes as a few messages."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import AsyncIterator
from typing import Any, Protocol

import grpc

from meshserve.gateway.relay import STATUS_BY_VALUE, Outbox, StreamFailed, end_call
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

class PickFailed(StreamFailed):
    """No answer: the router refused (no worker), is unreachable, or did not answer in time."""


class PickRefused(PickFailed):
    """The router answered, with a refusal (no healthy worker, ...): not a router that is away."""


class Picks(Protocol):
    """Where a gateway's picks are made: the router service (``PickStream``) or this process."""

    async def pick(self, request: pb.PickRequest, timeout_s: float) -> pb.PickResponse: ...

    async def close(self) -> None: ...


class PickStream:
    """Opens the stream on the first pick and again after it broke; a break fails every pick
    waiting on it with the stream's status."""

    def __init__(self, stub: pb_grpc.RouterStub) -> None:
        self._stub = stub
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[pb.PickResponse]] = {}
        self._outbox: Outbox | None = None
        self._reader: asyncio.Task[None] | None = None
        self._call: grpc.aio.StreamStreamCall | None = None

    async def pick(self, request: pb.PickRequest, timeout_s: float) -> pb.PickResponse:
        if self._reader is None or self._reader.done():
            self._open()
        assert self._outbox is not None
        pick_id = next(self._ids)
        answer: asyncio.Future[pb.PickResponse] = asyncio.get_running_loop().create_future()
        self._waiting[pick_id] = answer
        request.pick_id = pick_id
        self._outbox.send(request)
        try:
            async with asyncio.timeout(timeout_s):
                resp = await answer
        except TimeoutError:
            raise PickFailed(grpc.StatusCode.DEADLINE_EXCEEDED, f"no answer in {timeout_s:g}s") from None
        finally:
            self._waiting.pop(pick_id, None)
        if resp.error_code:
            raise PickRefused(STATUS_BY_VALUE.get(resp.error_code, grpc.StatusCode.UNKNOWN), resp.error_message)
        return resp

    def _open(self) -> None:
        self._call = self._stub.PickBatches()
        self._outbox = Outbox(self._call, "pick writer", batch=lambda picks: pb.PickBatch(picks=picks))
        self._reader = asyncio.create_task(self._read_all(self._call, self._outbox), name="pick reader")

    async def _read_all(self, call: grpc.aio.StreamStreamCall, outbox: Outbox) -> None:
        failure = PickFailed(grpc.StatusCode.UNAVAILABLE, "the router ended the pick stream")
        try:
            while (batch := await call.read()) is not grpc.aio.EOF:
                for resp in batch.answers:
                    answer = self._waiting.get(resp.pick_id)
                    if answer is not None and not answer.done():
                        answer.set_result(resp)
        except grpc.aio.AioRpcError as e:
            failure = PickFailed(e.code(), e.details() or e.code().name)
        except asyncio.CancelledError:
            failure = PickFailed(grpc.StatusCode.UNAVAILABLE, "the gateway is closing")
        finally:
            outbox.task.cancel()
            # Picks sent on this stream get no answer now; later ones open a new stream.
            for answer in self._waiting.values():
                if not answer.done():
                    answer.set_exception(failure)
            if self._waiting:
                log.warning("pick stream to the router ended (%s: %s)", failure.code.name, failure.detail)

    async def close(self) -> None:
        await end_call(self._call, self._reader, self._outbox.task if self._outbox else None)


class RouterInProcess(Protocol):
    """What a gateway with ``--router embedded`` calls: the router's servicer, in this process."""

    async def answer_off_loop(self, request: pb.PickRequest, embedded: bool = False) -> pb.PickResponse: ...

    def fleet_updates(self) -> AsyncIterator[pb.FleetUpdate]: ...


class EmbeddedRouter(Protocol):
    """The router's parts in the gateway's process (``--router embedded``; the command line builds
    them: router.server.RouterCore): its servicer answers picks and pushes the fleet view, and is also
    served on the gateway's port; ``start`` begins watching the workers, ``close`` stops."""

    servicer: Any  # a RouterInProcess that is also the Router gRPC servicer

    def start(self, name: str = "router") -> None: ...

    async def close(self) -> None: ...


class LocalPicks:
    """Picks made in the gateway's own process by the router's code (``--router embedded``): no
    stream, no message, no wait for another process; the same answers and refusals as a
    ``PickStream``'s."""

    def __init__(self, router: RouterInProcess) -> None:
        self._router = router

    async def pick(self, request: pb.PickRequest, timeout_s: float) -> pb.PickResponse:
        resp = await self._router.answer_off_loop(request, embedded=True)
        if resp.error_code:
            raise PickRefused(STATUS_BY_VALUE.get(resp.error_code, grpc.StatusCode.UNKNOWN), resp.error_message)
        return resp

    async def close(self) -> None:
        pass
