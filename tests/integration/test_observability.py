"""Observability of a real mesh (launcher processes, sim engine, the local trace receiver):
one request through the whole mesh is one trace (Envoy, gateway, cache, router and worker,
linked parent to child, with TTFT on it), the trace id comes back in the response metadata and
is in every service's log line; the dashboard and alert rules use only metrics the services and
Envoy really export."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import yaml

from meshserve.commands.launcher import Mesh, MeshSpec
from meshserve.deploy import envoy_config
from meshserve.services.config import RouterConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from tests import promql
from tests.integration.helpers import mesh_spec, wait_until
from meshserve.trace_service import server as traces

pytestmark = pytest.mark.integration

COMPONENTS = {"envoy", "gateway", "cache", "router", "worker"}
WAIT_S = 20.0  # spans are exported in batches about every second (services and Envoy)


def _spec(tmp_path_factory: pytest.TempPathFactory, name: str, ratio: float) -> MeshSpec:
    # The router logs each pick (with its trace id) at debug level only.
    return mesh_spec(tmp_path_factory.mktemp(name), "sim", tracing=True, trace_sampling_ratio=ratio,
                     router=RouterConfig(log_level="DEBUG"))


@pytest.fixture(scope="module")
def traced_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    with Mesh(_spec(tmp_path_factory, "traced-mesh", 1.0)) as mesh:
        yield mesh


def _request_spans(gateway_rpc: str, *, edge: bool = True) -> set[tuple[str, str]]:
    """Every (service, span name) one uncached request leaves in its trace."""
    spans = {("gateway", gateway_rpc),
             ("gateway", "cache read"),  # its exact entry, read from Redis by the gateway itself
             ("gateway", "cache lookup"), ("cache", "Cache/Lookup"),
             ("gateway", "router pick"), ("router", "Router/Pick"),
             ("gateway", "worker stream"), ("worker", "Worker/Generate"),
             ("gateway", "cache store"), ("cache", "Cache/Store")}
    return spans | {("envoy", "ingress")} if edge else spans


async def _trace_with(receiver: str, trace_id: str, expected: set[tuple[str, str]]) -> list[traces.Span]:
    """The trace's spans once every expected (service, span name) arrived: each service exports
    in its own batches, so a request's spans arrive in any order (the request's own span, ended
    last, often in a later batch than its children)."""
    async def poll() -> list[traces.Span]:
        while True:
            try:
                spans = await traces.fetch_trace(receiver, trace_id)
            except grpc.aio.AioRpcError as e:
                if e.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                spans = []
            if {(s.service, s.name) for s in spans} >= expected:
                return spans
            await asyncio.sleep(0.2)  # the exporters flush about every second

    return await asyncio.wait_for(poll(), WAIT_S)


def _one(spans: list[traces.Span], service: str, name: str) -> traces.Span:
    found = [s for s in spans if s.service == service and s.name == name]
    assert len(found) == 1, (service, name, [(s.service, s.name) for s in spans])
    return found[0]


def _assert_one_linked_trace(spans: list[traces.Span], trace_id: str, gateway_rpc: str) -> None:
    assert {s.trace_id for s in spans} == {trace_id}
    assert {s.service for s in spans} == COMPONENTS
    # The edge starts the trace: Envoy's span is the only root.
    roots = [s for s in spans if not s.parent_id]
    assert [(r.service) for r in roots] == ["envoy"], roots
    edge = roots[0]
    gateway = _one(spans, "gateway", gateway_rpc)
    assert gateway.parent_id == edge.span_id
    # Each hop: the gateway's client-side span, and the callee's server span under it.
    for client_name, service, server_name in [
        ("cache lookup", "cache", "Cache/Lookup"),
        ("router pick", "router", "Router/Pick"),
        ("worker stream", "worker", "Worker/Generate"),
        ("cache store", "cache", "Cache/Store"),
    ]:
        client = _one(spans, "gateway", client_name)
        server = _one(spans, service, server_name)
        assert client.parent_id == gateway.span_id, client_name
        assert server.parent_id == client.span_id, server_name
        assert client.start_ns <= server.start_ns
    # What each component recorded.
    assert _one(spans, "cache", "Cache/Lookup").attributes["meshserve.cache.result"] == "miss"
    pick = _one(spans, "router", "Router/Pick")
    assert pick.attributes["meshserve.worker"] == "worker-0"
    assert pick.attributes["meshserve.router.reason"] == "kv-aware"  # the default policy
    assert pick.attributes["meshserve.router.predicted_cached_tokens"] == 0
    assert pick.attributes["meshserve.router.candidates"] == 1
    # Each scorer's score of the chosen worker: the only candidate, so its prompt was not worked
    # out (kv 0, no cached tokens predicted) and it is the least loaded (load 1).
    assert pick.attributes["meshserve.router.score.kv"] == 0.0
    assert pick.attributes["meshserve.router.score.load"] == 1.0
    worker = _one(spans, "worker", "Worker/Generate")
    assert worker.attributes["meshserve.finish_reason"] == "length"
    assert worker.attributes["meshserve.tokens"] == 6
    assert 0 < worker.attributes["meshserve.ttft_s"] < worker.duration_ms / 1e3
    assert worker.start_ns < worker.events["first_token"] < worker.end_ns
    # TTFT at the gateway, as the client sees it, on the request's span and as an event.
    assert gateway.attributes["meshserve.ttft_s"] > 0
    assert gateway.attributes["meshserve.cached"] is False
    assert gateway.attributes["meshserve.status"] == "OK"
    assert gateway.attributes["meshserve.tokens"] == 6
    assert worker.events["first_token"] <= gateway.events["first_token"] <= gateway.end_ns
    assert edge.start_ns <= gateway.start_ns and gateway.end_ns <= edge.end_ns


def _log_trace_ids(mesh: Mesh, service: str, request_id: str) -> set[str]:
    """The trace ids of ``service``'s log lines about the request the client sent as ``request_id``:
    the gateway's line names it beside the gateway's own id, which the other services log."""
    if service != "gateway":
        request_id = _gateway_id(mesh, request_id)
    lines = (mesh.run_dir / f"{service}.log").read_text().splitlines()
    return {m.group(1) for line in lines if request_id in line for m in [re.search(r"trace=([0-9a-f]{32}|-)", line)] if m}


def _gateway_id(mesh: Mesh, client_request_id: str) -> str:
    text = (mesh.run_dir / "gateway.log").read_text()
    (gateway_id,) = re.findall(rf"request ([0-9a-f]{{32}}) \(client's '{re.escape(client_request_id)}'\)", text)
    return gateway_id


async def test_grpc_request_is_one_trace_across_all_components(traced_mesh: Mesh) -> None:
    request_id = uuid.uuid4().hex
    async with insecure_channel(traced_mesh.envoy_address) as channel:
        call = pb_grpc.InferenceStub(channel).Generate(pb.GenerateRequest(
            request_id=request_id, prompt=f"trace me {request_id}", max_tokens=6, temperature=0))
        chunks = [c async for c in call]
        trace_id = dict(await call.initial_metadata())["x-trace-id"]
    assert chunks[-1].finish_reason == "length"
    assert re.fullmatch(r"[0-9a-f]{32}", trace_id)

    spans = await _trace_with(traced_mesh.traces_address, trace_id, _request_spans("Inference/Generate"))
    _assert_one_linked_trace(spans, trace_id, "Inference/Generate")
    # The trace id is in the request's log lines of every service that logs one.
    for service in ("gateway", "router", "worker-0"):
        assert _log_trace_ids(traced_mesh, service, request_id) == {trace_id}, service
    envoy_log = [json.loads(line) for line in (traced_mesh.run_dir / "envoy.log").read_text().splitlines()
                 if line.startswith("{")]
    (entry,) = [e for e in envoy_log if e.get("trace_id") == trace_id]
    # Where the request spent its time at the edge: queued in Envoy, then until the first byte.
    assert 0 <= entry["upstream_wait_ms"] <= entry["ttfb_ms"] <= entry["duration_ms"]

    # The CLI finds it: the waterfall and the slowest list.
    out = subprocess.run([sys.executable, "-m", "meshserve.commands.cli", "trace", trace_id, "--receiver",
                          traced_mesh.traces_address], capture_output=True, text=True, timeout=60, env=_wide())
    assert out.returncode == 0, out.stderr
    for name in ("Inference/Generate", "Router/Pick", "Worker/Generate", "Cache/Lookup", "first_token"):
        assert name in out.stdout
    out = subprocess.run([sys.executable, "-m", "meshserve.commands.cli", "traces", "--slowest", "50", "--receiver",
                          traced_mesh.traces_address], capture_output=True, text=True, timeout=60, env=_wide())
    assert out.returncode == 0, out.stderr
    assert trace_id in out.stdout


def _wide() -> dict[str, str]:
    import os

    return {**os.environ, "COLUMNS": "250"}


async def test_http_json_request_is_one_trace_across_all_components(traced_mesh: Mesh) -> None:
    request_id = uuid.uuid4().hex
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(f"http://{traced_mesh.envoy_address}/v1/generate", json={
            "request_id": request_id, "prompt": f"trace me over JSON {request_id}", "max_tokens": 6,
            "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["finish_reason"] == "length"
    trace_id = r.headers["x-trace-id"]

    spans = await _trace_with(traced_mesh.traces_address, trace_id, _request_spans("Inference/Complete"))
    _assert_one_linked_trace(spans, trace_id, "Inference/Complete")


@pytest.mark.parametrize("client_request_id", ["bench-request-7", str(uuid.uuid4())])
async def test_a_request_with_its_own_request_id_is_traced_and_keeps_its_id(
    traced_mesh: Mesh, client_request_id: str
) -> None:
    """Clients (and load generators such as `vllm bench serve`) send their own X-Request-Id: the
    request is sampled like any other, and the id reaches the access log as the client sent it."""
    async with httpx.AsyncClient(timeout=30) as client:
        r = await client.post(f"http://{traced_mesh.envoy_address}/v1/generate", headers={
            "x-request-id": client_request_id}, json={"prompt": f"my own id {client_request_id}",
                                                      "max_tokens": 6, "temperature": 0})
    assert r.status_code == 200, r.text
    trace_id = r.headers["x-trace-id"]

    spans = await _trace_with(traced_mesh.traces_address, trace_id, _request_spans("Inference/Complete"))
    _assert_one_linked_trace(spans, trace_id, "Inference/Complete")
    logged: list[dict] = []

    def in_access_log() -> bool:
        lines = (traced_mesh.run_dir / "envoy.log").read_text().splitlines()
        logged[:] = [e for e in map(json.loads, filter(lambda ln: ln.startswith("{"), lines))
                     if e.get("trace_id") == trace_id]
        return bool(logged)

    await wait_until(in_access_log, WAIT_S, "the request's access log line")
    assert [e["request_id"] for e in logged] == [client_request_id]


async def test_client_traceparent_is_continued_and_errors_carry_the_trace_id(traced_mesh: Mesh) -> None:
    trace_id = uuid.uuid4().hex
    parent = f"00-{trace_id}-{uuid.uuid4().hex[:16]}-01"
    async with insecure_channel(traced_mesh.envoy_address) as channel:
        call = pb_grpc.InferenceStub(channel).Generate(
            pb.GenerateRequest(prompt="x", max_tokens=0), metadata=(("traceparent", parent),))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            _ = [c async for c in call]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert dict(err.value.trailing_metadata())["x-trace-id"] == trace_id
    spans = await _trace_with(traced_mesh.traces_address, trace_id,
                              {("envoy", "ingress"), ("gateway", "Inference/Generate")})
    gateway = _one(spans, "gateway", "Inference/Generate")
    assert gateway.error and gateway.attributes["rpc.grpc.status_code"] == grpc.StatusCode.INVALID_ARGUMENT.value[0]


def _envoy_tracer_stats(mesh: Mesh) -> dict[str, int]:
    with urllib.request.urlopen(f"{mesh.admin_url}/stats?filter=tracing.opentelemetry", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return {k.strip(): int(v) for k, _, v in (line.partition(":") for line in lines) if v.strip().isdigit()}


async def test_sampling_ratio_zero_exports_nothing_but_still_propagates(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with Mesh(_spec(tmp_path_factory, "unsampled-mesh", 0.0)) as mesh:
        request_id = uuid.uuid4().hex
        async with insecure_channel(mesh.envoy_address) as channel:
            call = pb_grpc.InferenceStub(channel).Generate(pb.GenerateRequest(
                request_id=request_id, prompt="not sampled", max_tokens=4, temperature=0))
            assert [c async for c in call][-1].finish_reason == "length"
            unsampled = dict(await call.initial_metadata())["x-trace-id"]
        flushes = _envoy_tracer_stats(mesh)["tracing.opentelemetry.timer_flushed"]
        # A marker: a caller that sampled its trace (traceparent flag 01) is followed even at
        # ratio 0. Each service exports in order, so once the marker arrived, anything sampled
        # before it would have too. (Envoy decides by its own ratio: the marker goes direct.)
        marker = uuid.uuid4().hex
        async with insecure_channel(mesh.gateway_address) as channel:
            call = pb_grpc.InferenceStub(channel).Generate(
                pb.GenerateRequest(prompt="marker", max_tokens=4, temperature=0),
                metadata=(("traceparent", f"00-{marker}-{uuid.uuid4().hex[:16]}-01"),))
            _ = [c async for c in call]
        await _trace_with(mesh.traces_address, marker, _request_spans("Inference/Generate", edge=False))
        assert list(await traces.fetch_slowest(mesh.traces_address, 100)) == [marker]
        # Envoy flushed its span buffer since the request, and had nothing to send.
        await wait_until(lambda: _envoy_tracer_stats(mesh)["tracing.opentelemetry.timer_flushed"] > flushes + 1,
                         WAIT_S, "an Envoy tracer flush")
        assert _envoy_tracer_stats(mesh)["tracing.opentelemetry.spans_sent"] == 0
        # Not exported, yet propagated: the same trace id in the header and every hop's log line.
        assert re.fullmatch(r"[0-9a-f]{32}", unsampled)
        for service in ("gateway", "router", "worker-0"):
            assert _log_trace_ids(mesh, service, request_id) == {unsampled}, service


DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _dashboard_exprs() -> list[str]:
    dashboard = json.loads((DEPLOY / "grafana" / "meshserve.json").read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def _rule_exprs() -> list[str]:
    groups = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())["groups"]
    return [r["expr"] for g in groups for r in g["rules"]]


async def test_dashboard_and_alerts_reference_only_exported_metrics(traced_mesh: Mesh) -> None:
    # One cached and one uncached request, so that labelled series exist too.
    for _ in range(2):
        async with insecure_channel(traced_mesh.envoy_address) as channel:
            _ = [c async for c in pb_grpc.InferenceStub(channel).Generate(
                pb.GenerateRequest(prompt="metrics", max_tokens=3, temperature=0))]
    pages = [*traced_mesh.metrics.values(), f"{traced_mesh.admin_url}/stats/prometheus"]
    exported: set[str] = set()
    for url in pages:
        with urllib.request.urlopen(url, timeout=5) as r:
            exported |= promql.exported_names(r.read().decode())
    referenced = {name for expr in _dashboard_exprs() + _rule_exprs() for name in promql.metric_names(expr)}
    assert len(referenced) > 20
    assert referenced - exported - promql.PROMETHEUS_OWN == set()
    assert envoy_config.GATEWAY_CLUSTER == "gateway"  # the rules and dashboard filter on this name
