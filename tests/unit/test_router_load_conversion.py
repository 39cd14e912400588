"""The router's WorkerLoad mirrors the LoadReport message; conversions lose nothing."""

from __future__ import annotations

import dataclasses

from meshserve.router.state import WorkerLoad
from meshserve.router.watcher import load_from_pb, load_to_pb
from meshserve.services.gen import meshserve_pb2 as pb


def test_worker_load_mirrors_every_load_report_field() -> None:
    # The KV events a report carries go to the router's index and the adapters it serves to the
    # worker's view, not to the worker's load.
    report_fields = {f.name for f in pb.LoadReport.DESCRIPTOR.fields} - {"worker_id", "kv", "lora"}
    assert report_fields == {f.name for f in dataclasses.fields(WorkerLoad)}


def test_round_trip() -> None:
    load = WorkerLoad(num_running=3, num_waiting=2, kv_cache_usage=0.5, prefix_cache_hit_rate=0.25,
                      max_num_seqs=64, draining=True, sequence=9, num_in_flight=5, active_adapters=("b", "a"),
                      running_adapters=("a",), waiting_adapters=("c",))
    report = load_to_pb("w1", load)
    assert report.worker_id == "w1"
    assert load_from_pb(report) == load
