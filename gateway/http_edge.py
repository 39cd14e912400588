"""The OpenAI streaming edge over plain HTTP: Server-Sent Events written by the gateway itself.

Envoy's gRPC-JSON transcoder costs a gRPC message per token on both sides of the gateway's
Envoy hop (grpc.aio: ~58 µs of the gateway's CPU per streamed message on this machine, against
~20 µs for a chunk written to an HTTP/1.1 response), and Envoy's JSON printing per message. With
``--http-port``, the gateway also serves the streams of the two OpenAI completion paths over
HTTP/1.1 (Envoy's Lua filter steers their ``"stream": true`` bodies to ``HTTP_EDGE_PATHS``, which
the transcoder passes through), and Envoy proxies them here untranscoded. Everything else, and every gRPC client,
stays on the gRPC services.

The answer is byte-for-byte what the transcoder would print for the same messages (the same
OpenAIServicer runs; the JSON follows the transcoder's print options: proto field names, fields
without presence always printed, no whitespace), and errors are what the edge answers for the
gRPC status: the HTTP status Envoy maps it to and OpenAI's ``{"error": {...}}`` body.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import orjson
from aiohttp import web
from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.trace import Status, StatusCode

from meshserve.gateway.openai_servicer import OpenAIServicer
from meshserve.services import openai_errors, telemetry
from meshserve.services.config import HTTP_EDGE_PATHS
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.server import CannotListen, port_free
from meshserve.services.validation import PARAM_METADATA

log = logging.getLogger(__name__)

# The last event of every stream, as OpenAI's API and `vllm serve` end theirs (after the usage
# chunk, or after an error chunk); some clients read until it comes.
DONE = b"data: [DONE]\n\n"
CHAT_PATH = HTTP_EDGE_PATHS["/v1/chat/completions"]
COMPLETIONS_PATH = HTTP_EDGE_PATHS["/v1/completions"]
HEALTH_PATH = "/health"  # Envoy's health check of this edge: 200 while serving, 503 once draining
# An upstream connection Envoy keeps idle must not be closed by this side first (Envoy's idle
# timeout for this cluster is shorter: deploy/envoy_config.py).
KEEPALIVE_S = 75.0
# Envoy opens a connection per stream: 300 users arriving together are 300 connects while the
# loop is busy relaying. The kernel completes them in the accept queue up to the backlog; past it a
# connect's SYN is dropped and retried a second later. (aiohttp's default: 128; the kernel caps it
# at net.core.somaxconn, 4096 on current kernels.)
LISTEN_BACKLOG = 4096

# gRPC status -> HTTP status, as Envoy's transcoder maps them (Grpc::Utility::grpcToHttpStatus).
HTTP_STATUS = {
    grpc.StatusCode.OK: 200, grpc.StatusCode.CANCELLED: 499, grpc.StatusCode.UNKNOWN: 500,
    grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.DEADLINE_EXCEEDED: 504,
    grpc.StatusCode.NOT_FOUND: 404, grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.PERMISSION_DENIED: 403, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.FAILED_PRECONDITION: 400, grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.OUT_OF_RANGE: 400, grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.INTERNAL: 500,
    grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.DATA_LOSS: 500, grpc.StatusCode.UNAUTHENTICATED: 401,
}


class Aborted(Exception):
    """``context.abort`` of a call served here: the status the answer becomes."""

    def __init__(self, code: grpc.StatusCode, details: str, trailers: tuple[tuple[str, str], ...]) -> None:
        super().__init__(details)
        self.code, self.details, self.trailers = code, details, trailers


class HttpContext:
    """What OpenAIServicer uses of a grpc.aio ServicerContext, for a request served over HTTP:
    the request's headers as invocation metadata, the common name of the client's certificate
    (over mutual TLS) as gRPC's auth context names it, and ``abort``."""

    def __init__(self, headers: dict[str, str], peer_common_name: str = "") -> None:
        self._metadata = tuple(headers.items())
        self._auth = {"x509_common_name": [peer_common_name.encode()]} if peer_common_name else {}

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    async def abort(self, code: grpc.StatusCode, details: str = "",
                    trailing_metadata: tuple[tuple[str, str], ...] = ()) -> None:
        raise Aborted(code, details, tuple(trailing_metadata))


