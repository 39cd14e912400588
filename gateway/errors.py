"""How a gateway request ends badly: a gRPC status, a message a person understands and, where it
helps the client, trailing metadata (the field at fault, a retry hint)."""

from __future__ import annotations

import grpc

from meshserve.services import validation

RETRY_AFTER_S = 1
# Worker errors that are the request's fault: another worker would say the same.
CLIENT_ERRORS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.OUT_OF_RANGE})


class GatewayError(Exception):
    """Ends a request with a gRPC status (and optional trailing metadata)."""

    def __init__(
        self, code: grpc.StatusCode, message: str, trailers: tuple[tuple[str, str], ...] = ()
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailers = trailers


def overloaded(what: str) -> GatewayError:
    """RESOURCE_EXHAUSTED with a retry hint: the caller may come back shortly."""
    return GatewayError(grpc.StatusCode.RESOURCE_EXHAUSTED, f"{what}; retry after {RETRY_AFTER_S}s",
                        (("retry-after", str(RETRY_AFTER_S)),))


def invalid(code: grpc.StatusCode, message: str, param: str | None) -> GatewayError:
    """The request's own fault, naming the field (``param``) when one is known."""
    return GatewayError(code, message, validation.param_metadata(param))
