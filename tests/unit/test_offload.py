"""services.offload: small work stays on the event loop, large work goes to the user's one thread
(with the caller's context), and the loop keeps turning meanwhile."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest

from meshserve.services.offload import Offload

REQUEST = contextvars.ContextVar("request", default="")


def where() -> tuple[threading.Thread, str]:
    return threading.current_thread(), REQUEST.get()


async def test_below_the_threshold_on_the_loop_from_it_in_one_thread_with_the_callers_context() -> None:
    offload = Offload("test", threshold=100)
    try:
        REQUEST.set("r1")
        assert await offload.run(99, where) == (threading.main_thread(), "r1")
        thread, request = await offload.run(100, where)
        assert thread is not threading.main_thread() and thread.name.startswith("test") and request == "r1"
        assert (await offload.run(10_000, where))[0] is thread  # one thread: large work takes turns
    finally:
        offload.close()


async def test_the_loop_turns_while_large_work_runs() -> None:
    """The work in the thread waits for a callback that only the loop can run: it ends only if
    the loop turned meanwhile (on the loop, it would wait its whole timeout and return False)."""
    offload = Offload("test", threshold=1)
    turned = threading.Event()
    try:
        asyncio.get_running_loop().call_soon(turned.set)
        assert await offload.run(1, turned.wait, 30) is True
    finally:
        offload.close()


async def test_an_error_in_the_thread_is_the_callers() -> None:
    offload = Offload("test", threshold=1)
    try:
        with pytest.raises(ValueError, match="bad"):
            await offload.run(1, int, "bad")
    finally:
        offload.close()
