"""The shipped observability configs: alert rules and scrape config pass promtool, Envoy's
tracer appears only with an endpoint, the local trace store is bounded and renders."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from meshserve.deploy import envoy_config as envoy
from meshserve.services.config import EnvoyConfig
from tests import promql
from meshserve.trace_service import server as traces

PROMETHEUS = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.fail("promtool not found: `make install` installs Debian's prometheus package, which has it")
    return path


@pytest.mark.parametrize("args", [["check", "rules", str(PROMETHEUS / "rules.yml")],
                                  ["check", "config", str(PROMETHEUS / "prometheus.yml")]])
def test_promtool_accepts_the_shipped_prometheus_files(args: list[str]) -> None:
    out = subprocess.run([_promtool(), *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_promql_metric_names() -> None:
    expr = ('histogram_quantile(0.99, sum by (le, instance) (rate(vllm:ttft_bucket{job="w"}[$__rate_interval])))'
            ' > 1e3 and on(instance) up offset 5m unless ignoring(kind) group_left x_total')
    assert promql.metric_names(expr) == {"vllm:ttft_bucket", "up", "x_total"}


def test_envoy_tracer_only_with_an_endpoint() -> None:
    off = envoy.build_config(EnvoyConfig(), api_keys={})
    hcm = off["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    assert "tracing" not in hcm
    assert [c["name"] for c in off["static_resources"]["clusters"]] == [envoy.GATEWAY_CLUSTER]

    on = envoy.build_config(EnvoyConfig(otlp_endpoint="127.0.0.1:4317", trace_sampling_ratio=0.25), api_keys={})
    hcm = on["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
    tracing = hcm["tracing"]
    assert tracing["provider"]["name"] == "envoy.tracers.opentelemetry"
    sampler = tracing["provider"]["typed_config"]["sampler"]  # ParentBased(TraceIdRatioBased(0.25))
    assert sampler["name"] == "envoy.tracers.opentelemetry.samplers.parent_based"
    assert sampler["typed_config"]["wrapped_sampler"]["typed_config"]["sampling_percentage"] == {
        "numerator": 250_000, "denominator": "MILLION"}
    assert tracing["provider"]["typed_config"]["grpc_service"]["envoy_grpc"]["cluster_name"] == envoy.OTLP_CLUSTER
    otlp = next(c for c in on["static_resources"]["clusters"] if c["name"] == envoy.OTLP_CLUSTER)
    assert otlp["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"] == {
        "socket_address": {"address": "127.0.0.1", "port_value": 4317}}


def test_envoy_accepts_the_tracing_config(tmp_path: Path) -> None:
    path = envoy.write_config(EnvoyConfig(otlp_endpoint="127.0.0.1:4317"), tmp_path / "envoy.yaml", api_keys={})
    envoy.validate(path)


def _span(trace_id: int, span_id: int, parent: int, start_ms: float, end_ms: float, name: str = "s"):  # noqa: ANN202
    from opentelemetry.proto.trace.v1 import trace_pb2

    return trace_pb2.Span(trace_id=trace_id.to_bytes(16, "big"), span_id=span_id.to_bytes(8, "big"),
                          parent_span_id=parent.to_bytes(8, "big") if parent else b"", name=name,
                          start_time_unix_nano=int(start_ms * 1e6), end_time_unix_nano=int(end_ms * 1e6))


def _resource_spans(service: str, spans: list) -> list:  # noqa: ANN001
    data = traces._traces_data((service, s) for s in spans)  # noqa: SLF001 - builds ResourceSpans
    return list(data.resource_spans)


def test_trace_store_keeps_recent_traces_and_ranks_the_slowest() -> None:
    store = traces.TraceStore(max_traces=3, max_spans=2)
    for t in range(1, 5):  # trace t lasts t ms; trace 1 is the oldest and is dropped
        store.add(_resource_spans("gateway", [_span(t, 1, 0, 0, t)]))
    assert len(store) == 3 and store.get((1).to_bytes(16, "big")) is None
    slowest = traces.spans_of(store.slowest(2))
    assert {s.trace_id[-1] for s in slowest} == {"3", "4"}
    # Spans past max_spans are dropped, not stored.
    store.add(_resource_spans("worker", [_span(4, 2, 1, 0, 1), _span(4, 3, 1, 0, 1)]))
    assert len(traces.spans_of(store.get((4).to_bytes(16, "big")))) == 2 and store.dropped_spans == 1


def test_waterfall_follows_parent_links() -> None:
    spans = traces.spans_of(traces._traces_data([  # noqa: SLF001
        ("envoy", _span(7, 1, 0, 0, 10, "ingress")),
        ("worker", _span(7, 3, 2, 2, 9, "Worker/Generate")),
        ("gateway", _span(7, 2, 1, 1, 9.5, "Inference/Generate")),
    ]))
    assert [(d, s.name) for d, s in traces.tree_order(spans)] == [
        (0, "ingress"), (1, "Inference/Generate"), (2, "Worker/Generate")]
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(traces.render_waterfall(spans))
    text = console.export_text()
    assert "3 spans, 3 services" in text and "Worker/Generate" in text
