"""Cache keys: one sha256 per (tenant, request) over every field that can change the output.

Shared by the cache service (where entries live) and the gateway (which coalesces identical
requests in flight under the same key)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from google.protobuf import json_format

from services import validation
from services.gen import meshserve_pb2 as pb

KIND_EXACT = "exact"


def canonical(req: pb.GenerateRequest, tenant: str) -> bytes:
    """A stable serialisation of what determines a completion.

    Left out on purpose: ``request_id`` and ``skip_cache`` (they never change the text).
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
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _turn(m: pb.ChatMessage) -> list[Any]:
    """A chat turn: role and content, and a tool call's id or an assistant's calls when it has them
    (a plain turn's part of the key is unchanged by those fields)."""
    turn: list[Any] = [m.role, m.content]
    if m.tool_call_id or m.tool_calls:
        turn += [m.tool_call_id, [[c.id, c.name, c.arguments] for c in m.tool_calls]]
    return turn


def exact_key(req: pb.GenerateRequest, tenant: str, prefix: str = "") -> str:
    """The Redis key of the exact-match entry for ``req`` (``prefix`` + kind + hex digest)."""
    return f"{prefix}{KIND_EXACT}:{hashlib.sha256(canonical(req, tenant)).hexdigest()}"
