"""``meshserve compare``: the headline figures of saved results and their ratios to the first run."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshserve.commands import cli
from meshserve.loadgen import compare
from meshserve.loadgen.results import RequestResult, save_result, summarize


def requests(n: int, ttft: float, gap: float, failed: int = 0) -> list[RequestResult]:
    """``n`` successful requests of 11 tokens (TTFT ``ttft``, 10 gaps of ``gap``), then ``failed``
    failures."""
    ok = [RequestResult(True, 10, 11, ttft, ttft + 10 * gap, [gap] * 10, start_time=i) for i in range(n)]
    return ok + [RequestResult(latency=0.01, error_code="UNAVAILABLE") for _ in range(failed)]


@pytest.fixture
def two_runs(tmp_path: Path) -> tuple[Path, Path]:
    """A first run of 10 requests in 10 s, and one where 8 of 10 succeeded with 2.5x the TTFT and
    half the gaps, in 10 s too. Saved by the bench's own code, summaries only."""
    first, second = tmp_path / "baseline-run.json", tmp_path / "mesh-through-envoy.json"
    save_result(summarize(requests(10, 0.1, 0.1), 10.0) | {"label": "direct-to-worker"}, first)
    save_result(summarize(requests(8, 0.25, 0.05, failed=2), 10.0), second)
    return first, second


def test_rows_have_each_runs_figure_and_its_ratio_to_the_first(two_runs: tuple[Path, Path]) -> None:
    runs = compare.load_runs(two_runs)
    assert [label for label, _ in runs] == ["direct-to-worker", "mesh-through-envoy"]  # --label, else stem

    rows = {row.name: row for row in compare.headline_rows([result for _, result in runs])}

    assert list(rows) == [name for name, _ in compare.HEADLINES]
    expected = {  # the second run's value and ratio
        "output tok/s": (8.8, 0.8),  # 88 tokens in 10 s against 110
        "requests/s": (0.8, 0.8),
        "median TTFT (ms)": (250, 2.5),
        "p99 TTFT (ms)": (250, 2.5),
        "median ITL (ms)": (50, 0.5),
        "median TPOT (ms)": (50, 0.5),
        "completed": (8, 0.8),
        "failed": (2, None),  # no ratio to 0
    }
    for name, (value, ratio) in expected.items():
        row = rows[name]
        assert row.values[1] == pytest.approx(value) and row.ratios[0] == (None if name == "failed" else 1.0)
        assert row.ratios[1] == (None if ratio is None else pytest.approx(ratio))
    assert rows["output tok/s"].values[0] == pytest.approx(11.0)


def test_a_figure_missing_from_a_run_has_no_value_and_no_ratio() -> None:
    rows = compare.headline_rows([{"output_throughput": 100.0}, {"output_throughput": 87.0, "failed": 3}])
    by_name = {row.name: row for row in rows}
    assert by_name["output tok/s"].ratios == [1.0, 0.87]
    assert by_name["p99 TTFT (ms)"].values == [None, None] and by_name["p99 TTFT (ms)"].ratios == [None, None]
    assert by_name["failed"].values == [None, 3] and by_name["failed"].ratios == [None, None]
    assert compare._cells(by_name["output tok/s"]) == ["100", "87.0 (×0.87)"]
    assert compare._cells(by_name["failed"]) == ["—", "3"]


@pytest.mark.parametrize("value, text", [
    (None, "—"), (0, "0"), (600, "600"), (6172.4, "6,172"), (820.0, "820"), (19.54, "19.5"), (2.374, "2.37"),
])  # fmt: skip
def test_values_are_written_as_the_docs_write_them(value: float | None, text: str) -> None:
    assert compare.format_value(value) == text


def test_compare_prints_the_table_within_80_columns(
    two_runs: tuple[Path, Path], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "80")  # rich's width, where a terminal would give its own
    assert cli.main(["compare", *map(str, two_runs)]) == 0

    out = capsys.readouterr().out
    assert "direct-to-worker" in out and "mesh-through-envoy" in out  # labels whole
    assert all(len(line) <= 80 for line in out.splitlines())
    words = [line.split() for line in out.splitlines() if len(line.split()) > 2]
    lines = {" ".join(w[:2]): w for w in words}  # "median TTFT" -> its words
    assert lines["output tok/s"][2:] == ["11.0", "8.80", "(×0.80)"]
    assert lines["median TTFT"][3:] == ["100", "250", "(×2.50)"]
    assert lines["median ITL"][3:] == ["100", "50.0", "(×0.50)"]


def test_compare_markdown_is_a_table_for_the_docs(
    two_runs: tuple[Path, Path], capsys: pytest.CaptureFixture
) -> None:
    assert cli.main(["compare", *map(str, two_runs), "--markdown", "--labels", "direct,mesh"]) == 0

    assert capsys.readouterr().out.splitlines() == [
        "| figure | direct | mesh |",
        "|---|---|---|",
        "| output tok/s | 11.0 | 8.80 (×0.80) |",
        "| requests/s | 1.00 | 0.80 (×0.80) |",
        "| median TTFT (ms) | 100 | 250 (×2.50) |",
        "| p99 TTFT (ms) | 100 | 250 (×2.50) |",
        "| median ITL (ms) | 100 | 50.0 (×0.50) |",
        "| median TPOT (ms) | 100 | 50.0 (×0.50) |",
        "| completed | 10 | 8 (×0.80) |",
        "| failed | 0 | 2 |",
    ]


def test_compare_rejects_unreadable_results_and_wrong_labels(two_runs: tuple[Path, Path], tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["compare", *map(str, two_runs), "--labels", "only-one"]) == 2
    assert "--labels names 1 runs, but there are 2" in capsys.readouterr().err
    assert cli.main(["compare", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
