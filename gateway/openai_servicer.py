"""The OpenAI-compatible service: OpenAI messages in and out, the Orchestrator in between.

Envoy transcodes ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` to these RPCs,
so cache, routing, failover and admission apply exactly as for the Inference service. Errors
before the first chunk are gRPC statuses (Envoy maps them to HTTP); after it, the stream ends
with one chunk carrying only an ``error`` object, since the HTTP status is already sent.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import aclosing
from typing import TypeVar

import grpc

from gateway import openai_convert as convert
from gateway.orchestrator import GatewayError, Orchestrator
from services.gen import meshserve_pb2 as pb
from services.gen import meshserve_pb2_grpc as pb_grpc
from services.validation import InvalidRequest

OWNED_BY = "meshserve"

Chunk = TypeVar("Chunk", pb.ChatCompletionChunk, pb.Completion)


class OpenAIServicer(pb_grpc.OpenAIServicer):
    """Thin: converts OpenAI messages, runs the orchestrator, maps GatewayError to a status."""

    SERVICE_NAME = pb.DESCRIPTOR.services_by_name["OpenAI"].full_name

    def __init__(
        self,
        orchestrator: Orchestrator,
        model: str,
        tenant: Callable[[grpc.aio.ServicerContext], str],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._orch = orchestrator
        self._model = model
        self._tenant = tenant
        self._clock = clock
        self._started = int(clock())

    async def ChatCompletions(
        self, request: pb.ChatCompletionRequest, context: grpc.aio.ServicerContext
    ) -> pb.ChatCompletion:
        req = await self._convert(convert.chat_request, request, context)
        resp = await self._complete(req, context)
        return convert.chat_completion(resp, self._model, int(self._clock()))

    async def Completions(self, request: pb.CompletionRequest, context: grpc.aio.ServicerContext) -> pb.Completion:
        req = await self._convert(convert.completion_request, request, context)
        resp = await self._complete(req, context)
        return convert.completion(resp, self._model, int(self._clock()))

    async def StreamChatCompletions(
        self, request: pb.ChatCompletionRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ChatCompletionChunk]:
        req = await self._convert(convert.chat_request, request, context)
        created, usage = int(self._clock()), request.stream_options.include_usage
        first = True

        def chunks(c: pb.GenerateResponse) -> Iterable[pb.ChatCompletionChunk]:
            nonlocal first
            out = convert.chat_chunks(c, first, self._model, created, usage)
            first = False
            return out

        def failed(e: GatewayError) -> pb.ChatCompletionChunk:
            return pb.ChatCompletionChunk(object="chat.completion.chunk", created=created, model=self._model,
                                          error=convert.error(e.code, e.message))

        async for chunk in self._stream(req, context, chunks, failed):
            yield chunk

    async def StreamCompletions(
        self, request: pb.CompletionRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Completion]:
        req = await self._convert(convert.completion_request, request, context)
        created, usage = int(self._clock()), request.stream_options.include_usage

        def chunks(c: pb.GenerateResponse) -> Iterable[pb.Completion]:
            return convert.completion_chunks(c, self._model, created, usage)

        def failed(e: GatewayError) -> pb.Completion:
            return pb.Completion(object="text_completion", created=created, model=self._model,
                                 error=convert.error(e.code, e.message))

        async for chunk in self._stream(req, context, chunks, failed):
            yield chunk

    async def ListModels(self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext) -> pb.ModelList:
        return pb.ModelList(object="list", data=[self._model_card()])

    async def RetrieveModel(self, request: pb.RetrieveModelRequest, context: grpc.aio.ServicerContext) -> pb.Model:
        if request.model != self._model:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"model {request.model!r} not found; this mesh serves {self._model!r}")
        return self._model_card()

    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthStatus:
        workers, why = await self._orch.serving_workers()
        if not workers:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"no worker can serve: {why}")
        return pb.HealthStatus(status="ok", workers=workers)

    # -- helpers ------------------------------------------------------------------------------

    def _model_card(self) -> pb.Model:
        return pb.Model(id=self._model, object="model", created=self._started, owned_by=OWNED_BY)

    @staticmethod
    async def _convert(fn, request, context: grpc.aio.ServicerContext) -> pb.GenerateRequest:  # noqa: ANN001
        try:
            return fn(request)
        except InvalidRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise  # unreachable: abort raises

    async def _complete(self, req: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.CompleteResponse:
        try:
            return await self._orch.complete(req, self._tenant(context))
        except GatewayError as e:
            await context.abort(e.code, e.message, trailing_metadata=e.trailers)
            raise  # unreachable: abort raises

    async def _stream(
        self,
        req: pb.GenerateRequest,
        context: grpc.aio.ServicerContext,
        chunks: Callable[[pb.GenerateResponse], Iterable[Chunk]],
        failed: Callable[[GatewayError], Chunk],
    ) -> AsyncIterator[Chunk]:
        sent = False
        # aclosing: a cancelled client cancels the worker call now, not when the generator is collected.
        async with aclosing(self._orch.generate(req, self._tenant(context))) as stream:
            try:
                async for chunk in stream:
                    for out in chunks(chunk):
                        sent = True
                        yield out
            except GatewayError as e:
                if not sent:
                    await context.abort(e.code, e.message, trailing_metadata=e.trailers)
                yield failed(e)
