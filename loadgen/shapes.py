"""Response shapes (keys and JSON types, not values) of OpenAI API answers, to compare meshserve
with `vllm serve` on the same requests. bench/record_vllm_shapes.py records vLLM's into
tests/data/vllm_serve_shapes.json; tests/integration/test_mesh_vllm.py compares meshserve's with
them (httpx, the client, comes with the test extra)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

RECORDED = Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm_serve_shapes.json"

_CHAT = {"messages": [{"role": "user", "content": "Name a colour"}], "max_tokens": 5, "temperature": 0.5}
_TEXT = {"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0.5}
_STREAM = {"stream": True, "stream_options": {"include_usage": True}}
_TOOL = {"type": "function", "function": {"name": "pick", "parameters": {
    "type": "object", "additionalProperties": False, "required": ["colour"],
    "properties": {"colour": {"enum": ["red", "green", "blue"]}}}}}
_NAMED = {"type": "function", "function": {"name": "pick"}}
# name -> (path, body); the model is added when sent.
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "chat": ("/v1/chat/completions", _CHAT),
    "chat-logprobs-n": ("/v1/chat/completions", {**_CHAT, "n": 2, "seed": 1, "logprobs": True, "top_logprobs": 2}),
    "chat-stream": ("/v1/chat/completions", {**_CHAT, **_STREAM}),
    "chat-stream-logprobs-n": ("/v1/chat/completions",
                               {**_CHAT, **_STREAM, "n": 2, "seed": 1, "logprobs": True, "top_logprobs": 2}),
    "completion": ("/v1/completions", _TEXT),
    "completion-logprobs-n": ("/v1/completions", {**_TEXT, "n": 2, "seed": 1, "logprobs": 2}),
    "completion-stream-logprobs": ("/v1/completions", {**_TEXT, **_STREAM, "logprobs": 2}),
    "chat-tool-named": ("/v1/chat/completions", {**_CHAT, "max_tokens": 40, "tools": [_TOOL], "tool_choice": _NAMED}),
    "chat-stream-tool-named": ("/v1/chat/completions",
                               {**_CHAT, **_STREAM, "max_tokens": 40, "tools": [_TOOL], "tool_choice": _NAMED}),
    "models": ("/v1/models", {}),
}
# Objects whose keys are data (completions' top_logprobs: {token: logprob}), not names.
DATA_KEYED = {"choices[].logprobs.top_logprobs[]"}

Shape = Any  # "string" | "number" | "bool" | None | [Shape] | [] | {key: Shape}


def shape(value: Any, path: str = "") -> Shape:
    """The JSON types of ``value``: a list's elements merged, data-keyed objects as {"*": ...}."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        shapes = [shape(v, path + "[]") for v in value]
        return [_merge_all(shapes)] if shapes else []
    if path in DATA_KEYED:
        return {"*": _merge_all([shape(v, path + ".*") for v in value.values()])} if value else {}
    return {k: shape(v, f"{path}.{k}" if path else k) for k, v in sorted(value.items())}


def _merge_all(shapes: list[Shape]) -> Shape:
    out: Shape = None
    for s in shapes:
        out = merge(out, s)
    return out


def merge(a: Shape, b: Shape) -> Shape:
    """One shape for two answers of the same kind (stream chunks): keys of both, types of either."""
    if a is None or a == []:
        return b if b is not None else a
    if b is None or b == []:
        return a
    if isinstance(a, dict) and isinstance(b, dict):
        return {k: merge(a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys())}
    if isinstance(a, list) and isinstance(b, list):
        return [merge(a[0], b[0])]
    return a if a == b else f"{a}|{b}"


def differences(theirs: Shape, ours: Shape, path: str = "", extra_ok: frozenset[str] = frozenset()) -> list[str]:
    """Where ``ours`` differs from ``theirs``: a key they give a value that we lack or type
    differently, or a key of ours they do not have (unless its path is in ``extra_ok``). A key
    that is null in theirs may be absent from ours."""
    if theirs is None or theirs == [] or theirs == {}:
        return []
    if isinstance(theirs, dict):
        if not isinstance(ours, dict):
            return [f"{path or '.'}: an object in vLLM's, {ours!r} in ours"]
        out = []
        for key, value in theirs.items():
            child = f"{path}.{key}" if path else key
            if ours.get(key) is None and value is not None and value != [] and value != {}:
                out.append(f"{child}: missing (vLLM's: {json.dumps(value)[:80]})")
            else:
                out += differences(value, ours.get(key), child, extra_ok)
        out += [f"{path}.{k}: ours only" if path else f"{k}: ours only"
                for k in ours.keys() - theirs.keys() if (f"{path}.{k}" if path else k) not in extra_ok]
        return out
    if isinstance(theirs, list):
        if not isinstance(ours, list):
            return [f"{path}: a list in vLLM's, {ours!r} in ours"]
        return differences(theirs[0], ours[0], path + "[]", extra_ok) if ours else []
    return [] if theirs == ours else [f"{path}: {theirs} in vLLM's, {ours} in ours"]


def answer_shapes(base_url: str, model: str, timeout_s: float = 120) -> dict[str, Shape]:
    """The shape of the answer to each of REQUESTS (a stream: its chunks' shapes merged)."""
    out: dict[str, Shape] = {}
    with httpx.Client(base_url=base_url, timeout=timeout_s) as http:
        for name, (path, body) in REQUESTS.items():
            if not body:
                r = http.get(path)
                assert r.status_code == 200, (name, r.status_code, r.text)
                out[name] = shape(r.json())
            elif body.get("stream"):
                with http.stream("POST", path, json={"model": model, **body}) as r:
                    assert r.status_code == 200, (name, r.status_code, r.read())
                    chunks = [json.loads(line[6:]) for line in r.iter_lines()
                              if line.startswith("data: ") and line != "data: [DONE]"]
                out[name] = _merge_all([shape(c) for c in chunks])
            else:
                r = http.post(path, json={"model": model, **body})
                assert r.status_code == 200, (name, r.status_code, r.text)
                out[name] = shape(r.json())
    return out
