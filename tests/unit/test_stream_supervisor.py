"""The gateway's streaming stage: a worker that fails before the first token is replaced once; a
stream lost after it continues on another worker from the tokens the client has (no gap, no
duplicate); a request's own fault ends it at once; with no worker to continue on, a clear error."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import grpc
import pytest

from meshserve.gateway.errors import GatewayError
from meshserve.gateway.relay import WorkerFailed
from meshserve.gateway.stream_supervisor import StreamSupervisor
from meshserve.services.config import GatewayConfig
from meshserve.services.gen import meshserve_pb2 as pb

TOKENS = [10, 11, 12]


class Selector:
    """Picks the first worker of ``order`` not excluded; GatewayError when none is left."""

    def __init__(self, *order: str) -> None:
        self.order = order
        self.asked: list[list[str]] = []

    async def pick(self, req: pb.GenerateRequest, exclude: Sequence[str] = ()) -> pb.PickResponse:
        self.asked.append(list(exclude))
        for worker in self.order:
            if worker not in exclude:
                return pb.PickResponse(worker_id=worker, address=worker)
        raise GatewayError(grpc.StatusCode.UNAVAILABLE, "router: no worker available")

    def sent(self, pick: pb.PickResponse, req: pb.GenerateRequest) -> None:
        pass


class Stream:
    """A worker's stream of TOKENS after those the request continues from, failing with
    ``error`` once it sent ``fail_after`` chunks (None: never)."""

    def __init__(self, worker: str, req: pb.GenerateRequest, fail_after: int | None, error: WorkerFailed) -> None:
        self.req = req
        self._chunks = [pb.GenerateResponse(token_ids=[t], worker=worker, finish_reason="length" if t == TOKENS[-1]
                                            else "") for t in TOKENS[len(req.continue_token_ids):]]
        self._fail_after, self._error, self._sent = fail_after, error, 0

    async def next(self) -> pb.GenerateResponse | None:
        if self._sent == self._fail_after:
            raise self._error
        if self._sent == len(self._chunks):
            return None
        self._sent += 1
        return self._chunks[self._sent - 1]

    def close(self) -> None:
        pass


class Sessions:
    """Each worker's behaviour: (chunks before it fails, the error), or None: it serves."""

    def __init__(self, **failing: tuple[int, WorkerFailed]) -> None:
        self.failing = failing
        self.started: list[tuple[str, pb.GenerateRequest]] = []

    def session(self, address: str) -> Sessions:
        self._address = address
        return self

    def start(self, request: pb.GenerateRequest, trace_context: dict[str, str], silence_s: float,
              first_s: float | None = None) -> Stream:
        self.started.append((self._address, request))
        fail_after, error = self.failing.get(self._address, (None, WorkerFailed(grpc.StatusCode.OK, "")))
        return Stream(self._address, request, fail_after, error)


def supervisor(selector: Selector, sessions: Sessions, migrations: int = 3) -> StreamSupervisor:
    return StreamSupervisor(selector, sessions, GatewayConfig(migrations=migrations))


async def collect(stream: AsyncIterator[pb.GenerateResponse]) -> list[int]:
    return [t async for chunk in stream for t in chunk.token_ids]


LOST = WorkerFailed(grpc.StatusCode.UNAVAILABLE, "engine crashed")
REQUEST = pb.GenerateRequest(request_id="r", prompt="p")


async def test_a_worker_failing_before_the_first_token_is_replaced() -> None:
    selector, sessions = Selector("A", "B"), Sessions(A=(0, LOST))
    picked: list[str] = []
    assert await collect(supervisor(selector, sessions).stream(REQUEST, lambda p: picked.append(p.worker_id))) \
        == TOKENS
    assert selector.asked == [[], ["A"]] and picked == ["A", "B"]


async def test_a_stream_lost_midway_continues_from_what_the_client_has() -> None:
    selector, sessions = Selector("A", "B"), Sessions(A=(2, LOST))
    assert await collect(supervisor(selector, sessions).stream(REQUEST, lambda p: None)) == TOKENS
    (_, first), (_, continued) = sessions.started
    assert list(continued.continue_token_ids) == TOKENS[:2] and continued.prompt == first.prompt


async def test_a_request_s_own_fault_ends_it_without_a_failover() -> None:
    bad = WorkerFailed(grpc.StatusCode.INVALID_ARGUMENT, "'max_tokens' exceeds the context", "max_tokens")
    selector, sessions = Selector("A", "B"), Sessions(A=(0, bad))
    with pytest.raises(GatewayError) as e:
        await collect(supervisor(selector, sessions).stream(REQUEST, lambda p: None))
    assert e.value.code == grpc.StatusCode.INVALID_ARGUMENT and ("x-meshserve-param", "max_tokens") in e.value.trailers
    assert selector.asked == [[]]


async def test_with_no_worker_to_continue_on_the_stream_ends_saying_so() -> None:
    selector, sessions = Selector("A", "B"), Sessions(A=(2, LOST), B=(0, LOST))
    got: list[int] = []
    with pytest.raises(GatewayError) as e:
        async for chunk in supervisor(selector, sessions, migrations=3).stream(REQUEST, lambda p: None):
            got.extend(chunk.token_ids)
    assert got == TOKENS[:2]  # nothing after the loss, nothing twice
    assert e.value.code == grpc.StatusCode.UNAVAILABLE
    assert "after 2 tokens, and no worker could continue the stream (3 of at most 3 migrations tried)" in e.value.message