# -- JSON, as the transcoder prints it ---------------------------------------------------------


def to_json(msg: Message) -> bytes:
    """``msg`` as the transcoder prints it (proto field names; fields without presence always)."""
    return orjson.dumps(json_format.MessageToDict(msg, always_print_fields_with_no_presence=True,
                                                  preserving_proto_field_name=True))


def _plain_chat(c: pb.ChatCompletionChunk) -> bytes | None:
    """A chat chunk of text deltas only (the chunk of nearly every token) without reflection:
    the same JSON as ``to_json``; None for any other chunk."""
    if c.HasField("usage") or c.HasField("error") or c.HasField("cache"):
        return None
    choices = []
    for choice in c.choices:
        delta = choice.delta
        if choice.HasField("logprobs") or delta.tool_calls or delta.HasField("reasoning"):
            return None
        out: dict[str, Any] = {"index": choice.index}
        if choice.HasField("delta"):
            d: dict[str, Any] = {}
            out["delta"] = d
            if delta.HasField("role"):
                d["role"] = delta.role
            if delta.HasField("content"):
                d["content"] = delta.content
            d["tool_calls"] = []
        if choice.HasField("finish_reason"):
            out["finish_reason"] = choice.finish_reason
        choices.append(out)
    return orjson.dumps({"id": c.id, "object": c.object, "created": c.created, "model": c.model,
                         "choices": choices, "system_fingerprint": c.system_fingerprint})


def _plain_completion(c: pb.Completion) -> bytes | None:
    """The same for a completion chunk of text only."""
    if c.HasField("usage") or c.HasField("error") or c.HasField("cache"):
        return None
    choices = []
    for choice in c.choices:
        if choice.HasField("logprobs"):
            return None
        out: dict[str, Any] = {"index": choice.index, "text": choice.text}
        if choice.HasField("finish_reason"):
            out["finish_reason"] = choice.finish_reason
        choices.append(out)
    return orjson.dumps({"id": c.id, "object": c.object, "created": c.created, "model": c.model,
                         "choices": choices, "system_fingerprint": c.system_fingerprint})


def chunk_json(msg: pb.ChatCompletionChunk | pb.Completion) -> bytes:
    plain = _plain_chat(msg) if isinstance(msg, pb.ChatCompletionChunk) else _plain_completion(msg)
    return plain if plain is not None else to_json(msg)


def error_body(code: grpc.StatusCode, message: str, param: str | None) -> bytes:
    kind, name = openai_errors.error_type(code)
    return orjson.dumps({"error": {"message": message, "type": kind, "param": param, "code": name}})


def error_response(code: grpc.StatusCode, message: str, trailers: tuple[tuple[str, str], ...] = ()) -> web.Response:
    """A call that failed before its first chunk, as the edge answers it: the HTTP status of its
    gRPC status, OpenAI's error body, the call's trailers (x-trace-id, retry-after) as headers."""
    headers = {k: v for k, v in trailers if k != PARAM_METADATA}
    param = next((v for k, v in trailers if k == PARAM_METADATA), None)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        headers.setdefault("retry-after", "1")
    return web.Response(status=HTTP_STATUS.get(code, 500), body=error_body(code, message, param),
                        content_type="application/json", headers=headers)


# -- the server --------------------------------------------------------------------------------


class SseResponse(web.StreamResponse):
    """A stream whose status line and headers go out with its first chunk, in one send: aiohttp
    sends a StreamResponse's headers on their own at ``prepare()`` unless told otherwise (its
    ``Response`` is told), and on this machine a send costs the gateway ~40 us and Envoy a read."""

    _send_headers_immediately = False


def _peer_common_name(request: web.Request) -> str:
    """The common name of the client certificate the connection was made with ('' if none)."""
    cert = request.transport.get_extra_info("peercert") if request.transport else None
    for rdn in (cert or {}).get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return ""


