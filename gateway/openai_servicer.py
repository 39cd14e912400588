"""The OpenAI-compatible service: OpenAI messages in and out, the Orchestrator in between.

Envoy transcodes ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models`` to these RPCs,
so cache, routing, failover and admission apply exactly as for the Inference service. Errors
before the first chunk are gRPC statuses (Envoy maps them to HTTP); after it, the stream ends
with one chunk carrying only an ``error`` object, since the HTTP status is already sent.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, aclosing
from typing import TypeVar, cast

import grpc

from meshserve.gateway import openai_convert as convert
from meshserve.gateway.errors import GatewayError
from meshserve.gateway.orchestrator import Orchestrator
from meshserve.services import telemetry
from meshserve.services.config import RequestLimits
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.validation import PARAM_METADATA, InvalidRequest, param_metadata, unknown_model

OWNED_BY = "meshserve"

Chunk = TypeVar("Chunk", pb.ChatCompletionChunk, pb.Completion)
T = TypeVar("T")


class OpenAIServicer(pb_grpc.OpenAIServicer):
    """Thin: converts OpenAI messages, runs the orchestrator, maps GatewayError to a status."""

    SERVICE_NAME = pb.DESCRIPTOR.services_by_name["OpenAI"].full_name

    def __init__(
        self,
        orchestrator: Orchestrator,
        model: str,
        tenant: Callable[[grpc.aio.ServicerContext], Awaitable[str]],
        clock: Callable[[], float] = time.time,
        limits: RequestLimits | None = None,
    ) -> None:
        self._orch = orchestrator
        self._model = model
        self._limits = limits
        self._tenant = tenant
        self._clock = clock
        self._started = int(clock())

    async def ChatCompletions(
        self, request: pb.ChatCompletionRequest, context: grpc.aio.ServicerContext
    ) -> pb.ChatCompletion:
        req = await self._convert(convert.chat_request, request, context)
        response_id, reqs = self._choices(req, request)
        resps = await self._complete(reqs, context, _limit_name(request))
        return convert.chat_completion(resps, response_id, req.HasField("logprobs"), _answered_by(request, self._model),
                                       int(self._clock()), convert.tool_choice(request), await self._fingerprint(request.model))

    async def Completions(self, request: pb.CompletionRequest, context: grpc.aio.ServicerContext) -> pb.Completion:
        req = await self._convert(convert.completion_request, request, context)
        response_id, reqs = self._choices(req, request)
        resps = await self._complete(reqs, context)
        echo = req.prompt if request.echo else ""
        return convert.completion(resps, response_id, req.HasField("logprobs"), echo, _answered_by(request, self._model),
                                  int(self._clock()), await self._fingerprint(request.model))

    async def StreamChatCompletions(
        self, request: pb.ChatCompletionRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.ChatCompletionChunk]:
        req = await self._convert(convert.chat_request, request, context)
        response_id, reqs = self._choices(req, request)
        created, logprobs = int(self._clock()), req.HasField("logprobs")
        fingerprint = await self._fingerprint(request.model)
        model = _answered_by(request, self._model)
        head = {"id": f"chatcmpl-{response_id}", "object": "chat.completion.chunk", "created": created,
                "model": model, "system_fingerprint": fingerprint}
        tools = convert.tool_choice(request)
        started: set[int] = set()
        held: dict[int, list[str]] = {}  # a "required" call's text so far, by choice: sent when complete

        def chunk(index: int, c: pb.GenerateResponse) -> pb.ChatCompletionChunk:
            first = index not in started
            started.add(index)
            so_far = ""
            if tools[0] == convert.REQUIRED:
                parts = held.setdefault(index, [])
                so_far = "".join(parts) if c.finish_reason else ""
                parts.append(c.text)
            return convert.chat_chunk(c, index, first, response_id, logprobs, model, created, tools, so_far,
                                      fingerprint)

        def usage(u: pb.Usage) -> pb.ChatCompletionChunk:
            return pb.ChatCompletionChunk(**head, usage=convert.usage(u))

        def failed(e: GatewayError) -> pb.ChatCompletionChunk:
            return pb.ChatCompletionChunk(**head, error=convert.error(e.code, e.message, e.trailers))

        async for out in self._stream(reqs, context, chunk, usage if request.stream_options.include_usage else None,
                                      failed, _limit_name(request)):
            yield out

    async def StreamCompletions(
        self, request: pb.CompletionRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.Completion]:
        req = await self._convert(convert.completion_request, request, context)
        response_id, reqs = self._choices(req, request)
        created, logprobs = int(self._clock()), req.HasField("logprobs")
        fingerprint = await self._fingerprint(request.model)
        model = _answered_by(request, self._model)
        head = {"id": f"cmpl-{response_id}", "object": "text_completion", "created": created, "model": model,
                "system_fingerprint": fingerprint}
        sent: dict[int, int] = {}  # choice -> characters of its text sent so far

        def chunk(index: int, c: pb.GenerateResponse) -> pb.Completion:
            echo = req.prompt if request.echo and index not in sent else ""
            out = convert.completion_chunk(c, index, echo, sent.get(index, 0), response_id, logprobs,
                                           model, created, fingerprint)
            sent[index] = sent.get(index, 0) + len(echo) + len(c.text)
            return out

        def usage(u: pb.Usage) -> pb.Completion:
            return pb.Completion(**head, usage=convert.usage(u))

        def failed(e: GatewayError) -> pb.Completion:
            return pb.Completion(**head, error=convert.error(e.code, e.message, e.trailers))

        async for out in self._stream(reqs, context, chunk, usage if request.stream_options.include_usage else None,
                                      failed):
            yield out

    async def ListModels(self, request: pb.ListModelsRequest, context: grpc.aio.ServicerContext) -> pb.ModelList:
        models, adapters = await self._orch.models(), await self._orch.adapters()
        return pb.ModelList(object="list", data=[*[await self._model_card(m) for m in models],
                                                 *(self._adapter_card(n, p) for n, p in adapters.items())])

    async def RetrieveModel(self, request: pb.RetrieveModelRequest, context: grpc.aio.ServicerContext) -> pb.Model:
        models, adapters = await self._orch.models(), await self._orch.adapters()
        if request.model in models:
            return await self._model_card(request.model)
        if request.model not in adapters:
            await context.abort(grpc.StatusCode.NOT_FOUND, unknown_model(request.model, models, adapters))
        return self._adapter_card(request.model, adapters[request.model])

    async def Health(self, request: pb.HealthRequest, context: grpc.aio.ServicerContext) -> pb.HealthStatus:
        workers, why = await self._orch.serving_workers()
        if not workers:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"no worker can serve: {why}")
        return pb.HealthStatus(status="ok", workers=workers)

    async def Tokenize(self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext) -> pb.TokenizeResponse:
        req = await self._convert(convert.tokenize_request, request, context)
        return await self._on_a_worker(req.model, lambda: self._orch.tokenize(req), context)

    async def Detokenize(self, request: pb.DetokenizeRequest, context: grpc.aio.ServicerContext
                         ) -> pb.DetokenizeResponse:
        return await self._on_a_worker(request.model, lambda: self._orch.detokenize(request), context)

    # -- helpers ------------------------------------------------------------------------------

    async def _model_card(self, model: str) -> pb.Model:
        card = self._card(model, root=model)
        if (context_len := await self._orch.max_model_len(model)) is not None:
            card.max_model_len = context_len
        return card

    def _adapter_card(self, name: str, path: str) -> pb.Model:
        """A LoRA adapter's card, as vLLM's: its folder as root, its base model as its parent."""
        return self._card(name, root=path, parent=self._orch.parent(name))

    def _card(self, model: str, **fields: str) -> pb.Model:
        return pb.Model(id=model, object="model", created=self._started, owned_by=OWNED_BY, **fields,
                        permission=[pb.ModelPermission(
                            id=f"modelperm-{self._started}", object="model_permission", created=self._started,
                            allow_sampling=True, allow_logprobs=True, allow_view=True, organization="*")])

    async def _fingerprint(self, model: str) -> str:
        """This answer's ``system_fingerprint``: the weights the fleet serves for ``model``."""
        return convert.fingerprint(await self._orch.weights(model))

    async def _convert(self, fn, request, context: grpc.aio.ServicerContext) -> pb.GenerateRequest:  # noqa: ANN001
        try:  # a large request (a long chat, JSON schemas) is converted and checked off the event loop
            return await self._orch.checks.run(convert.cost(request), fn, request, self._limits)
        except InvalidRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e), _trailers(param_metadata(e.param)))
            raise  # unreachable: abort raises

    async def _on_a_worker(self, model: str, call: Callable[[], Awaitable[T]], context: grpc.aio.ServicerContext) -> T:
        """``call`` (a worker's answer) for a request naming ``model``, or the status it failed with."""
        models, adapters = await self._orch.models(), await self._orch.adapters()
        if model and model != self._model and model not in models and model not in adapters:
            await context.abort(grpc.StatusCode.NOT_FOUND, unknown_model(model, models, adapters),
                                _trailers(param_metadata("model")))
        try:
            return await call()
        except GatewayError as e:
            await context.abort(e.code, e.message, _trailers(e.trailers))
            raise  # unreachable: abort raises

    @staticmethod
    def _choices(
        req: pb.GenerateRequest, request: pb.ChatCompletionRequest | pb.CompletionRequest
    ) -> tuple[str, list[pb.GenerateRequest]]:
        """The response's id and one GenerateRequest per choice (``n``)."""
        response_id = uuid.uuid4().hex
        return response_id, convert.choice_requests(req, response_id, convert.choices(request))

    async def _complete(
        self, reqs: list[pb.GenerateRequest], context: grpc.aio.ServicerContext, limit: str = "max_tokens"
    ) -> list[pb.CompleteResponse]:
        """Every choice's completion, generated at once; the first failure ends the call (and
        cancels the other choices). ``limit``: what the client called the token limit."""
        tenant = await self._tenant(context)
        failure: GatewayError
        try:
            async with self._orch.account(reqs, tenant) as bill:
                if len(reqs) == 1:
                    return [await self._orch.complete(reqs[0], tenant, bill.choices[0])]
                try:
                    async with asyncio.TaskGroup() as group:
                        tasks = [group.create_task(self._orch.complete(r, tenant, sent))
                                 for r, sent in zip(reqs, bill.choices, strict=True)]
                    return [t.result() for t in tasks]
                except* GatewayError as errors:
                    failure = cast(GatewayError, errors.exceptions[0])
        except GatewayError as e:
            failure = e
        failure = _as_sent(failure, limit)
        await context.abort(failure.code, failure.message, trailing_metadata=failure.trailers)
        raise AssertionError("unreachable: abort raises")

    async def _stream(
        self,
        reqs: list[pb.GenerateRequest],
        context: grpc.aio.ServicerContext,
        chunk: Callable[[int, pb.GenerateResponse], Chunk],
        usage: Callable[[pb.Usage], Chunk] | None,
        failed: Callable[[GatewayError], Chunk],
        limit: str = "max_tokens",
    ) -> AsyncIterator[Chunk]:
        """Every choice's stream, chunks by choice index as they come; then the usage chunk, if
        asked for. A failure before the first chunk is the call's status, after it a last chunk.
        ``limit``: what the client called the token limit."""
        sent = False
        usages: dict[int, pb.Usage] = {}
        tenant = await self._tenant(context)
        try:
            async with AsyncExitStack() as stack:
                bill = await stack.enter_async_context(self._orch.account(reqs, tenant))
                # aclosing: a cancelled client cancels the worker calls now, not when the generator is collected.
                stream = await stack.enter_async_context(aclosing(interleave(
                    [self._orch.generate(r, tenant, choice) for r, choice in zip(reqs, bill.choices, strict=True)])))
                async for index, c in stream:
                    if c.HasField("usage"):
                        usages[index] = c.usage
                    sent = True
                    yield chunk(index, c)
        except GatewayError as e:
            e = _as_sent(e, limit)
            if not sent:
                await context.abort(e.code, e.message, trailing_metadata=e.trailers)
            yield failed(e)
            return
        if usage is not None:
            yield usage(convert.total_usage([usages[i] for i in sorted(usages)]))


