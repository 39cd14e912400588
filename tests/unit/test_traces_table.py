"""``meshserve traces``: the table keeps every trace id whole at any terminal width."""

from __future__ import annotations

import pytest
from rich.console import Console

from meshserve.trace_service.server import Span, render_slowest


def spans(trace_id: str, ms: int) -> list[Span]:
    root = Span("gateway", "meshserve.v1.Inference/Generate", trace_id, "a" * 16, "", 2, 0, ms * 10**6, {}, {},
                False)
    child = Span("worker-0", "generate", trace_id, "b" * 16, "a" * 16, 2, 10**6, ms * 10**6, {}, {}, False)
    return [root, child]


@pytest.mark.parametrize("width", [80, 100, 200])
def test_trace_ids_are_never_cut(width: int) -> None:
    ids = [f"{i:x}" * 32 for i in range(1, 4)]
    console = Console(width=width, record=True)
    console.print(render_slowest({t: spans(t, 100 + i) for i, t in enumerate(ids)}, width))
    text = console.export_text()
    assert all(t in text for t in ids), text
    assert max(len(line) for line in text.splitlines()) <= width
    assert ("services" in text) == (width >= 120)


@pytest.mark.parametrize("width", [80, 100, 200])
def test_a_waterfall_fits_the_terminal_with_names_and_times_whole(width: int) -> None:
    from meshserve.trace_service.server import render_waterfall

    trace_id = "6612d53fa1a457c5f176ea79b1c0ffee"
    spans = [Span("envoy", "ingress", trace_id, "e" * 16, "", 2, 0, 90 * 10**6, {}, {}, False),
             Span("gateway", "OpenAI/StreamChatCompletions", trace_id, "a" * 16, "e" * 16, 2, 10**6, 88 * 10**6,
                  {"meshserve.tokens": 32}, {"first_token": 8 * 10**6}, False),
             Span("worker-0", "Worker/Generate", trace_id, "b" * 16, "a" * 16, 2, 3 * 10**6, 87 * 10**6, {},
                  {"first_token": 7 * 10**6}, False)]
    console = Console(width=width, record=True)
    console.print(render_waterfall(spans, width))
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width
    for whole in (trace_id, "  OpenAI/StreamChatCompletions", "    Worker/Generate", "worker-0", "87.0", "84.0"):
        assert whole in text, (whole, text)
    assert ("tokens=32" in text) == (width >= 120)
