"""vLLM's output parsers on the vllm engine, as `vllm serve` runs them on a chat's output while it
streams. tool_choice "auto": one of vLLM's tool-call parsers (the names `vllm serve
--tool-call-parser` takes) splits the output into content and the function calls the model makes.
A reasoning parser (`--reasoning-parser`) first takes out the model's thinking; with both, the
calls are looked for in what follows the thinking (vLLM's own combined parser, ``ParsedStream``)."""

from __future__ import annotations

from typing import Any

from meshserve.services.validation import InvalidRequest
from meshserve.worker.engine import Request, ToolCallDelta


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


def reasoning_parser_names() -> list[str]:
    from vllm.reasoning import ReasoningParserManager

    return sorted(ReasoningParserManager.list_registered())


def reasoning_parsers(name: str, tool_parser: str, tokenizer: Any) -> dict[bool, Any]:
    """vLLM's combined parser classes for the reasoning parser ``name``: without tool calls
    (False) and with ``tool_parser``'s (True, when there is one). Refuses a name vLLM does not
    have, or a parser the model's tokenizer cannot serve (its think tokens missing), at start."""
    from vllm.parser.parser_manager import ParserManager

    if name not in reasoning_parser_names():
        raise ValueError(f"--reasoning-parser {name!r} is not one of vLLM's reasoning parsers: "
                         f"{', '.join(reasoning_parser_names())}")
    try:
        parsers = {False: ParserManager.get_parser(None, name, tokenizer=tokenizer)}
        if tool_parser:
            parsers[True] = ParserManager.get_parser(tool_parser, name, enable_auto_tools=True, tokenizer=tokenizer)
    except TypeError as e:  # vLLM's words name the flag and what the tokenizer lacks
        raise ValueError(str(e)) from None
    return parsers


class ParsedStream:
    """One chat request's output through vLLM's combined parser (``reasoning_parsers``), as vLLM's
    server runs it: ``feed`` each delta, get the thinking, the content and the pieces of calls
    found in it. Built before the request is sent: ``skip_special_tokens`` and
    ``reasoning_ended`` say what its sampling and its structured output need."""

    def __init__(self, parser_cls: Any, tokenizer: Any, request: Request, prompt_ids: list[int]) -> None:
        from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

        kwargs = request.chat_template_kwargs or {}
        try:
            self._request = ChatCompletionRequest(
                model="", messages=[], tools=request.tools, tool_choice="auto" if request.parse_tool_calls else "none",
                chat_template_kwargs=kwargs or None, include_reasoning=request.include_reasoning,
                skip_special_tokens=request.skip_special_tokens)
        except ValueError as e:
            raise InvalidRequest(f"'tools': {e}", param="tools") from None
        self._parser = parser_cls(tokenizer, self._request.tools, chat_template_kwargs=kwargs)
        self._parser.adjust_request(self._request)  # some parsers need the special tokens in the text
        self.skip_special_tokens: bool = self._request.skip_special_tokens
        self._prompt_ids = prompt_ids
        # For the engine's structured output: True constrains from the first token (the prompt
        # ended the thinking, or the thinking is not wanted); False waits for the parser's end.
        self.reasoning_ended: bool | None = self._request.resolve_reasoning_ended(self._parser, prompt_ids)
        self.chat_template_kwargs = kwargs
        self._token_ids: list[int] = []
        self.called = False  # the model made at least one call

    def feed(self, text: str, token_ids: list[int], finished: bool) -> tuple[str, str, list[ToolCallDelta]]:
        """(thinking, content, pieces of calls) of this delta."""
        self._token_ids += token_ids
        message = self._parser.parse_delta(text, token_ids, self._request, self._prompt_ids, finished=finished)
        if message is None:
            return "", "", []
        calls = [ToolCallDelta(c.index, c.id or "", (c.function.name or "") if c.function else "",
                               (c.function.arguments or "") if c.function else "")
                 for c in message.tool_calls or ()]
        self.called = self.called or bool(calls)
        reasoning = (message.reasoning or "") if self._request.include_reasoning else ""
        return reasoning, message.content or "", calls

    def reasoning_tokens(self) -> int:
        """How many of the generated tokens were thinking (vLLM's count, for usage)."""
        return int(self._parser.count_reasoning_tokens(self._token_ids))
