"""How a gRPC status reads as an OpenAI error object: one table, used by the gateway (an error
that ends an OpenAI stream after its first chunk) and by Envoy's Lua filter (an error before any
answer), whose table ``deploy/envoy_config.py`` renders from this one."""

from __future__ import annotations

import grpc

# gRPC status -> the OpenAI error `type`; the error's `code` is the status name in lower case.
TYPES: dict[grpc.StatusCode, str] = {
    grpc.StatusCode.CANCELLED: "cancelled",
    grpc.StatusCode.INVALID_ARGUMENT: "invalid_request_error",
    grpc.StatusCode.OUT_OF_RANGE: "invalid_request_error",
    grpc.StatusCode.FAILED_PRECONDITION: "invalid_request_error",  # a 400: the fleet cannot do what was asked
    grpc.StatusCode.NOT_FOUND: "not_found_error",
    grpc.StatusCode.UNAUTHENTICATED: "authentication_error",
    grpc.StatusCode.PERMISSION_DENIED: "permission_error",
    grpc.StatusCode.RESOURCE_EXHAUSTED: "rate_limit_error",
    grpc.StatusCode.UNAVAILABLE: "service_unavailable",
    grpc.StatusCode.DEADLINE_EXCEEDED: "timeout",
}
DEFAULT_TYPE = "server_error"  # any other status (INTERNAL, UNKNOWN, ...)


def error_type(code: grpc.StatusCode) -> tuple[str, str]:
    """The OpenAI error's (type, code) for a gRPC status."""
    return TYPES.get(code, DEFAULT_TYPE), code.name.lower()


def lua_table() -> str:
    """The same table for Envoy's Lua filter: ``ERROR_TYPES[numeric status] = {type, code}``."""
    rows = ", ".join(f'[{code.value[0]}] = {{"{kind}", "{name}"}}'
                     for code in grpc.StatusCode if code is not grpc.StatusCode.OK
                     for kind, name in [error_type(code)])
    return f"ERROR_TYPES = {{{rows}}}\n"
