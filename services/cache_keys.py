"""Cache keys and entries: one sha256 per (tenant, request) over every field that can change the
output, and the Redis client and entry format both sides use.

Shared by the cache service (which stores the entries) and the gateway (which coalesces identical
requests in flight under the same key, and reads exact entries from Redis itself)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Sequence
from typing import Any

import google.protobuf.message
import prometheus_client
import redis.asyncio as aioredis
from google.protobuf import json_format
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from meshserve.services import validation
from meshserve.services.gen import meshserve_pb2 as pb

log = logging.getLogger(__name__)

KIND_EXACT = "exact"
# A cache must fail fast: a slow or absent Redis costs a request this long at most, and the
# gateway's breaker stops asking while Redis is down.
SOCKET_TIMEOUT_S = 0.25
CONNECT_TIMEOUT_S = 0.25
MAX_CONNECTIONS = 100  # per client (process): Redis's side of a burst stays bounded


def connect(url: str, socket_timeout_s: float = SOCKET_TIMEOUT_S) -> aioredis.Redis:
    """A redis.asyncio client over at most ``MAX_CONNECTIONS`` connections that retries a broken
    one once, without backoff. A call waits up to ``socket_timeout_s`` for a free connection: a
    burst of requests queues for them (redis-py's default pool refuses the 101st call at once
    with MaxConnectionsError, which a burst of 300 cache reads met)."""
    pool = aioredis.BlockingConnectionPool.from_url(
        url,
        max_connections=MAX_CONNECTIONS,
        timeout=socket_timeout_s,
        socket_timeout=socket_timeout_s,
        socket_connect_timeout=min(CONNECT_TIMEOUT_S, socket_timeout_s),
        retry=Retry(NoBackoff(), 1),
    )
    return aioredis.Redis.from_pool(pool)


def refusal(req: pb.GenerateRequest, chunks: Sequence[pb.GenerateResponse] | None = None) -> str:
    """Why this completion must not be cached ('' when it may be); ``chunks`` None: the request
    alone (an entry stored already, to be indexed by meaning)."""
    if req.skip_cache or req.cache == validation.CACHE_OFF:
        return "the cache is off for this request"
    if not validation.is_deterministic(req):
        return "not deterministic (needs temperature 0 or a fixed seed)"
    if chunks is None:
        return ""
    if not chunks:
        return "no chunks"
    if chunks[-1].finish_reason not in validation.FINISHED:
        return f"not finished (finish_reason {chunks[-1].finish_reason!r})"
    return ""


def _entry_bytes(chunks: Sequence[pb.GenerateResponse]) -> bytes:
    """The stored form of a finished stream: its chunks without per-request identity (each reader
    stamps its own on replay), and when it was stored."""
    entry = pb.CacheEntry(stored_at=time.time())
    for chunk in chunks:
        entry.chunks.append(
            pb.GenerateResponse(
                text=chunk.text,
                token_ids=chunk.token_ids,
                logprobs=chunk.logprobs,  # asked for: part of the key, and of the answer
                tool_calls=chunk.tool_calls,  # parse_tool_calls: likewise
                reasoning=chunk.reasoning,  # a worker's reasoning parser: the thinking
                finish_reason=chunk.finish_reason,
                usage=chunk.usage if chunk.HasField("usage") else None,
                cached=True,
            )
        )
    return entry.SerializeToString()


async def store_entry(
    client: aioredis.Redis, key: str, req: pb.GenerateRequest, chunks: Sequence[pb.GenerateResponse],
    ttl_seconds: int, max_entry_bytes: int,
) -> str:
    """Stores the finished stream ``chunks`` of ``req`` under ``key`` for ``ttl_seconds``; returns
    why it was refused ('' when stored). What the cache service and the gateway both write."""
    reason = refusal(req, chunks)
    if reason:
        return reason
    raw = _entry_bytes(chunks)
    if len(raw) > max_entry_bytes:
        return f"too large ({len(raw)} bytes, the bound is {max_entry_bytes})"
    await client.set(key, raw, ex=ttl_seconds)
    return ""


def parse_entry(raw: bytes) -> pb.CacheEntry:
    """A stored entry from its bytes; ValueError when they are not a finished stream (a corrupt or
    truncated entry, which its reader deletes and takes for a miss)."""
    try:
        entry = pb.CacheEntry.FromString(raw)
    except google.protobuf.message.DecodeError as e:
        raise ValueError(f"not a CacheEntry: {e}") from None
    if not entry.chunks or entry.chunks[-1].finish_reason not in validation.FINISHED:
        raise ValueError("no finished stream in it")
    return entry


async def entry_or_delete(
    client: aioredis.Redis, key: str, raw: bytes | None, corrupt: prometheus_client.Counter
) -> pb.CacheEntry | None:
    """The entry stored under ``key`` from its bytes (None: there were none); a corrupt one is
    deleted, counted in ``corrupt`` (each process has its own counter) and taken for a miss."""
    if raw is None:
        return None
    try:
        return parse_entry(raw)
    except ValueError as e:
        corrupt.inc()
        log.warning("cache entry %s is corrupt (%s): deleted", key, e)
        await client.delete(key)
        return None


def canonical(req: pb.GenerateRequest, tenant: str) -> bytes:
    """A stable serialisation of what determines a completion.

    Left out on purpose: ``request_id``, ``skip_cache`` and ``priority`` (they never change the text),
    and ``lora_path`` (where a worker finds the adapter ``model`` names: an answer is the same whether
    the worker held it or loaded it from the registry).
    """
    fields: dict[str, Any] = {
        "tenant": tenant,
        "model": req.model,
        "prompt": req.prompt,
        "messages": [_turn(m) for m in req.messages],
        "max_tokens": validation.max_tokens(req),
        # Unset fields take their serving defaults: unset and spelled-out defaults share an entry.
        "temperature": validation.temperature(req),
        "top_p": validation.top_p(req),
        "seed": req.seed if req.HasField("seed") else None,
        # Stop strings act as a set: their order does not change where generation stops.
        "stop": sorted(set(req.stop)),
        "ignore_eos": req.ignore_eos,
        "presence_penalty": req.presence_penalty,      # unset reads 0.0, the default
        "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": validation.repetition_penalty(req),
        "top_k": max(req.top_k, 0),                    # -1 and 0 both mean off
        "min_p": req.min_p,
        "min_tokens": req.min_tokens,
        "stop_token_ids": sorted(set(req.stop_token_ids)),
        "logit_bias": sorted(req.logit_bias.items()),
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "skip_special_tokens": validation.skip_special_tokens(req),
        "logprobs": req.logprobs if req.HasField("logprobs") else None,
        "structured_outputs": json_format.MessageToDict(req.structured_outputs)
        if req.HasField("structured_outputs") else None,
        "tools": req.tools,
        "parse_tool_calls": req.parse_tool_calls,
    }
    if req.chat_template_kwargs:  # only when set: the keys of requests without any stay as they were
        fields["chat_template_kwargs"] = req.chat_template_kwargs  # as sent (the OpenAI edge sorts its keys)
    if req.HasField("include_reasoning") and not req.include_reasoning:  # likewise; unset means true
        fields["include_reasoning"] = False
    if not validation.add_generation_prompt(req):  # likewise: both change the prompt's end
        fields["add_generation_prompt"] = False
    if req.continue_final_message:
        fields["continue_final_message"] = True
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _turn(m: pb.ChatMessage) -> list[Any]:
    """A chat turn: role and content, and a tool call's id or an assistant's calls when it has them
    (a plain turn's part of the key is unchanged by those fields)."""
    turn: list[Any] = [m.role, m.content]
    if m.tool_call_id or m.tool_calls:
        turn += [m.tool_call_id, [[c.id, c.name, c.arguments] for c in m.tool_calls]]
    if m.reasoning:  # likewise: only a turn that has thinking keys it
        turn.append({"reasoning": m.reasoning})
    return turn


def exact_key(req: pb.GenerateRequest, tenant: str, prefix: str = "") -> str:
    """The Redis key of the exact-match entry for ``req`` (``prefix`` + kind + hex digest)."""
    return f"{prefix}{KIND_EXACT}:{hashlib.sha256(canonical(req, tenant)).hexdigest()}"
