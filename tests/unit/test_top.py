"""``meshserve top``: windows over scrapes (rates, histogram percentiles, restarts), discovery from
the run dir, and frames that fit the terminal with every worker id whole."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import prometheus_client
import pytest
from rich.console import Console

from meshserve.commands import top
from meshserve.services.gen import meshserve_pb2 as pb

INF = math.inf


@pytest.mark.parametrize(("q", "expected"), [
    (0.5, 0.1 + 0.1 * 3 / 6),  # rank 5 of 10: 3 past the 2 at or below 0.1, in a bucket of 6
    (0.2, 0.1),                # rank 2: the top of the first bucket
    (0.99, 0.2),               # rank 9.9: in +Inf, so the highest finite bound
])
def test_quantile_interpolates_like_prometheus(q: float, expected: float) -> None:
    assert top.quantile(q, [(0.1, 2.0), (0.2, 8.0), (INF, 10.0)]) == pytest.approx(expected)


def test_quantile_without_observations_is_none() -> None:
    assert top.quantile(0.5, []) is None
    assert top.quantile(0.5, [(0.1, 0.0), (INF, 0.0)]) is None


def test_a_counter_that_went_down_restarted_from_zero() -> None:
    assert top.increase(10, 15) == 5
    assert top.increase(10, 3) == 3


def m(name: str, value: float, **labels: str) -> top.Metrics:
    return {name: {frozenset(labels.items()): value}}


def test_span_sums_matching_series_and_takes_restarts_into_account() -> None:
    old = {"reqs_total": {frozenset({("code", "OK")}): 100.0, frozenset({("code", "UNAVAILABLE")}): 5.0}}
    new = {"reqs_total": {frozenset({("code", "OK")}): 120.0, frozenset({("code", "UNAVAILABLE")}): 2.0,
                          frozenset({("code", "INTERNAL")}): 1.0}}  # a series first seen now counts from 0
    span = top.Span(2.0, old, new)
    assert span.increase("reqs_total", code="OK") == 20
    assert span.increase("reqs_total") == 20 + 2 + 1  # UNAVAILABLE restarted: 2 since
    assert span.rate("reqs_total") == pytest.approx(11.5)
    assert span.by_label("reqs_total", "code") == {"INTERNAL": 1, "OK": 20, "UNAVAILABLE": 2}
    assert span.increase("absent_total") == 0


def test_bucket_increases_sum_the_series_of_every_label_set() -> None:
    def buckets(worker: str, counts: list[float]) -> dict[frozenset[tuple[str, str]], float]:
        return {frozenset({("worker", worker), ("le", le)}): c for le, c in zip(["0.1", "0.2", "+Inf"], counts)}

    old = {"lat_bucket": {**buckets("a", [1, 1, 1]), **buckets("b", [0, 0, 0])}}
    new = {"lat_bucket": {**buckets("a", [3, 5, 5]), **buckets("b", [0, 2, 2])}}
    assert top.Span(1.0, old, new).buckets("lat") == [(0.1, 2.0), (0.2, 6.0), (INF, 6.0)]


def test_history_spans_the_window_asked_for_and_keeps_no_more_than_needed() -> None:
    history = top.History(keep_s=60)
    assert history.span(5) is None  # one scrape: no rate yet
    for t in range(200):  # a scrape every second, the counter at 10 * t
        history.add(float(t), m("c_total", 10.0 * t))
    recent, minute = history.span(5), history.span(60)
    assert recent is not None and minute is not None
    assert (recent.seconds, recent.rate("c_total")) == (5, 10)
    assert (minute.seconds, minute.rate("c_total")) == (60, 10)
    assert len(history.scrapes) <= 62


def test_a_span_shorter_than_the_scrape_interval_uses_the_previous_scrape() -> None:
    history = top.History()
    history.add(0.0, m("c_total", 0))
    history.add(10.0, m("c_total", 50))
    span = history.span(5)
    assert span is not None and span.seconds == 10 and span.rate("c_total") == 5


def test_envoy_stats_text_keeps_counters_and_skips_histograms() -> None:
    text = ("cluster.gateway.upstream_rq_pending_overflow: 3\nhttp.ingress.downstream_rq_2xx: 17\n"
            "http.ingress.downstream_rq_time: P0(nan,1) P25(nan,2)\n")
    assert top.parse_envoy_stats(text) == {
        "cluster.gateway.upstream_rq_pending_overflow": {frozenset(): 3.0},
        "http.ingress.downstream_rq_2xx": {frozenset(): 17.0},
    }


def test_discover_reads_the_launchers_files(tmp_path: Path) -> None:
    with pytest.raises(top.NoMesh, match="meshserve up"):
        top.discover(tmp_path)
    groups = [
        {"targets": ["127.0.0.1:4001"], "labels": {"job": "meshserve-router", "name": "router"}},
        {"targets": ["127.0.0.1:4002"], "labels": {"job": "meshserve-worker", "name": "worker-0"}},
        {"targets": ["127.0.0.1:4003"], "labels": {"job": "meshserve-gateway", "name": "gateway-1"}},
        {"targets": ["127.0.0.1:9901"], "labels": {"job": "meshserve-envoy", "name": "envoy",
                                                   "__metrics_path__": "/stats/prometheus"}},
    ]
    (tmp_path / "prometheus-targets.json").write_text(json.dumps(groups))
    with pytest.raises(top.NoMesh, match="router"):
        top.discover(tmp_path)  # no router.ready: nothing to ask for the workers
    (tmp_path / "router.ready").write_text("127.0.0.1:50052 4001\n")
    (tmp_path / "worker-0.ready").write_text("127.0.0.1:50061 4002\n")
    mesh = top.discover(tmp_path)
    assert mesh.router == "127.0.0.1:50052"
    by_name = {s.name: s for s in mesh.services}
    assert by_name["worker-0"] == top.Service("worker-0", "worker", "http://127.0.0.1:4002/metrics", "127.0.0.1:50061")
    assert by_name["gateway-1"].kind == "gateway"
    assert by_name["envoy"].url.startswith("http://127.0.0.1:9901/stats?filter=")


# -- frames ---------------------------------------------------------------------------------------

LONG_ID = "127.0.0.1:50061"  # a worker started without --worker-id is named by its address


def _worker_metrics(worker_id: str, t: float) -> top.Metrics:
    """A worker after ``t`` seconds at 100 tokens and 10 prefix-cache queries a second."""
    labels = frozenset({("worker", worker_id)})
    return {"vllm:generation_tokens_total": {labels: 100.0 * t},
            "vllm:prefix_cache_queries_total": {labels: 10.0 * t},
            "vllm:prefix_cache_hits_total": {labels: 2.5 * t}}


def _gateway_metrics(t: float) -> top.Metrics:
    registry = prometheus_client.CollectorRegistry()
    requests = prometheus_client.Counter("meshserve_gateway_requests_total", "", ["code"], registry=registry)
    in_flight = prometheus_client.Gauge("meshserve_gateway_in_flight", "", registry=registry)
    ttft = prometheus_client.Histogram("meshserve_gateway_time_to_first_token_seconds", "",
                                       buckets=[0.01, 0.1, 1.0], registry=registry)
    requests.labels("OK").inc(4 * t)
    requests.labels("CANCELLED").inc(t)  # the client gave up: not an error
    requests.labels("UNAVAILABLE").inc(t / 2)
    requests.labels("RESOURCE_EXHAUSTED").inc(t / 4)  # refused past a bound: not an error, shown apart
    in_flight.set(16)
    for _ in range(int(t)):
        ttft.observe(0.05)
    return top.parse_prometheus(prometheus_client.generate_latest(registry).decode())


def _snapshot(tmp_path: Path, worker_ids: list[str], gateways: tuple[str, ...] = ("gateway",)) -> top.Snapshot:
    services = [top.Service("router", "router", "", "127.0.0.1:50052")]
    services += [top.Service(name, "gateway", "") for name in gateways]
    services += [top.Service(f"w{i}", "worker", "", f"127.0.0.1:{50061 + i}") for i in range(len(worker_ids))]
    histories: dict[str, top.History] = {s.name: top.History() for s in services}
    for t in (0.0, 10.0):
        for name in gateways:
            histories[name].add(t, _gateway_metrics(t))
        histories["router"].add(t, m("meshserve_router_picks_total", 3.0 * t, worker=worker_ids[0], reason="kv-aware"))
        for i, worker_id in enumerate(worker_ids):
            histories[f"w{i}"].add(t, _worker_metrics(worker_id, t))
    workers = [
        pb.WorkerState(worker_id=worker_id, address=f"127.0.0.1:{50061 + i}", healthy=True,
                       weights_id="ee497a704f8599e1" if i == 0 else "",
                       load=pb.LoadReport(worker_id=worker_id, num_running=7 + i, num_waiting=i, kv_cache_usage=0.5,
                                          draining=i == 1))
        for i, worker_id in enumerate(worker_ids)
    ]
    mesh = top.MeshFiles(tmp_path, "127.0.0.1:50052", tuple(services))
    return top.Snapshot(0.0, mesh, workers, histories, {"envoy": "Connection refused"})


def _row(lines: list[str], first: str) -> list[str]:
    """The cells of the table row that starts with ``first`` (not a header)."""
    [row] = [line.split() for line in lines if line.split()[:1] == [first] and "in-flight" not in line]
    return row


@pytest.mark.parametrize("width", [80, 100, 120, 200])
def test_a_frame_fits_the_terminal_and_shows_every_worker_whole(tmp_path: Path, width: int) -> None:
    ids = ["worker-0", LONG_ID, "worker-10"]
    console = Console(width=width, record=True, file=io.StringIO())
    console.print(top.render(_snapshot(tmp_path, ids), width))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= width
    # worker, state, run, wait, [cap, in-fl,] kv, prefix hit, tok/s, picks/s[, weights, address]
    if width >= top.WIDE:
        assert _row(lines, "worker-0") == ["worker-0", "ok", "7", "0", "0", "0", "50%", "25%", "100", "3.0",
                                           "ee497a70", "127.0.0.1:50061"]
        assert _row(lines, "worker-10")[-2:] == ["-", "127.0.0.1:50063"]
    else:
        assert _row(lines, "worker-0") == ["worker-0", "ok", "7", "0", "50%", "25%", "100", "3.0"]
    assert _row(lines, LONG_ID)[1:4] == ["draining", "8", "1"]
    assert _row(lines, "worker-10")[:3] == ["worker-10", "ok", "9"]
    # gateway, in flight, req/s, err/s, refused/s, TTFT p50 (every observation in (0.01, 0.1]: its middle), ...
    assert _row(lines, "gateway")[:6] == ["gateway", "16", "5.8", "0.5", "0.2", "55ms"]
    assert "picks: kv-aware 3.0/s" in next(line for line in lines if line.startswith("router"))
    assert "hits: exact 0% · semantic 0% · coalesced 0%" in next(line for line in lines if line.startswith("cache"))
    assert any("unreachable: envoy (Connection refused)" in line for line in lines)


def test_several_gateways_have_a_row_each_and_one_for_all(tmp_path: Path) -> None:
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(top.render(_snapshot(tmp_path, ["worker-0"], gateways=("gateway", "gateway-1")), 80))
    lines = console.export_text().splitlines()
    assert _row(lines, "gateway")[:6] == ["gateway", "16", "5.8", "0.5", "0.2", "55ms"]
    assert _row(lines, "gateway-1")[:6] == ["gateway-1", "16", "5.8", "0.5", "0.2", "55ms"]
    assert _row(lines, "all")[:6] == ["all", "32", "11.5", "1.0", "0.5", "55ms"]  # sums; percentiles of both


def _tenant_metrics(t: float) -> top.Metrics:
    """A gateway after ``t`` seconds: tenant "batch" with 3 requests queued, waiting ~0.3 s and
    refused twice a second (flow control and its limits), "chat" with none of that."""
    registry = prometheus_client.CollectorRegistry()
    queued = prometheus_client.Gauge("meshserve_gateway_flow_queued", "", ["tenant"], registry=registry)
    wait = prometheus_client.Histogram("meshserve_gateway_flow_wait_seconds", "", ["tenant"],
                                       buckets=[0.1, 0.5, 1.0], registry=registry)
    flow_refused = prometheus_client.Counter("meshserve_gateway_flow_refused_total", "", ["tenant", "reason"],
                                             registry=registry)
    limit_refused = prometheus_client.Counter("meshserve_gateway_limits_refused_total", "", ["tenant", "limit"],
                                              registry=registry)
    tokens = prometheus_client.Counter("meshserve_gateway_tenant_tokens_total", "", ["tenant", "kind", "answered"],
                                       registry=registry)
    queued.labels("batch").set(3)
    queued.labels("chat").set(0)
    for _ in range(int(t)):
        wait.labels("batch").observe(0.3)
        wait.labels("chat").observe(0.01)
    flow_refused.labels("batch", "queue_full").inc(t)
    limit_refused.labels("batch", "tpm").inc(t)
    tokens.labels("batch", "completion", "generated").inc(50 * t)
    tokens.labels("batch", "prompt", "generated").inc(500 * t)  # not output
    tokens.labels("chat", "completion", "exact").inc(5 * t)
    return top.parse_prometheus(prometheus_client.generate_latest(registry).decode())


def test_the_tenants_table_shows_each_tenants_queue_wait_refusals_and_tokens(tmp_path: Path) -> None:
    snap = _snapshot(tmp_path, ["worker-0"])
    for t in (0.0, 10.0):
        snap.histories["gateway"].add(t, {**_gateway_metrics(t), **_tenant_metrics(t)})
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(top.render(snap, 80))
    lines = console.export_text().splitlines()
    # tenant, queued, wait p50, wait p99, refused in the last minute, output tokens a second
    assert _row(lines, "batch") == ["batch", "3", "300ms", "496ms", "20", "50.0"]
    assert _row(lines, "chat") == ["chat", "0", "50ms", "99ms", "0", "5.0"]


def test_no_tenants_table_before_a_gateway_has_seen_a_tenant(tmp_path: Path) -> None:
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(top.render(_snapshot(tmp_path, ["worker-0"]), 80))
    assert not any(line.startswith("tenant") for line in console.export_text().splitlines())
