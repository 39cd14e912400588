"""tool_choice "auto": vLLM's own tool parser (pythonic here) over an output streamed token by
token, with the tiny model's tokenizer: calls become tool_calls pieces, other text stays content,
and what the parser held back waiting for a call comes out at the end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from meshserve.worker.engine import merge_tool_calls
from meshserve.worker.vllm_tools import ToolCallStream, check_parser

TOOLS = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]


def stream(tiny_model: Path, text: str) -> tuple[str, list, bool]:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    parsed = ToolCallStream("pythonic", tokenizer, TOOLS)
    content, calls = "", []
    for token_id in tokenizer.encode(text):
        piece, found = parsed.feed(tokenizer.decode([token_id]), [token_id])
        content, calls = content + piece, [*calls, *found]
    held, rest = parsed.finish()
    return content + held, merge_tool_calls([*calls, *rest]), parsed.called


@pytest.mark.parametrize(("text", "content", "call"), [
    ('[lookup(order=12, urgent=True)]', "", {"order": 12, "urgent": True}),
    ("Order 12 is on its way", "Order 12 is on its way", None),
    ("[not a call", "[not a call", None),  # held back while it could have been one: content in the end
])
def test_the_parser_splits_calls_from_content(tiny_model: Path, text: str, content: str, call: dict | None) -> None:
    got_content, calls, called = stream(tiny_model, text)
    assert got_content == content and called == (call is not None)
    if call is None:
        assert calls == []
    else:
        (whole,) = calls
        assert whole.index == 0 and whole.id and whole.name == "lookup" and json.loads(whole.arguments) == call


def test_an_unknown_parser_is_refused_naming_vllms() -> None:
    with pytest.raises(ValueError, match="not one of vLLM's tool parsers: .*pythonic"):
        check_parser("no-such-parser")
