"""The edge's protections in the generated Envoy config: API keys, rate limits, body limit,
error shapes, stream steering, and an access log that carries the tenant but never the key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from meshserve.deploy import envoy_config as envoy
from meshserve.services.config import EnvoyConfig

KEYS = {"sk-one-12345678": "one", "sk-two-12345678": "two"}


def _hcm(cfg: dict) -> dict:
    return cfg["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]


def _filters(cfg: dict) -> dict[str, dict]:
    return {f["name"]: f["typed_config"] for f in _hcm(cfg)["http_filters"]}


def test_api_keys_file_format(tmp_path: Path) -> None:
    assert envoy.parse_api_keys("# c\n\nsk-aaaaaaaa alice  # trailing\nsk-bbbbbbbb bob\n", "f") == {
        "sk-aaaaaaaa": "alice", "sk-bbbbbbbb": "bob"}
    for bad in ["sk-aaaaaaaa", "sk-aaaaaaaa a b", "short t", "sk-aaaaaaaa a\nsk-aaaaaaaa b", "sk-aaaaaaaa bad/tenant"]:
        with pytest.raises(envoy.ApiKeyError) as err:
            envoy.parse_api_keys(bad, "f")
        assert "sk-aaaaaaaa" not in str(err.value)  # a key never appears in an error message


def test_keys_from_file_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("sk-file-1234 filetenant\n")
    cfg = EnvoyConfig(api_keys_file=str(path))
    keys = envoy.load_api_keys(cfg, {envoy.API_KEYS_ENV: "sk-env-12345=envtenant,sk-env-67890=other"})
    assert keys == {"sk-file-1234": "filetenant", "sk-env-12345": "envtenant", "sk-env-67890": "other"}
    assert envoy.load_api_keys(EnvoyConfig(), {}) == {}


def test_no_keys_means_no_auth_but_tenant_headers_are_still_stripped() -> None:
    filters = _filters(envoy.build_config(EnvoyConfig(), api_keys={}))
    assert "envoy.filters.http.api_key_auth" not in filters
    removed = [m["remove"] for m in filters["envoy.filters.http.header_mutation"]["mutations"]["request_mutations"]]
    assert envoy.TENANT_HEADER in removed


def test_auth_forwards_the_tenant_and_hides_the_key() -> None:
    cfg = envoy.build_config(EnvoyConfig(), api_keys=KEYS)
    names = [f["name"] for f in _hcm(cfg)["http_filters"]]
    assert names.index("envoy.filters.http.header_mutation") < names.index("envoy.filters.http.api_key_auth")
    auth = _filters(cfg)["envoy.filters.http.api_key_auth"]
    assert auth["forwarding"] == {"header": envoy.TENANT_HEADER, "hide_credentials": True}
    assert {c["client"] for c in auth["credentials"]} == {"one", "two"}
    log = _hcm(cfg)["access_log"][0]["typed_config"]["log_format"]["json_format"]
    assert log["tenant"] == "%REQ(X-MESHSERVE-TENANT)%"
    assert not any("AUTHORIZATION" in str(v).upper() for v in log.values())


def test_rate_limits_global_and_per_tenant() -> None:
    cfg = envoy.build_config(
        EnvoyConfig(rate_limit_requests=100, rate_limit_per_key_requests=5, rate_limit_window_s=2), api_keys=KEYS
    )
    rl = _filters(cfg)["envoy.filters.http.local_ratelimit"]
    assert rl["token_bucket"] == {"max_tokens": 100, "tokens_per_fill": 100, "fill_interval": "2s"}
    assert {d["entries"][0]["value"]: d["token_bucket"]["max_tokens"] for d in rl["descriptors"]} == {"one": 5, "two": 5}
    assert rl["rate_limits"][0]["actions"][0]["request_headers"]["header_name"] == envoy.TENANT_HEADER
    assert rl["response_headers_to_add"][0]["header"] == {"key": "retry-after", "value": "2"}
    assert "envoy.filters.http.local_ratelimit" not in _filters(envoy.build_config(EnvoyConfig(), api_keys=KEYS))


def test_body_limit_and_error_shapes() -> None:
    cfg = envoy.build_config(EnvoyConfig(max_request_bytes=1234), api_keys={})
    assert cfg["static_resources"]["listeners"][0]["per_connection_buffer_limit_bytes"] == 1234
    mappers = _hcm(cfg)["local_reply_config"]["mappers"]
    bodies = [m["body_format_override"]["json_format"] for m in mappers if "json_format" in m["body_format_override"]]
    openai = [b["error"] for b in bodies if "error" in b]
    assert {"message", "type", "param", "code"} == set(openai[0])
    assert any("1234 bytes" in e["message"] for e in openai)


def test_stream_steering_pairs_each_path_with_its_streaming_twin() -> None:
    paths = envoy.stream_paths(envoy.json_schemas())
    assert paths == {"/v1/chat/completions": "/v1/chat/completions:stream",
                     "/v1/completions": "/v1/completions:stream"}


def test_full_protection_config_is_accepted_by_envoy(tmp_path: Path) -> None:
    cfg = EnvoyConfig(listen_port=18080, admin_port=19901, rate_limit_requests=50, rate_limit_per_key_requests=5)
    path = envoy.write_config(cfg, tmp_path / "envoy.yaml", api_keys=KEYS)
    assert path.stat().st_mode & 0o077 == 0  # it holds the keys: owner-only
    envoy.validate(path)


def test_circuit_breaker_is_capped_by_the_gateways_capacity_when_known() -> None:
    def max_requests(cfg: EnvoyConfig) -> int:
        clusters = envoy.build_config(cfg, api_keys={})["static_resources"]["clusters"]
        return clusters[0]["circuit_breakers"]["thresholds"][0]["max_requests"]

    assert max_requests(EnvoyConfig()) == EnvoyConfig.max_requests  # unknown: as configured
    assert max_requests(EnvoyConfig(gateway_max_in_flight=32)) == 32
    assert max_requests(EnvoyConfig(max_requests=8, gateway_max_in_flight=32)) == 8


def test_overflow_is_429_with_retry_after_for_every_api_and_resource_exhausted_for_grpc() -> None:
    mappers = _hcm(envoy.build_config(EnvoyConfig(), api_keys={}))["local_reply_config"]["mappers"]
    overflow = [m for m in mappers if {"response_flag_filter": {"flags": ["UO"]}} in m["filter"]["and_filter"]["filters"]]
    assert len(overflow) == 3
    assert mappers[:3] == overflow  # before the generic 503 mappers: the first match wins
    for m in overflow:
        assert m["status_code"] == 429
        assert {"key": "retry-after", "value": "1"} in [h["header"] for h in m["headers_to_add"]]
    openai, native, grpc_ = (m["body_format_override"] for m in overflow)
    assert openai["json_format"]["error"]["type"] == "rate_limit_error"
    assert set(openai["json_format"]["error"]) == {"message", "type", "param", "code"}
    assert native["json_format"]["code"] == 8
    assert {"key": "grpc-status", "value": "8"} in [h["header"] for h in overflow[2]["headers_to_add"]]
    assert "capacity" in grpc_["text_format"]


def test_the_lua_filters_error_table_is_the_gateways() -> None:
    """An OpenAI client sees the same error type and code for a status whether Envoy's Lua
    filter shaped it (an error before any answer) or the gateway did (one inside a stream)."""
    import grpc

    from meshserve.gateway import openai_convert
    from meshserve.services import openai_errors

    lua = _filters(envoy.build_config(EnvoyConfig(), api_keys={}))["envoy.filters.http.lua"]
    source = lua["default_source_code"]["inline_string"]
    table = source.split("ERROR_TYPES = ", 1)[1].split("\n", 1)[0]
    rows = {int(n): (t, c) for n, t, c in re.findall(r'\[(\d+)\] = \{"(\w+)", "(\w+)"\}', table)}
    for code in grpc.StatusCode:
        if code is grpc.StatusCode.OK:
            continue
        streamed = openai_convert.error(code, "m")
        assert rows[code.value[0]] == (streamed.type, streamed.code), code
    assert source.count("ERROR_TYPES = ") == 1  # the .lua file declares no table of its own
    assert "ERROR_TYPES = " not in envoy.STRICT_JSON_LUA.read_text()
    assert openai_errors.error_type(grpc.StatusCode.RESOURCE_EXHAUSTED) == ("rate_limit_error", "resource_exhausted")


def test_health_is_routed_without_api_key_or_rate_limit() -> None:
    cfg = envoy.build_config(EnvoyConfig(rate_limit_requests=10), api_keys=KEYS)
    routes = _hcm(cfg)["route_config"]["virtual_hosts"][0]["routes"]
    probe = routes[0]  # before the transcoder rewrites the path, so matched first
    assert probe["match"]["path"] == "/health"
    assert {name: c["disabled"] for name, c in probe["typed_per_filter_config"].items()} == {
        "envoy.filters.http.api_key_auth": True, "envoy.filters.http.local_ratelimit": True}
    assert any(r["match"].get("path") == "/meshserve.v1.OpenAI/Health" for r in routes)


def test_the_listener_is_an_edge_as_envoys_edge_guide_sets_one(tmp_path: Path) -> None:
    """Envoy's edge best practices (configuration/best_practices/edge): the client's address from
    the connection, header timeout, underscores refused, HTTP/2 streams and windows bounded, and
    the overload manager on a fixed heap; the real Envoy accepts the config."""
    cfg = EnvoyConfig(http2_max_concurrent_streams=64, request_headers_timeout_s=5, max_heap_bytes=2**29)
    bootstrap = envoy.build_config(cfg, api_keys={})
    hcm = _hcm(bootstrap)
    assert hcm["use_remote_address"] is True and hcm["internal_address_config"] == {"cidr_ranges": []}
    assert hcm["preserve_external_request_id"] is True  # a client's X-Request-Id is still its own
    assert hcm["request_headers_timeout"] == "5s"
    assert hcm["common_http_protocol_options"]["headers_with_underscores_action"] == "REJECT_REQUEST"
    assert hcm["http2_protocol_options"] == {"max_concurrent_streams": 64, "initial_stream_window_size": 65536,
                                             "initial_connection_window_size": 1048576}
    overload = bootstrap["overload_manager"]
    heap = next(m for m in overload["resource_monitors"] if m["name"] == "envoy.resource_monitors.fixed_heap")
    assert heap["typed_config"]["max_heap_size_bytes"] == 2**29
    assert {a["name"]: a["triggers"][0]["threshold"]["value"] for a in overload["actions"]} == {
        "envoy.overload_actions.shrink_heap": 0.95, "envoy.overload_actions.stop_accepting_requests": 0.98}
    path = tmp_path / "envoy.yaml"
    envoy.write_config(cfg, path, api_keys={})
    envoy.validate(path)


def test_the_lua_scanner_is_bounded_by_the_body_limit_and_a_depth() -> None:
    lua = _filters(envoy.build_config(EnvoyConfig(max_request_bytes=4096), api_keys={}))["envoy.filters.http.lua"]
    source = lua["default_source_code"]["inline_string"]
    assert "MAX_BODY_BYTES = 4096\n" in source and f"MAX_JSON_DEPTH = {envoy.EDGE_MAX_JSON_DEPTH}\n" in source
    # every entry point fails closed: the script's own functions run under pcall
    assert "pcall(on_request, handle)" in source and "pcall(on_response, handle)" in source