class HttpEdge:
    """The streaming OpenAI paths on ``host:port`` over HTTP/1.1, served by ``servicer``."""

    def __init__(self, servicer: OpenAIServicer, host: str, port: int, grace_seconds: float,
                 max_body_bytes: int = 2 * 2**20, ssl_context: ssl.SSLContext | None = None) -> None:
        self._servicer = servicer
        self._ssl_context = ssl_context  # mutual TLS: only clients with a mesh certificate
        self._host, self._port = host, port
        self._draining = False
        app = web.Application(client_max_size=max_body_bytes)  # as the gRPC side's bound (413 past it)
        app.router.add_post(CHAT_PATH, self._chat)
        app.router.add_post(COMPLETIONS_PATH, self._completions)
        app.router.add_get(HEALTH_PATH, self._health)
        # handler_cancellation: a client that goes away (Envoy closes the connection) cancels its
        # handler, and the cancellation closes the stream: the worker aborts the request.
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                     keepalive_timeout=KEEPALIVE_S, shutdown_timeout=grace_seconds)
        self._closed: asyncio.Task[None] | None = None
        self.port = port

    async def start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port, reuse_port=False, backlog=LISTEN_BACKLOG,
                           ssl_context=self._ssl_context)
        await port_free("gateway", "the OpenAI HTTP edge", self._host, self._port)
        try:
            await site.start()
        except OSError:
            raise CannotListen("gateway", "the OpenAI HTTP edge", self._host, self._port, "--http-port") from None
        self.port = self._runner.addresses[0][1]
        log.info("gateway serving the OpenAI streaming edge over HTTP%s on %s:%d",
                 "S (mutual TLS)" if self._ssl_context else "", self._host, self.port)

    async def drain(self) -> None:
        """Stop taking new requests (health 503, listener closed) and let streams finish."""
        self._draining = True
        self._closed = asyncio.create_task(self._runner.cleanup())

    async def close(self) -> None:
        if self._closed is None:
            await self.drain()
        assert self._closed is not None
        await self._closed

    async def _health(self, request: web.Request) -> web.Response:
        return web.Response(status=503 if self._draining else 200, text="draining" if self._draining else "ok")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, pb.ChatCompletionRequest, self._servicer.StreamChatCompletions,
                                  "OpenAI/StreamChatCompletions")

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        return await self._stream(request, pb.CompletionRequest, self._servicer.StreamCompletions,
                                  "OpenAI/StreamCompletions")

    async def _stream(
        self, request: web.Request, message: type[Message],
        method: Callable[[Any, Any], AsyncIterator[pb.ChatCompletionChunk | pb.Completion]], name: str,
    ) -> web.StreamResponse:
        headers = {k.lower(): v for k, v in request.headers.items()}
        parent = telemetry.incoming_context(headers.items())
        with telemetry.server_span(name, parent, {"rpc.system": "grpc", "rpc.method": f"/meshserve.v1.{name}",
                                                   "http.route": request.path}) as span:
            try:
                call = json_format.Parse(await request.read(), message())
            except json_format.ParseError as e:  # as the transcoder answers a body it cannot read
                return web.Response(status=400, content_type="application/json", body=orjson.dumps(
                    {"error": {"message": str(e), "type": "invalid_request_error", "param": None,
                               "code": "invalid_request"}}), headers=dict(telemetry.trace_metadata()))
            response: web.StreamResponse | None = None
            last = b""  # the usage chunk, which ends a stream: sent with the end of the response
            try:
                async with contextlib.aclosing(method(call, HttpContext(headers, _peer_common_name(request)))) as stream:
                    async for chunk in stream:
                        data = b"data: " + chunk_json(chunk) + b"\n\n"
                        if response is None:
                            response = SseResponse(headers={"content-type": "text/event-stream",
                                                            **dict(telemetry.trace_metadata())})
                            await response.prepare(request)
                        if chunk.HasField("usage") and not chunk.choices:
                            last = data
                        else:
                            await response.write(data)
            except Aborted as e:
                span.set_attribute("rpc.grpc.status_code", e.code.value[0])
                span.set_status(Status(StatusCode.ERROR, f"{e.code.name}: {e.details}"))
                if response is None:
                    return error_response(e.code, e.details, e.trailers or telemetry.trace_metadata())
                raise  # after the first chunk the servicer ends with an error chunk, never aborts
            except BaseException as e:
                telemetry.mark_failed(span, e)
                raise
            if response is None:  # a stream with no chunk at all
                response = SseResponse(headers={"content-type": "text/event-stream"})
                await response.prepare(request)
            await response.write_eof(last + DONE)
            return response

