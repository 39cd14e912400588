"""A router behind sheds: a pick read after its asker's deadline is answered DEADLINE_EXCEEDED at
once, not worked out; one within its deadline is worked out as ever."""

from __future__ import annotations

import time

import grpc
from prometheus_client import REGISTRY

from meshserve.router.server import RouterCore
from meshserve.services.config import RouterConfig
from meshserve.services.gen import meshserve_pb2 as pb


def test_a_pick_read_after_its_deadline_is_dropped_not_worked_out() -> None:
    servicer = RouterCore(RouterConfig(workers=[])).servicer
    shed = REGISTRY.get_sample_value("meshserve_router_picks_shed_total") or 0.0
    late = servicer.answer(pb.PickRequest(request_id="r", prompt="p", pick_id=7,
                                          deadline_unix_ms=int(time.time() * 1000) - 1))
    assert (late.pick_id, late.error_code) == (7, grpc.StatusCode.DEADLINE_EXCEEDED.value[0])
    assert REGISTRY.get_sample_value("meshserve_router_picks_shed_total") == shed + 1
    # In time (or with no deadline): worked out; with no worker, the router's own refusal.
    for deadline in (int(time.time() * 1000) + 60_000, 0):
        answer = servicer.answer(pb.PickRequest(request_id="r", prompt="p", deadline_unix_ms=deadline))
        assert answer.error_code == grpc.StatusCode.UNAVAILABLE.value[0]
    assert REGISTRY.get_sample_value("meshserve_router_picks_shed_total") == shed + 1
