"""OpenAI request/response messages <-> the mesh's GenerateRequest/GenerateResponse.

Pure functions: the OpenAI servicer calls them around the Orchestrator. A request field that
would change the output and that the mesh cannot honour (``n`` > 1, penalties, logprobs, ...)
is refused with InvalidRequest naming it, rather than silently ignored.
"""

from __future__ import annotations

from collections.abc import Iterable

import grpc
from google.protobuf import struct_pb2

from services import openai_errors
from services.gen import meshserve_pb2 as pb
from services.validation import InvalidRequest

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions


def _text_parts(value: struct_pb2.Value, name: str) -> str:
    """A message's content: a string, a list of text parts, or null."""
    kind = value.WhichOneof("kind")
    if kind in (None, "null_value"):
        return ""
    if kind == "string_value":
        return value.string_value
    if kind == "list_value":
        texts: list[str] = []
        for i, part in enumerate(value.list_value.values):
            fields = part.struct_value.fields if part.WhichOneof("kind") == "struct_value" else {}
            kind_ok = "type" in fields and fields["type"].string_value == "text"
            if not kind_ok or "text" not in fields or fields["text"].WhichOneof("kind") != "string_value":
                raise InvalidRequest(f"'{name}[{i}]' must be a text part {{\"type\": \"text\", \"text\": \"...\"}}")
            texts.append(fields["text"].string_value)
        return "".join(texts)
    raise InvalidRequest(f"'{name}' must be a string or a list of text parts")


def _stop(value: struct_pb2.Value) -> list[str]:
    kind = value.WhichOneof("kind")
    if kind in (None, "null_value"):
        return []
    if kind == "string_value":
        return [value.string_value]
    if kind == "list_value" and all(v.WhichOneof("kind") == "string_value" for v in value.list_value.values):
        return [v.string_value for v in value.list_value.values]
    raise InvalidRequest("'stop' must be a string or a list of strings")


def _unsupported(req: pb.ChatCompletionRequest | pb.CompletionRequest) -> None:
    if req.HasField("n") and req.n != 1:
        raise InvalidRequest(f"'n' must be 1 (one choice per request is supported), got {req.n}")
    for name in ("presence_penalty", "frequency_penalty"):
        if req.HasField(name) and getattr(req, name) != 0:
            raise InvalidRequest(f"'{name}' is not supported (only 0), got {getattr(req, name):g}")


def _sampling(req: pb.ChatCompletionRequest | pb.CompletionRequest, out: pb.GenerateRequest) -> None:
    for name in ("temperature", "top_p", "seed", "stream_interval"):
        if req.HasField(name):
            setattr(out, name, getattr(req, name))
    out.stop.extend(_stop(req.stop))
    out.ignore_eos = req.ignore_eos
    out.skip_cache = req.skip_cache
    out.cache = req.cache
    out.model = req.model
    out.user = req.user


def chat_request(req: pb.ChatCompletionRequest) -> pb.GenerateRequest:
    """The GenerateRequest a chat completion asks for; raises InvalidRequest naming the field."""
    _unsupported(req)
    if req.HasField("logprobs") and req.logprobs:
        raise InvalidRequest("'logprobs' is not supported")
    if not req.messages:
        raise InvalidRequest("'messages' is empty: give at least one message")
    out = pb.GenerateRequest()
    for i, m in enumerate(req.messages):
        out.messages.add(role=m.role, content=_text_parts(m.content, f"messages[{i}].content"))
    if req.HasField("max_completion_tokens"):
        out.max_tokens = req.max_completion_tokens
    elif req.HasField("max_tokens"):
        out.max_tokens = req.max_tokens
    _sampling(req, out)
    return out


