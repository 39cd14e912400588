"""Work whose cost grows with a request (tokenizing its prompt, rendering its chat template,
checking its JSON schema), run off the event loop when the request is large: one large request
must not hold up every other request the loop serves.

Small ones stay on the loop, where they cost less than the hop to a thread and back (~20-50 µs).
Each user has one thread: large requests take their turns in it, and the loop competes with one
thread, not a pool, for the GIL (work in the thread that holds the GIL gives it back every few
milliseconds, Python's switch interval, so the loop gets its turn that often).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")

# A prompt of this many characters (~1,000 tokens) or more is tokenized off the loop: on this
# project's 2-vCPU machine the sim's tokenizer takes ~0.14 ms for it, the tiny model's Hugging Face
# tokenizer ~1.2 ms, a hop to a thread ~0.05 ms (docs/operations.md, "Large requests").
OFFLOAD_CHARS = 4096


class Offload:
    """Runs ``fn`` on the loop below ``threshold`` (characters, bytes: whatever the caller's size
    counts), in this object's own thread from it on. ``close`` ends the thread."""

    def __init__(self, name: str, threshold: int = OFFLOAD_CHARS) -> None:
        self.name = name
        self.threshold = threshold
        self._executor: ThreadPoolExecutor | None = None  # started on first use

    def large(self, size: int) -> bool:
        return size >= self.threshold

    async def run(self, size: int, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)``: here for a small ``size``, else in the thread (``fn`` must be safe in both)."""
        if not self.large(size):
            return fn(*args)
        return await self.in_thread(fn, *args)

    async def in_thread(self, fn: Callable[..., T], *args: object) -> T:
        """``fn(*args)`` in the thread, with the caller's context (its trace span). A caller that is
        cancelled stops waiting; the work, once begun, runs to its end."""
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.name)
        call = functools.partial(contextvars.copy_context().run, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
