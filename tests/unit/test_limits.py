"""A gateway's own share of the tenants' limits (what it decides alone while Redis is away), and
what a request reserves."""

from __future__ import annotations

from meshserve.gateway.limits import LocalLimits, Reservation, reserved_tokens
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.tenants import TenantSettings


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def test_a_request_reserves_its_prompt_once_and_each_choices_max_tokens_within_the_tenants_cap() -> None:
    reqs = [pb.GenerateRequest(prompt="x" * 40, max_tokens=100) for _ in range(3)]
    assert reserved_tokens(reqs, TenantSettings()) == 10 + 3 * 100
    assert reserved_tokens(reqs, TenantSettings(max_tokens=50)) == 10 + 3 * 50


def test_the_share_of_each_limit_is_kept_and_settled_to_what_was_used() -> None:
    clock = Clock()
    local = LocalLimits(0.5, clock)
    own = TenantSettings(max_concurrency=4, tpm=120)
    assert local.reserve("t", own, 2, 50)[0] == ""
    assert local.reserve("t", own, 1, 1)[0] == "concurrency"  # half of 4
    assert local.reserve("u", own, 1, 1)[0] == ""             # another tenant's own
    local.settle(Reservation("t", 2, 50, tpm=True), back=40)   # used 10 of the 50
    limit, retry_after, _ = local.reserve("t", own, 1, 51)    # 10 + 51 > 60
    assert limit == "tpm" and retry_after == (10 + 51 - 60) * 60 / 60
    clock.now += 1.0                                           # a second gives back 1 token of 60 a minute
    assert local.reserve("t", own, 1, 51)[0] == ""


def test_the_daily_quota_lasts_the_utc_day() -> None:
    clock = Clock()
    clock.now = 86_400 * 20_000 + 86_000
    local = LocalLimits(1.0, clock)
    own = TenantSettings(daily_tokens=100)
    assert local.reserve("t", own, 1, 100)[0] == ""
    limit, retry_after, _ = local.reserve("t", own, 1, 1)
    assert limit == "daily_tokens" and retry_after == 400
    clock.now += 400
    assert local.reserve("t", own, 1, 1)[0] == ""
