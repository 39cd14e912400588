"""One request's record, kept the same way by the gateway and the worker: its timings (time to
first token, inter-token latency, end to end, time per output token) in the service's own
histograms, the attributes of its span, and its one log line."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry import trace


class _Histogram(Protocol):
    def observe(self, amount: float) -> None: ...


@dataclass(frozen=True)
class Timings:
    """Where a service observes its requests' timings (None: not exported there)."""

    ttft: _Histogram | None = None
    itl: _Histogram | None = None
    e2e: _Histogram | None = None
    tpot: _Histogram | None = None


class RequestRecord:
    """Created when a request starts (its span is the one current then); ``output`` for each
    message sent on, ``finish`` once, whatever the outcome. An answer from the cache (``cached``)
    has no inter-token latency or time per output token: nothing was decoded for it."""

    def __init__(self, request_id: str, timings: Timings, clock: Callable[[], float] = time.monotonic) -> None:
        self.request_id = request_id
        self.client_request_id = ""  # the client's own id for the request, when not its request_id
        self.worker = ""
        self.cached = False
        self.tokens = 0
        self.messages = 0
        self.prompt_tokens = 0
        self.ttft: float | None = None
        self._timings = timings
        self._itl = timings.itl  # observed per message: one lookup less on the token path
        self._clock = clock
        self._span = trace.get_current_span()
        self.started = self._last = clock()

    def output(self, tokens: int) -> None:
        """A message of ``tokens`` tokens sent on now: the first is the time to first token."""
        now = self._clock()
        if self.ttft is None:
            self.ttft = now - self.started
            _observe(self._timings.ttft, self.ttft)
            self._span.add_event("first_token")
        elif tokens and self._itl is not None and not self.cached:
            self._itl.observe((now - self._last) / tokens)
        self._last = now
        self.tokens += tokens
        self.messages += 1

    def finish(self, log: logging.Logger, status: str = "OK", detail: str = "", level: int = logging.INFO,
               **attributes: Any) -> float:
        """Observes the end-to-end latency (and time per output token), puts the outcome on the
        span (with ``attributes``, as ``meshserve.NAME``) and logs the request's line; returns
        the end-to-end seconds."""
        e2e = self._clock() - self.started
        _observe(self._timings.e2e, e2e)
        if self.ttft is not None and self.tokens > 1 and not self.cached:
            _observe(self._timings.tpot, (e2e - self.ttft) / (self.tokens - 1))
        if self._span.is_recording():
            if self.client_request_id:
                self._span.set_attribute("meshserve.client_request_id", self.client_request_id)
            self._span.set_attributes({
                "meshserve.request_id": self.request_id, "meshserve.worker": self.worker,
                "meshserve.cached": self.cached, "meshserve.tokens": self.tokens, "meshserve.e2e_s": e2e,
                "meshserve.status": status, **{f"meshserve.{k}": v for k, v in attributes.items()},
            })
            if self.ttft is not None:
                self._span.set_attribute("meshserve.ttft_s", self.ttft)
        log.log(level, "request %s%s %s: worker=%s cached=%s prompt_tokens=%d tokens=%d ttft=%s e2e=%.3fs%s",
                self.request_id or "-", f" (client's {self.client_request_id!r})" if self.client_request_id else "",
                status, self.worker or "-", self.cached, self.prompt_tokens, self.tokens,
                "-" if self.ttft is None else f"{self.ttft:.3f}s", e2e, f" ({detail})" if detail else "")
        return e2e


def _observe(histogram: _Histogram | None, value: float) -> None:
    if histogram is not None:
        histogram.observe(value)
