"""The generated Envoy config: Envoy itself accepts it, and it carries the protections we rely on."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshserve.deploy import envoy_config as envoy
from meshserve.services import config
from meshserve.services.config import EnvoyConfig


def _hcm(cfg: dict) -> dict:
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def test_envoy_accepts_generated_config(tmp_path: Path) -> None:
    path = envoy.write_config(EnvoyConfig(listen_port=18080, admin_port=19901), tmp_path / "envoy.yaml")
    envoy.validate(path)  # runs the real binary in --mode validate


def test_envoy_rejects_broken_config(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("static_resources: {clusters: [{name: x, type: NOPE}]}\n")
    with pytest.raises(ValueError, match="invalid Envoy config"):
        envoy.validate(path)


def test_streams_have_no_route_timeout_but_are_bounded() -> None:
    cfg = envoy.build_config(EnvoyConfig(max_stream_duration_s=42, stream_idle_timeout_s=7))
    hcm = _hcm(cfg)
    assert hcm["stream_idle_timeout"] == "7s"
    routes = {r["match"].get("prefix") or r["match"].get("path"): r["route"] for r in hcm["route_config"]["virtual_hosts"][0]["routes"]}
    stream = routes["/meshserve.v1.Inference/"]
    assert stream["timeout"] == "0s"
    assert stream["max_stream_duration"]["max_stream_duration"] == "42s"
    assert stream["max_stream_duration"]["grpc_timeout_header_max"] == "42s"
    # A stream is retried only where nothing of it was answered (Envoy retries only before it
    # forwarded a response): a gateway it could not reach, that refused at once (UNAVAILABLE:
    # draining), or reset the stream or closed its connection before answering; on another
    # gateway, twice at most.
    for route in (stream, routes["/meshserve.v1.Inference/Complete"]):
        policy = route["retry_policy"]
        assert set(policy["retry_on"].split(",")) == {"connect-failure", "refused-stream", "reset", "unavailable"}
        assert policy["num_retries"] == 2
        assert policy["retry_host_predicate"][0]["name"] == "envoy.retry_host_predicates.previous_hosts"


def test_gateway_cluster_is_protected() -> None:
    cfg = envoy.build_config(EnvoyConfig(gateways=["127.0.0.1:1", "127.0.0.1:2"], max_requests=77))
    (cluster,) = cfg["static_resources"]["clusters"]
    assert cluster["circuit_breakers"]["thresholds"][0]["max_requests"] == 77
    assert cluster["outlier_detection"]["consecutive_5xx"] > 0
    assert "grpc_health_check" in cluster["health_checks"][0]
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"] for e in cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert ports == [1, 2]


def test_http_edges_get_the_streaming_openai_paths_and_the_same_protection(tmp_path: Path) -> None:
    edges = EnvoyConfig(gateways=["127.0.0.1:1", "127.0.0.1:2"], http_gateways=["127.0.0.1:3", "127.0.0.1:4"],
                        max_requests=77, listen_port=18080, admin_port=19901)
    envoy.validate(envoy.write_config(edges, tmp_path / "envoy.yaml"))
    cfg = envoy.build_config(edges)
    grpc_cluster, http_cluster = cfg["static_resources"]["clusters"]
    assert http_cluster["name"] == envoy.HTTP_GATEWAY_CLUSTER
    assert http_cluster["circuit_breakers"] == grpc_cluster["circuit_breakers"]
    assert http_cluster["outlier_detection"] == grpc_cluster["outlier_detection"]
    assert http_cluster["health_checks"][0]["http_health_check"] == {"path": envoy.HTTP_EDGE_HEALTH}
    ports = [e["endpoint"]["address"]["socket_address"]["port_value"]
             for e in http_cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert ports == [3, 4]
    routes = {r["match"].get("path"): r["route"] for r in _hcm(cfg)["route_config"]["virtual_hosts"][0]["routes"]}
    for path in config.HTTP_EDGE_PATHS.values():
        assert routes[path]["cluster"] == envoy.HTTP_GATEWAY_CLUSTER
        assert routes[path]["timeout"] == "0s"  # a stream: bounded by max_stream_duration only
    lua = _hcm(cfg)["http_filters"][-3]["typed_config"]["default_source_code"]["inline_string"]
    assert '["/v1/chat/completions"] = "/v1/chat/completions:sse"' in lua
    # Without HTTP edges, nothing goes there: every request is transcoded.
    plain = envoy.build_config(EnvoyConfig())
    assert len(plain["static_resources"]["clusters"]) == 1
    assert "EDGE_PATHS = {}" in _hcm(plain)["http_filters"][-3]["typed_config"]["default_source_code"]["inline_string"]


def test_admin_listens_on_loopback_only() -> None:
    cfg = envoy.build_config(EnvoyConfig(listen_host="0.0.0.0"))
    assert cfg["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"


def test_gateways_by_name_are_resolved_by_envoy_and_by_address_are_static() -> None:
    by_ip = envoy.build_config(EnvoyConfig(gateways=["127.0.0.1:1", "[::1]:2"]))["static_resources"]["clusters"][0]
    by_name = envoy.build_config(EnvoyConfig(gateways=["gateway:50051"]))["static_resources"]["clusters"][0]
    assert by_ip["type"] == "STATIC" and by_name["type"] == "STRICT_DNS"
    hosts = [e["endpoint"]["address"]["socket_address"]["address"] for e in by_ip["load_assignment"]["endpoints"][0]["lb_endpoints"]]
    assert hosts == ["127.0.0.1", "::1"]


def test_settings_file_sets_fields_by_name_and_refuses_unknown_or_mistyped(tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text("listen_port: 9000\ngateways: [gw:1]\nrate_limit_window_s: 2\n")
    cfg = envoy.settings(EnvoyConfig(), path)
    assert (cfg.listen_port, cfg.gateways, cfg.rate_limit_window_s) == (9000, ["gw:1"], 2)
    for text, message in (("listen_prot: 9000", "unknown Envoy setting 'listen_prot'"),
                          ("listen_port: '9000'", "listen_port must be int"),
                          ("gateways: gw:1", "gateways must be list"),
                          ("- a list", "expected a mapping")):
        path.write_text(text)
        with pytest.raises(ValueError, match=message):
            envoy.settings(EnvoyConfig(), path)
