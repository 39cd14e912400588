"""Deltas the worker groups before sending (stream_interval): text, tokens, logprobs and the
pieces of tool calls joined in order, the later Delta's status and counts kept."""

from __future__ import annotations

import pytest

from meshserve.worker.engine import Chunker, Delta, ToolCallDelta


def test_then_joins_everything_and_keeps_the_later_status() -> None:
    first = Delta("Hel", [1], completion_tokens=1, tool_calls=[ToolCallDelta(0, "c1", "f", '{"a"')])
    later = Delta("lo", [2], finish_reason="tool_calls", completion_tokens=2,
                  tool_calls=[ToolCallDelta(0, arguments=": 1}"), ToolCallDelta(1, "c2", "g", "{}")])
    joined = first.then(later)
    assert (joined.text, joined.token_ids, joined.finish_reason, joined.completion_tokens) == (
        "Hello", [1, 2], "tool_calls", 2)
    assert joined.tool_calls == [ToolCallDelta(0, "c1", "f", '{"a": 1}'), ToolCallDelta(1, "c2", "g", "{}")]
    assert joined.logprobs is None and Delta("a", [1]).then(Delta("b", [2])).tool_calls == []


def _deltas(spec: str) -> list[Delta]:
    """'1 1 2 1.' -> Deltas of that many tokens each; a final '.' finishes the last."""
    out, n = [], 0
    for part in spec.split():
        count = int(part.rstrip("."))
        out.append(Delta("x" * count, list(range(n, n + count)), finish_reason="stop" if part.endswith(".") else None))
        n += count
    return out


@pytest.mark.parametrize(("interval", "deltas", "sent"), [
    (1, "1 1 1.", [1, 1, 1]),            # every token as it comes
    (4, "1 1 1 1 1 1.", [1, 4, 1]),      # the first at once, then 4 at a time, then the end
    (4, "1 5 1.", [1, 5, 1]),            # an engine that grouped already is not held back
    (3, "0 1 1 1 1", [0, 1, 3]),         # an empty delta first (a prompt-only step) does not count as a token sent
    (8, "1 2 2.", [1, 4]),               # the finish flushes what is held
])
def test_chunker_sends_the_first_token_at_once_then_interval_tokens_then_the_end(
        interval: int, deltas: str, sent: list[int]) -> None:
    chunker = Chunker(interval)
    chunks = [c for d in _deltas(deltas) if (c := chunker.add(d)) is not None]
    assert [len(c.token_ids) for c in chunks] == sent
    assert chunker.rest() is None or not deltas.endswith(".")


def test_chunker_gives_what_it_holds_when_the_engine_stops_without_a_reason() -> None:
    chunker = Chunker(4)
    assert chunker.add(Delta("a", [1])) is not None and chunker.add(Delta("b", [2])) is None
    rest = chunker.rest()
    assert rest is not None and rest.token_ids == [2] and chunker.rest() is None
