"""The headline figures of saved load-generator results and their ratios to the first run, as a
terminal table or as docs/benchmarks.md writes them (``×0.87``)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# (row name, result key) of the figures compared, in vLLM's key names.
HEADLINES = (
    ("output tok/s", "output_throughput"),
    ("requests/s", "request_throughput"),
    ("median TTFT (ms)", "median_ttft_ms"),
    ("p99 TTFT (ms)", "p99_ttft_ms"),
    ("median ITL (ms)", "median_itl_ms"),
    ("median TPOT (ms)", "median_tpot_ms"),
    ("completed", "completed"),
    ("failed", "failed"),
)


@dataclass
class Row:
    """One headline figure: each run's value and its ratio to the first run's (None where a run
    lacks the figure, or the first run's is 0)."""

    name: str
    values: list[float | None]
    ratios: list[float | None]


def run_label(result: dict[str, Any], path: Path) -> str:
    """A run's name: its ``label`` (``meshserve bench --label``), else the file's stem."""
    return str(result.get("label") or path.stem)


def load_runs(paths: Sequence[Path], labels: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """(label, result) of each saved result; ``labels`` (comma-separated) names them in order.
    Raises ValueError for an unreadable file or a wrong number of labels."""
    names = [name.strip() for name in labels.split(",")] if labels else []
    if names and len(names) != len(paths):
        raise ValueError(f"--labels names {len(names)} runs, but there are {len(paths)} results")
    runs = []
    for i, path in enumerate(paths):
        try:
            result = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"cannot read {path}: {e}") from e
        runs.append((names[i] if names else run_label(result, path), result))
    return runs


def headline_rows(results: Sequence[dict[str, Any]]) -> list[Row]:
    """The rows of the comparison: every headline figure of each result, and its ratio to the first's."""
    rows = []
    for name, key in HEADLINES:
        values = [r[key] if isinstance(r.get(key), int | float) else None for r in results]
        first = values[0]
        ratios = [v / first if v is not None and first else None for v in values]
        rows.append(Row(name, values, ratios))
    return rows


def format_value(value: float | None) -> str:
    """As docs/benchmarks.md writes figures: 6,172 / 820 / 19.5 / 2.37."""
    if value is None:
        return "—"
    if isinstance(value, int) or abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2f}"


def _cells(row: Row) -> list[str]:
    """The first run's value alone, the others' with their ratio to it."""
    cells = [format_value(row.values[0])]
    for value, ratio in zip(row.values[1:], row.ratios[1:]):
        cells.append(format_value(value) + (f" (×{ratio:.2f})" if ratio is not None else ""))
    return cells


def markdown(runs: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """A Markdown table ready to paste into docs/benchmarks.md."""
    lines = ["| figure | " + " | ".join(label for label, _ in runs) + " |", "|---" * (len(runs) + 1) + "|"]
    for row in headline_rows([result for _, result in runs]):
        lines.append(f"| {row.name} | " + " | ".join(_cells(row)) + " |")
    return "\n".join(lines)


def render(runs: Sequence[tuple[str, dict[str, Any]]]):  # noqa: ANN201 - rich.table.Table (imported lazily)
    """The terminal table: one column per run; labels fold onto more lines rather than being cut."""
    from rich import box
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    table.add_column("figure", no_wrap=True)
    for label, _ in runs:
        table.add_column(label, justify="right", overflow="fold")
    for row in headline_rows([result for _, result in runs]):
        table.add_row(row.name, *_cells(row))
    return table

