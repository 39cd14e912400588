"""The event-loop lag histogram every service exports (services.server.watch_loop_lag)."""

import asyncio
import time

import prometheus_client

from meshserve.services import server


def _count(le: str) -> float:
    value = prometheus_client.REGISTRY.get_sample_value("meshserve_event_loop_lag_seconds_bucket", {"le": le})
    return value or 0.0


async def _observations_after(count: float) -> None:
    while _count("+Inf") <= count:
        await asyncio.sleep(0.005)


def test_a_loop_held_busy_shows_as_one_late_wake_up() -> None:
    async def main() -> tuple[float, float]:
        monitor = asyncio.create_task(server.watch_loop_lag(0.01))
        try:
            await _observations_after(_count("+Inf") + 3)  # the monitor is running
            late_before, total_before = _count("0.05"), _count("+Inf")
            time.sleep(0.08)  # the loop held, as a burst of relay work would hold it
            await _observations_after(total_before)
            return _count("+Inf") - _count("0.05") - (total_before - late_before), total_before
        finally:
            monitor.cancel()

    late, _ = asyncio.run(main())
    assert late == 1  # exactly the one wake-up that the held loop delayed by ~70 ms is past 50 ms
