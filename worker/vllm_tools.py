"""tool_choice "auto" on the vllm engine: one of vLLM's tool-call parsers (the names `vllm serve
--tool-call-parser` takes) reads a request's output as it streams, as vLLM's own server does,
and splits it into content and the function calls the model makes."""

from __future__ import annotations

from typing import Any

from services.validation import InvalidRequest
from worker.engine import ToolCallDelta


def parser_names() -> list[str]:
    from vllm.tool_parsers import ToolParserManager

    return sorted({*ToolParserManager.tool_parsers, *ToolParserManager.lazy_parsers})


def check_parser(name: str) -> None:
    """Refuses a parser name vLLM does not have (at start, naming the ones it has)."""
    if name not in parser_names():
        raise ValueError(f"--tool-call-parser {name!r} is not one of vLLM's tool parsers: {', '.join(parser_names())}")


class ToolCallStream:
    """One request's output through a tool parser: ``feed`` each delta, get the content to stream
    and the pieces of calls found; ``finish`` flushes what the parser held back."""

    def __init__(self, parser_name: str, tokenizer: Any, tools: list[dict[str, Any]]) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
        from vllm.tool_parsers import ToolParserManager

        try:
            # The parsers read the tools (and the tool choice) from the request they are given.
            self._request = ChatCompletionRequest(model="", messages=[], tools=tools, tool_choice="auto")
        except ValueError as e:
            raise InvalidRequest(f"'tools': {e}", param="tools") from None
        self._parser = ToolParserManager.get_tool_parser(parser_name)(tokenizer, self._request.tools)
        self._text = ""
        self._token_ids: list[int] = []
        self._content = ""  # what feed returned as content
        self.called = False  # the model made at least one call

    def feed(self, text: str, token_ids: list[int]) -> tuple[str, list[ToolCallDelta]]:
        previous_text, previous_ids = self._text, self._token_ids
        self._text = previous_text + text
        self._token_ids = [*previous_ids, *token_ids]
        message = self._parser.extract_tool_calls_streaming(
            previous_text, self._text, text, previous_ids, self._token_ids, token_ids, self._request)
        if message is None:
            return "", []
        calls = [ToolCallDelta(c.index, c.id or "", (c.function.name or "") if c.function else "",
                               (c.function.arguments or "") if c.function else "")
                 for c in message.tool_calls or ()]
        self.called = self.called or bool(calls)
        self._content += message.content or ""
        return message.content or "", calls

    def finish(self) -> tuple[str, list[ToolCallDelta]]:
        """What the parser held back: with no call made, the text it kept waiting to see whether
        a call began (all of it is content, as vLLM's non-streamed answer has it); else the
        arguments of the last call it parsed but had not streamed yet."""
        if not self.called:
            held = self._text[len(self._content):] if self._text.startswith(self._content) else ""
            return held, []
        rest = self._parser.get_remaining_unstreamed_args()
        return "", [ToolCallDelta(len(self._parser.prev_tool_call_arr) - 1, arguments=rest)] if rest else []
