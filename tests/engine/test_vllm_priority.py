"""The real vLLM engine schedules by a request's priority (--scheduling-policy priority, the
default): with its batch full (max_num_seqs 2) and routine requests queued, an urgent one that
arrives last gets its first token before any of them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from meshserve.services.config import WorkerConfig
from meshserve.worker.engine import Request
from meshserve.worker.vllm_engine import VllmEngine

pytestmark = pytest.mark.engine

TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
async def engine(tiny_model: Path) -> AsyncIterator[VllmEngine]:
    cfg = WorkerConfig(model=str(tiny_model), dtype="float32", max_model_len=512, kv_cache_memory_bytes=64 * 2**20,
                       max_num_seqs=2, enforce_eager=True)
    engine = VllmEngine(cfg)
    await engine.start()
    yield engine
    await engine.close()


async def until(condition: object, what: str) -> None:
    """Waits for an observable condition of the engine (its scheduler's own counts)."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def request(request_id: str, max_tokens: int, priority: int = 0) -> Request:
    return Request(request_id=request_id, prompt=f"{request_id} asks about the sea", max_tokens=max_tokens,
                   temperature=0.0, ignore_eos=True, priority=priority)


async def test_an_urgent_request_goes_before_routine_ones_queued_earlier(engine: VllmEngine) -> None:
    first_tokens: list[str] = []

    async def stream(r: Request) -> None:
        async for delta in engine.generate(r):
            if delta.token_ids and r.request_id not in first_tokens:
                first_tokens.append(r.request_id)

    # The batch: two routine requests, the first ending well before the second (one place frees).
    running = [asyncio.create_task(stream(request("run-short", 40))),
               asyncio.create_task(stream(request("run-long", 300)))]
    await until(lambda: engine.load().num_running == 2, "the batch to be full")
    queued = [asyncio.create_task(stream(request(f"routine-{i}", 4))) for i in range(3)]
    await until(lambda: engine.load().num_waiting == 3, "three routine requests to queue")
    urgent = asyncio.create_task(stream(request("urgent", 4, priority=-1)))
    async with asyncio.timeout(TIMEOUT_S):
        await asyncio.gather(*running, *queued, urgent)
    waiting_order = [r for r in first_tokens if not r.startswith("run-")]
    assert waiting_order == ["urgent", "routine-0", "routine-1", "routine-2"]