def completion_request(req: pb.CompletionRequest) -> pb.GenerateRequest:
    """The GenerateRequest a text completion asks for; raises InvalidRequest naming the field."""
    _unsupported(req)
    if req.HasField("logprobs") and req.logprobs:
        raise InvalidRequest("'logprobs' is not supported")
    if req.HasField("echo") and req.echo:
        raise InvalidRequest("'echo' is not supported")
    if req.HasField("best_of") and req.best_of != 1:
        raise InvalidRequest(f"'best_of' must be 1, got {req.best_of}")
    kind = req.prompt.WhichOneof("kind")
    if kind == "string_value":
        prompt = req.prompt.string_value
    elif (
        kind == "list_value"
        and len(req.prompt.list_value.values) == 1
        and req.prompt.list_value.values[0].WhichOneof("kind") == "string_value"
    ):
        prompt = req.prompt.list_value.values[0].string_value
    elif kind in (None, "null_value"):
        raise InvalidRequest("'prompt' is missing")
    else:
        raise InvalidRequest("'prompt' must be a string (batches and token-id prompts are not supported)")
    out = pb.GenerateRequest(prompt=prompt)
    out.max_tokens = req.max_tokens if req.HasField("max_tokens") else COMPLETIONS_DEFAULT_MAX_TOKENS
    _sampling(req, out)
    return out


def usage(u: pb.Usage) -> pb.CompletionUsage:
    return pb.CompletionUsage(
        prompt_tokens=u.prompt_tokens,
        completion_tokens=u.completion_tokens,
        total_tokens=u.prompt_tokens + u.completion_tokens,
        prompt_tokens_details=pb.PromptTokensDetails(cached_tokens=u.cached_prompt_tokens),
    )


def cache_info(resp: pb.GenerateResponse | pb.CompleteResponse) -> pb.CacheInfo | None:
    """How an answer was served when not generated for this request alone (None when it was)."""
    if not resp.cache_kind:
        return None
    return pb.CacheInfo(kind=resp.cache_kind, age_s=resp.cache_age_s, similarity=resp.cache_similarity)


def chat_completion(resp: pb.CompleteResponse, model: str, created: int) -> pb.ChatCompletion:
    return pb.ChatCompletion(
        id=f"chatcmpl-{resp.request_id}",
        object="chat.completion",
        created=created,
        model=model,
        choices=[
            pb.ChatCompletionChoice(
                index=0,
                message=pb.ChatCompletionMessage(role="assistant", content=resp.text),
                finish_reason=resp.finish_reason,
            )
        ],
        usage=usage(resp.usage),
        cache=cache_info(resp),
    )


def completion(resp: pb.CompleteResponse, model: str, created: int) -> pb.Completion:
    return pb.Completion(
        id=f"cmpl-{resp.request_id}",
        object="text_completion",
        created=created,
        model=model,
        choices=[pb.CompletionChoice(index=0, text=resp.text, finish_reason=resp.finish_reason)],
        usage=usage(resp.usage),
        cache=cache_info(resp),
    )


def chat_chunks(
    chunk: pb.GenerateResponse, first: bool, model: str, created: int, include_usage: bool
) -> Iterable[pb.ChatCompletionChunk]:
    """The OpenAI chunks for one mesh chunk: the delta (the first carries the role), then, after
    the last one, the usage chunk when the client asked for it."""
    head = {"id": f"chatcmpl-{chunk.request_id}", "object": "chat.completion.chunk", "created": created, "model": model}
    delta = pb.ChatCompletionDelta(content=chunk.text)
    if first:
        delta.role = "assistant"
    choice = pb.ChatCompletionChunkChoice(index=0, delta=delta)
    if chunk.finish_reason:
        choice.finish_reason = chunk.finish_reason
    yield pb.ChatCompletionChunk(**head, choices=[choice], cache=cache_info(chunk) if chunk.finish_reason else None)
    if chunk.finish_reason and include_usage:
        yield pb.ChatCompletionChunk(**head, usage=usage(chunk.usage))


def completion_chunks(
    chunk: pb.GenerateResponse, model: str, created: int, include_usage: bool
) -> Iterable[pb.Completion]:
    head = {"id": f"cmpl-{chunk.request_id}", "object": "text_completion", "created": created, "model": model}
    choice = pb.CompletionChoice(index=0, text=chunk.text)
    if chunk.finish_reason:
        choice.finish_reason = chunk.finish_reason
    yield pb.Completion(**head, choices=[choice], cache=cache_info(chunk) if chunk.finish_reason else None)
    if chunk.finish_reason and include_usage:
        yield pb.Completion(**head, usage=usage(chunk.usage))


def error(code: grpc.StatusCode, message: str) -> pb.OpenAIError:
    """The error object that ends a stream which failed after its first chunk."""
    kind, name = openai_errors.error_type(code)
    return pb.OpenAIError(message=message, type=kind, code=name)