def _answered_by(request: pb.ChatCompletionRequest | pb.CompletionRequest, model: str) -> str:
    """The ``model`` of an answer: the LoRA adapter the request named, else the served ``model``
    (as vLLM's server names it)."""
    return request.model or model


def _limit_name(request: pb.ChatCompletionRequest) -> str:
    """The name a chat request gave its token limit: OpenAI's newer ``max_completion_tokens`` wins."""
    return "max_completion_tokens" if request.HasField("max_completion_tokens") else "max_tokens"


def _as_sent(e: GatewayError, limit: str) -> GatewayError:
    """``e`` in the client's words: the gateway and the workers name the token limit
    ``max_tokens`` (GenerateRequest's field), which a chat request may have sent as ``limit``."""
    if limit == "max_tokens" or "max_tokens" not in e.message:
        return e
    trailers = tuple((k, limit if k == PARAM_METADATA and v == "max_tokens" else v) for k, v in e.trailers)
    return GatewayError(e.code, re.sub(r"\bmax_tokens\b", limit, e.message), trailers)


def _trailers(extra: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """Trailing metadata for an abort: ``extra`` and the trace id (trailers given to abort
    replace the x-trace-id the tracing interceptor set)."""
    if any(k == telemetry.TRACE_ID_METADATA for k, _ in extra):
        return extra
    return (*extra, *telemetry.trace_metadata())


async def interleave(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """(index, item) from every stream as they come; the first error ends it and closes the rest."""
    if len(streams) == 1:  # the common case: no task, no queue
        async with aclosing(streams[0]) as only:  # type: ignore[type-var]
            async for item in only:
                yield 0, item
        return
    queue: asyncio.Queue[tuple[int, T | BaseException | None]] = asyncio.Queue()  # bounded by max_tokens

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async with aclosing(stream):  # type: ignore[type-var]
                async for item in stream:
                    queue.put_nowait((index, item))
        except Exception as e:
            queue.put_nowait((index, e))
        else:
            queue.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        for _ in range(len(tasks)):
            while True:
                index, item = await queue.get()
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item
                yield index, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
