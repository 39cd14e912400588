"""The gateway's cache breaker: opens after N failures in a row, probes once after its open
period, closes when the probe works."""

from __future__ import annotations

from meshserve.gateway.breaker import Breaker


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_opens_after_failures_in_a_row_and_probes_once_after_the_open_period() -> None:
    clock = Clock()
    b = Breaker(3, 2.0, clock)
    assert b.allow() and not b.failed()
    b.worked()  # a success resets the count
    assert not b.failed() and not b.failed()
    assert b.failed() and b.is_open  # the third in a row opens it
    assert not b.allow()
    clock.now = 1.9
    assert not b.allow()
    clock.now = 2.0
    assert b.allow()       # one probe ...
    assert not b.allow()   # ... at a time
    assert not b.failed()  # the probe failed: open again (not "newly opened")
    assert b.is_open and not b.allow()
    clock.now = 4.0
    assert b.allow()
    b.worked()
    assert not b.is_open and b.allow() and b.allow()


def test_a_probe_that_never_reports_does_not_keep_the_breaker_open() -> None:
    """A probe whose call was cancelled reports neither way: the next open period probes again."""
    clock = Clock()
    b = Breaker(1, 2.0, clock)
    assert b.failed() and b.is_open
    clock.now = 2.0
    assert b.allow()          # the probe, then nothing: its caller was cancelled
    clock.now = 3.9
    assert not b.allow()
    clock.now = 4.0
    assert b.allow()          # another probe
    b.worked()
    assert not b.is_open
