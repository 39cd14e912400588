"""One request's record (services.request_record), as the gateway and the worker keep it: the
timings observed in the service's histograms, and its one log line."""

from __future__ import annotations

import logging

import pytest

from meshserve.services.request_record import RequestRecord, Timings


class Histogram:
    def __init__(self) -> None:
        self.values: list[float] = []

    def observe(self, amount: float) -> None:
        self.values.append(amount)


class Clock:
    now = 10.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def timings() -> Timings:
    return Timings(Histogram(), Histogram(), Histogram(), Histogram())


def test_a_generation_observes_ttft_itl_per_token_e2e_and_tpot(timings: Timings, caplog: pytest.LogCaptureFixture
                                                               ) -> None:
    clock = Clock()
    record = RequestRecord("r1", timings, clock)
    clock.now = 10.5
    record.output(1)
    clock.now = 10.9
    record.output(4)  # four tokens that came merged: 0.1 s each
    clock.now = 11.0
    with caplog.at_level(logging.INFO):
        assert record.finish(logging.getLogger("t"), "OK", "length") == pytest.approx(1.0)
    assert timings.ttft.values == [0.5] and timings.itl.values == [pytest.approx(0.1)]  # type: ignore[union-attr]
    assert timings.e2e.values == [1.0] and timings.tpot.values == [pytest.approx(0.125)]  # type: ignore[union-attr]
    assert (record.tokens, record.messages) == (5, 2)
    (line,) = caplog.messages
    assert line.startswith("request r1 OK:") and "tokens=5" in line and "ttft=0.500s" in line and "(length)" in line


def test_an_answer_from_the_cache_has_no_decode_timings(timings: Timings) -> None:
    clock = Clock()
    record = RequestRecord("r2", timings, clock)
    record.cached = True
    record.output(3)
    record.output(3)
    record.finish(logging.getLogger("t"))
    assert len(timings.ttft.values) == 1 and len(timings.e2e.values) == 1  # type: ignore[union-attr]
    assert timings.itl.values == [] and timings.tpot.values == []  # type: ignore[union-attr]


def test_a_request_that_never_answered_has_no_ttft() -> None:
    record = RequestRecord("r3", Timings())  # a service that exports no histograms
    record.finish(logging.getLogger("t"), "UNAVAILABLE", "no worker")
    assert record.ttft is None and record.tokens == 0
