"""The restart policy of ``meshserve up`` on a fake clock: backoff, its reset after a healthy
run, and giving up on a crash loop."""

from __future__ import annotations

import pytest

from meshserve.commands.supervisor import RestartPolicy, Restarts, describe_exit


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def crash_at_once(restarts: Restarts, clock: Clock, name: str, times: int) -> list[float | None]:
    """``name`` exits ``times`` times, each right after its restart (before it is ready)."""
    delays = []
    for _ in range(times):
        delay = restarts.exited(name)
        delays.append(delay)
        clock.now += delay or 0.0
    return delays


def test_backoff_doubles_from_half_a_second_up_to_ten() -> None:
    clock = Clock()
    restarts = Restarts(RestartPolicy(), clock)
    delays = []
    for _ in range(8):  # each start takes 20 s and fails: too slow a loop to count as a crash loop
        delays.append(restarts.exited("worker-0"))
        clock.now += delays[-1] + 20.0
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]


def test_a_process_up_for_30s_starts_its_backoff_again() -> None:
    clock = Clock()
    restarts = Restarts(RestartPolicy(), clock)
    assert crash_at_once(restarts, clock, "router", 2) == [0.5, 1.0]
    restarts.up("router")
    clock.now += 29.9
    assert restarts.exited("router") == 2.0  # not up long enough
    clock.now += 2.0
    restarts.up("router")
    clock.now += 30.0
    assert restarts.exited("router") == 0.5


def test_more_than_five_restarts_within_60s_is_a_crash_loop() -> None:
    clock = Clock()
    restarts = Restarts(RestartPolicy(), clock)
    # 0.5 + 1 + 2 + 4 + 8 = 15.5 s for five restarts; the sixth exit is within the minute.
    assert crash_at_once(restarts, clock, "worker-1", 6) == [0.5, 1.0, 2.0, 4.0, 8.0, None]


def test_a_process_that_became_ready_still_counts_towards_the_crash_loop() -> None:
    clock = Clock()
    restarts = Restarts(RestartPolicy(), clock)
    for _ in range(5):  # each run is ready but dies 5 s later
        assert restarts.exited("envoy") is not None
        restarts.up("envoy")
        clock.now += 5.0
    assert restarts.exited("envoy") is None


def test_restarts_older_than_the_window_are_forgotten() -> None:
    clock = Clock()
    restarts = Restarts(RestartPolicy(), clock)
    assert None not in crash_at_once(restarts, clock, "cache", 5)  # decided at 0, 0.5, 1.5, 3.5, 7.5 s
    clock.now = 60.2                                              # only the first is older than 60 s
    assert restarts.exited("cache") == 10.0                       # one more is allowed, backoff capped
    assert restarts.exited("cache") is None                       # the next is a sixth within 60 s


def test_each_process_has_its_own_history() -> None:
    clock = Clock()
    restarts = Restarts(RestartPolicy(), clock)
    assert crash_at_once(restarts, clock, "worker-0", 6)[-1] is None
    assert restarts.exited("worker-1") == 0.5


def test_the_policy_is_configurable() -> None:
    clock = Clock()
    policy = RestartPolicy(first_delay_s=0.1, max_delay_s=0.3, max_restarts=2, window_s=10)
    assert crash_at_once(Restarts(policy, clock), clock, "valkey", 3) == [0.1, 0.2, None]


@pytest.mark.parametrize(("returncode", "why"), [
    (-9, "killed by SIGKILL"), (-15, "killed by SIGTERM"), (0, "exited with code 0"), (3, "exited with code 3"),
])
def test_describe_exit(returncode: int, why: str) -> None:
    assert describe_exit(returncode) == why
