"""``meshserve traces``: the table keeps every trace id whole at any terminal width."""

from __future__ import annotations

import pytest
from rich.console import Console

from services.traces import Span, render_slowest


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
