"""The load generator's runner: streams requests (open loop, at their arrival times) or
conversations (closed loop) over gRPC and times every request."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterable, Callable, Sequence

import grpc
import numpy as np

from meshserve.loadgen.results import RequestResult
from meshserve.loadgen.workloads import Conversation
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.server import CHANNEL_OPTIONS

# Many HTTP/2 servers and proxies allow about this many concurrent streams per connection (100 is
# the RFC's recommended minimum), so a run opens one connection per this many streams.
STREAMS_PER_CHANNEL = 100
MAX_RETRIES = 30  # a refused request sent again after its retry-after (honour_retry_after), at most

# How a refused user waits before its next request (replaced in tests).
backoff = asyncio.sleep

# Opens one Generate stream (the call starts when this is called).
OpenStream = Callable[[], AsyncIterable[pb.GenerateResponse]]

# Opens one turn of a conversation: (the chat so far, request id, max_tokens) -> its stream.
OpenTurn = Callable[[list[pb.ChatMessage], str, int], OpenStream]


async def measure(open_stream: OpenStream, prompt_len: int, text: list[str] | None = None) -> RequestResult:
    """Streams one request and times it; only timestamps and counts are taken per chunk (and the
    text pieces, into ``text``, when given: a conversation sends the answer back)."""
    result = RequestResult(prompt_len=prompt_len)
    usage: pb.Usage | None = None
    token_ids = 0
    answer = hashlib.blake2b(digest_size=8)
    worker = ""
    start = last = last_chunk = time.perf_counter()
    result.start_time = start
    try:
        async for chunk in open_stream():
            now = time.perf_counter()
            if chunk.worker != worker:  # the gateway moved the stream to another worker
                if worker and chunk.worker:
                    result.splice_gaps.append(now - last_chunk)
                worker = chunk.worker
            last_chunk = now
            answer.update(np.asarray(chunk.token_ids, dtype=np.int32).tobytes())
            if chunk.text:
                if text is not None:
                    text.append(chunk.text)
                if result.ttft == 0.0:
                    result.ttft = now - start
                else:
                    result.itl.append(now - last)
                last = now
            token_ids += len(chunk.token_ids)
            if chunk.cache_kind:
                result.answer = chunk.cache_kind
            if chunk.HasField("usage"):
                usage = chunk.usage
        result.latency = time.perf_counter() - start
    except grpc.aio.AioRpcError as e:
        result.latency = time.perf_counter() - start
        result.error_code, result.error = e.code().name, e.details() or ""
        result.retry_after = _retry_after(e)
        return result
    except Exception as e:  # a client-side failure still counts as a failed request
        result.latency = time.perf_counter() - start
        result.error_code, result.error = type(e).__name__, str(e)
        return result
    if usage is not None and usage.prompt_tokens:
        result.prompt_len = usage.prompt_tokens
    result.output_tokens = token_ids
    if usage is not None and usage.completion_tokens:
        result.output_tokens = usage.completion_tokens
    result.digest = answer.hexdigest()
    result.success = True
    return result


def _retry_after(error: grpc.aio.AioRpcError) -> float:
    for key, value in error.trailing_metadata() or ():
        if key == "retry-after":
            with contextlib.suppress(ValueError):
                return max(0.0, float(value))
    return 0.0


async def run_conversations(
    conversations: Sequence[Conversation], open_turn: OpenTurn, think_time: float = 0.0,
    on_done: Callable[[], None] = lambda: None, id_prefix: str = "chat", ramp_up: float = 0.0,
) -> tuple[list[RequestResult], float]:
    """Every user a closed loop: a turn sends the whole conversation so far (system prompt,
    earlier questions and the answers the mesh gave) plus the next question, after the previous
    answer arrived and ``think_time`` seconds. The users start at once, or one after another
    evenly over ``ramp_up`` seconds (as users join a service; turns of equal length started
    together stay in lockstep, every turn a burst). Results in (user, turn) order."""

    async def user(u: int, conv: Conversation) -> list[RequestResult]:
        if ramp_up and u:
            await backoff(u * ramp_up / len(conversations))  # this user joins
        history = [pb.ChatMessage(role="system", content=conv.system)]
        words = len(conv.system.split())
        results = []
        for t, question in enumerate(conv.questions):
            history.append(pb.ChatMessage(role="user", content=question))
            words += len(question.split())
            answer: list[str] = []
            results.append(await measure(open_turn(list(history), f"{id_prefix}-u{u}-t{t}", conv.output_len),
                                         words, answer))
            on_done()
            history.append(pb.ChatMessage(role="assistant", content="".join(answer)))
            words += conv.output_len
            if think_time and t + 1 < len(conv.questions):
                await backoff(think_time)  # the user reads and types
        return results

    start = time.perf_counter()
    per_user = await asyncio.gather(*(user(u, c) for u, c in enumerate(conversations)))
    return [r for rs in per_user for r in rs], time.perf_counter() - start


async def run_requests(
    streams: Sequence[tuple[OpenStream, int]],
    offsets: Sequence[float],
    max_concurrency: int | None,
    on_done: Callable[[], None] = lambda: None,
    honor_retry_after: bool = False,
) -> tuple[list[RequestResult], float]:
    """Opens each (stream, prompt length) at its offset, at most ``max_concurrency`` at once.
    With ``honor_retry_after``, a refused request's user waits the refusal's retry-after and sends
    it again (up to MAX_RETRIES times), as the OpenAI SDK and well-behaved clients do; the request
    is timed on its last try.

    Returns the results in request order and the duration from the first send to the last end.
    """
    semaphore = asyncio.Semaphore(max_concurrency or len(streams) or 1)

    async def one(open_stream: OpenStream, prompt_len: int) -> RequestResult:
        async with semaphore:
            result = await measure(open_stream, prompt_len)
            retries = 0
            while honor_retry_after and result.retry_after and retries < MAX_RETRIES:
                await backoff(result.retry_after)  # the user backs off, holding its place, and asks again
                retries += 1
                result = await measure(open_stream, prompt_len)
            result.retries = retries
            on_done()
        return result

    start = time.perf_counter()
    tasks: list[asyncio.Task[RequestResult]] = []
    for (open_stream, prompt_len), offset in zip(streams, offsets):
        delay = start + offset - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(open_stream, prompt_len)))
    results = await asyncio.gather(*tasks)
    return list(results), time.perf_counter() - start


async def connect(channel: grpc.aio.Channel) -> None:
    """Waits until the channel is connected; a refused connection fails at once, not at the timeout."""
    state = channel.get_state(try_to_connect=True)
    while state != grpc.ChannelConnectivity.READY:
        if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE:
            raise ConnectionError(f"connection failed ({state.name})")
        await channel.wait_for_state_change(state)
        state = channel.get_state(try_to_connect=True)


def open_channels(target: str, count: int) -> list[grpc.aio.Channel]:
    """``count`` separate connections to ``target`` (a local subchannel pool each; channels with
    equal arguments otherwise share one), so no HTTP/2 connection carries more streams than a
    proxy allows on one."""
    options = [*CHANNEL_OPTIONS, ("grpc.use_local_subchannel_pool", 1)]
    return [grpc.aio.insecure_channel(target, options=options) for _ in range(count)]
