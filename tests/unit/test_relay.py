"""The gateway's side of one request on a worker session: merging what queued, the end, errors,
silence, and closing early."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from meshserve.gateway.relay import RequestStream, WorkerFailed, merge
from meshserve.services.gen import meshserve_pb2 as pb

WAIT_S = 10.0


class FakeSession:
    """What a RequestStream uses of its WorkerSession: ``cancel(request_id)``."""

    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)


def delta(text: str, token: int, finish: str = "") -> pb.GenerateResponse:
    out = pb.GenerateResponse(request_id="r1", text=text, token_ids=[token], worker="w0", finish_reason=finish)
    if finish:
        out.usage.CopyFrom(pb.Usage(prompt_tokens=5, completion_tokens=3))
    return out


def stream(silence_s: float = WAIT_S) -> tuple[RequestStream, FakeSession]:
    session = FakeSession()
    return RequestStream(session, "r1", silence_s), session  # type: ignore[arg-type]


def test_merge_joins_text_and_tokens_and_keeps_the_last_status() -> None:
    merged = merge([delta("Hel", 1), delta("lo", 2), delta(" world", 3, "length")])
    assert merged.text == "Hello world" and list(merged.token_ids) == [1, 2, 3]
    assert merged.finish_reason == "length" and merged.usage.completion_tokens == 3
    assert merged.request_id == "r1" and merged.worker == "w0"
    one = delta("x", 9)
    assert merge([one]) is one  # nothing to merge: no copy


def test_merge_joins_the_thinking_too() -> None:
    merged = merge([pb.GenerateResponse(reasoning="so ", text=""), pb.GenerateResponse(reasoning="four", text=""),
                    pb.GenerateResponse(text="Four.")])
    assert (merged.reasoning, merged.text) == ("so four", "Four.")


def test_merge_joins_the_pieces_of_each_tool_call() -> None:
    pieces = [pb.GenerateResponse(tool_calls=[pb.ToolCallDelta(index=0, id="a", name="f", arguments='{"x"')]),
              pb.GenerateResponse(tool_calls=[pb.ToolCallDelta(index=0, arguments=": 1}"),
                                              pb.ToolCallDelta(index=1, id="b", name="g")]),
              pb.GenerateResponse(tool_calls=[pb.ToolCallDelta(index=1, arguments="{}")])]
    merged = merge(pieces)
    assert [(c.index, c.id, c.name, c.arguments) for c in merged.tool_calls] == [
        (0, "a", "f", '{"x": 1}'), (1, "b", "g", "{}")]


async def test_a_consumer_that_keeps_up_gets_every_delta_alone() -> None:
    s, _ = stream()
    s.push(delta("a", 1))
    assert (await s.next()).text == "a"
    s.push(delta("b", 2, "stop"))
    s.end()
    assert (await s.next()).text == "b"
    assert await s.next() is None


async def test_deltas_that_queued_while_the_consumer_was_busy_come_as_one() -> None:
    s, _ = stream()
    for d in (delta("Hel", 1), delta("lo", 2), delta(" world", 3, "length")):
        s.push(d)
    s.end()
    merged = await s.next()
    assert merged.text == "Hello world" and list(merged.token_ids) == [1, 2, 3]
    assert merged.finish_reason == "length"
    assert await s.next() is None


async def test_a_waiting_consumer_is_woken_by_the_next_delta() -> None:
    s, _ = stream()
    waiting = asyncio.create_task(s.next())
    await asyncio.sleep(0)  # let it start waiting
    assert not waiting.done()
    s.push(delta("a", 1))
    async with asyncio.timeout(WAIT_S):
        assert (await waiting).text == "a"


async def test_an_error_comes_after_what_arrived_before_it() -> None:
    s, _ = stream()
    s.push(delta("a", 1))
    s.push(delta("b", 2))
    s.end(WorkerFailed(grpc.StatusCode.UNAVAILABLE, "engine crashed"))
    assert (await s.next()).text == "ab"
    with pytest.raises(WorkerFailed) as err:
        await s.next()
    assert err.value.code == grpc.StatusCode.UNAVAILABLE and err.value.detail == "engine crashed"


async def test_a_silent_worker_fails_the_request_and_it_is_cancelled_there() -> None:
    s, session = stream(silence_s=0.05)
    s.push(delta("a", 1))
    assert (await s.next()).text == "a"
    with pytest.raises(WorkerFailed) as err:
        async with asyncio.timeout(WAIT_S):
            await s.next()
    assert err.value.code == grpc.StatusCode.DEADLINE_EXCEEDED and "sent nothing for 0.05s" in err.value.detail
    assert session.cancelled == ["r1"]


async def test_a_worker_that_keeps_talking_is_never_silent() -> None:
    s, session = stream(silence_s=0.5)
    loop = asyncio.get_running_loop()
    # Three deltas 0.3 s apart: the request lasts longer than the silence limit, no gap does.
    for i in range(3):
        loop.call_later(0.3 * (i + 1), s.push, delta(str(i), i, "stop" if i == 2 else ""))
    loop.call_later(1.0, s.end)
    texts = []
    async with asyncio.timeout(WAIT_S):
        while (msg := await s.next()) is not None:
            texts.append(msg.text)
    assert "".join(texts) == "012" and session.cancelled == []


async def test_closing_a_running_request_cancels_it_on_the_worker_but_not_a_finished_one() -> None:
    running, session = stream()
    running.push(delta("a", 1))
    running.close()
    assert session.cancelled == ["r1"]

    finished, session = stream()
    finished.push(delta("a", 1, "stop"))
    finished.end()
    finished.close()
    assert session.cancelled == []
