"""A circuit breaker for the cache: while the cache (or its Redis) is down, stop paying a
timeout per request for an optimisation.

Closed: every call goes through. ``failures`` failed calls in a row open it: for ``open_s`` no
call is made (lookups count as misses, stores are skipped). Then one call is let through (half
open, one per open period): if it works the breaker closes, if it fails it opens again.
"""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client

from meshserve.gateway import metrics


class Breaker:
    def __init__(self, failures: int, open_s: float, clock: Callable[[], float],
                 open_gauge: prometheus_client.Gauge = metrics.CACHE_BREAKER_OPEN) -> None:
        self._gauge = open_gauge
        self.threshold = max(1, failures)  # failed calls in a row that open it
        self.open_s = open_s
        self._clock = clock
        self._failures = 0
        self._open_until: float | None = None  # None: closed; else when the next probe may go

    @property
    def is_open(self) -> bool:
        return self._open_until is not None

    def allow(self) -> bool:
        """Whether to make a call now: one probe per open period once it is over. A probe that never
        reports (its call cancelled) does not keep the breaker open: the next period lets another."""
        if self._open_until is None:
            return True
        now = self._clock()
        if now >= self._open_until:
            self._open_until = now + self.open_s
            return True
        metrics.CACHE_SKIPPED.inc()
        return False

    def failed(self) -> bool:
        """Records a failed call; True when this one opened the breaker."""
        self._failures += 1
        was_open = self._open_until is not None
        if was_open or self._failures >= self.threshold:
            self._open_until = self._clock() + self.open_s
            self._gauge.set(1)
            return not was_open
        return False

    def worked(self) -> None:
        self._failures = 0
        if self._open_until is not None:
            self._open_until = None
            self._gauge.set(0)
