"""``meshserve plot`` and ``bench --plot``: the saved timings, the PNG of two saved runs, and the
plot of a whole bench run against the fake worker."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from meshserve.commands import bench, cli
from meshserve.loadgen import plot
from meshserve.loadgen.compare import load_runs
from meshserve.loadgen.results import MAX_SAVED_ITLS, PER_REQUEST_FIELDS, RequestResult, save_result, summarize

# The bench's own fake worker and its fixture (used by name: pytest finds it in this module).
from tests.unit.test_bench import FakeWorker, bench_argv, parse, serve_fake  # noqa: F401

# matplotlib's first two default colours: the runs' lines.
BLUE, ORANGE = (31, 119, 180), (255, 127, 14)


def synthetic_run(n: int, ttft: float, gap: float, seed: int) -> list[RequestResult]:
    """``n`` requests of 16 tokens sent 50 ms apart from t=100 s, with jittered gaps; the last fails."""
    rng = np.random.default_rng(seed)
    results = []
    for i in range(n):
        itl = (gap * rng.uniform(0.5, 3.0, 15)).tolist()
        first = ttft * rng.uniform(0.5, 2.0)
        results.append(RequestResult(True, 32, 16, first, first + sum(itl), itl, 100.0 + 0.05 * i))
    results[-1] = RequestResult(latency=0.002, start_time=100.0 + 0.05 * (n - 1), error_code="UNAVAILABLE")
    return results


def test_timings_are_compact_per_request_lists_in_ms() -> None:
    results = [
        RequestResult(True, 8, 3, 0.12344, 0.5, [0.2, 0.17662], start_time=50.0),
        RequestResult(latency=0.00449, start_time=50.25, error_code="RESOURCE_EXHAUSTED"),
    ]
    t = summarize(results, 1.0)["timings"]
    assert t["start_ms"] == [0.0, 250.0]  # from the first send
    assert t["ttft_ms"] == [123.4, 0.0] and t["latency_ms"] == [500.0, 4.5]  # rounded to 0.1 ms
    assert t["output_tokens"] == [3, 0] and t["success"] == [True, False]
    assert t["itl_ms"] == [176.6, 200.0] and t["itl_count"] == 2  # sorted


def test_many_gaps_are_thinned_to_evenly_spaced_order_statistics() -> None:
    gaps = [i / 1000 for i in range(10_001)]  # 0 .. 10 s in 1 ms steps
    t = summarize([RequestResult(True, 8, 10_002, 0.1, 10.1, gaps[::-1])], 11.0)["timings"]
    assert len(t["itl_ms"]) == MAX_SAVED_ITLS and t["itl_count"] == 10_001
    assert t["itl_ms"][0] == 0.0 and t["itl_ms"][-1] == 10_000.0
    assert t["itl_ms"][MAX_SAVED_ITLS // 2] == pytest.approx(5_000, abs=5)  # the median stays


def test_saved_result_keeps_the_timings_only_when_asked_on_one_line_each(tmp_path: Path) -> None:
    result = summarize(synthetic_run(200, 0.1, 0.01, seed=0), 10.0)
    save_result(result, tmp_path / "summary.json")
    save_result(result, tmp_path / "timings.json", timings=True)
    save_result(result, tmp_path / "detailed.json", detailed=True)
    summary, timed, detailed = (json.loads((tmp_path / f"{n}.json").read_text())
                                for n in ("summary", "timings", "detailed"))
    assert not set(PER_REQUEST_FIELDS) & set(summary)
    assert set(PER_REQUEST_FIELDS) & set(timed) == {"timings"}
    assert set(PER_REQUEST_FIELDS) <= set(detailed)
    assert timed["timings"] == detailed["timings"] == json.loads(json.dumps(result["timings"]))
    assert detailed["itls"] == json.loads(json.dumps(result["itls"]))  # the full lists, unchanged
    # Each list of numbers on one line, the rest indented as before.
    text = (tmp_path / "timings.json").read_text()
    assert '\n    "start_ms": [0.0, 50.0, 100.0, ' in text and '\n  "completed": 199,\n' in text
    summary_lines = len((tmp_path / "summary.json").read_text().splitlines())
    assert len(text.splitlines()) == summary_lines + 2 + len(result["timings"])  # "timings": {, a line each, }


def test_throughput_spreads_tokens_from_the_first_to_the_last_and_in_flight_counts_every_request() -> None:
    # Tokens at 0.5, 1.0, 1.5 s and at 1.2, 1.9 s; the second request sent at 0.8 s.
    counts, edges = plot._throughput(np.array([0.0, 800.0]), np.array([500.0, 400.0]),
                                     np.array([1500.0, 1100.0]), np.array([3, 2]))
    assert edges.tolist() == [0.0, 1.0, 2.0] and counts.tolist() == [1, 4]
    times, in_flight = plot._in_flight(np.array([0.0, 800.0, 900.0]), np.array([1500.0, 1100.0, 3.0]))
    assert times.tolist() == [0.0, 0.0, 0.8, 0.9, 0.903, 1.5, 1.9]
    assert in_flight.tolist() == [0, 1, 2, 3, 2, 1, 0]


def assert_a_plot_of_runs(png: Path, colours: list[tuple[int, int, int]]) -> None:
    """The PNG decodes, is 1200 x 800, is not blank and has a line in each run's colour."""
    with Image.open(png) as image:
        image.load()  # decodes it, or raises
        assert image.format == "PNG" and image.size == (1200, 800)
        pixels = np.asarray(image.convert("RGB")).reshape(-1, 3)
    found = {tuple(c) for c in np.unique(pixels, axis=0)}
    assert len(found) > 100  # text, axes, anti-aliased lines
    assert (pixels != 255).any(axis=1).mean() > 0.02  # not all white
    for colour in colours:
        assert (pixels == colour).all(axis=1).sum() > 500, f"no line in {colour}"


def test_plot_draws_two_saved_runs_side_by_side(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fast, slow = tmp_path / "fast.json", tmp_path / "slow.json"
    labelled = summarize(synthetic_run(120, 0.05, 0.01, seed=1), 6.5) | {"label": "direct"}
    save_result(labelled, fast, timings=True)
    save_result(summarize(synthetic_run(120, 0.2, 0.03, seed=2), 7.5), slow, detailed=True)
    png = tmp_path / "out" / "both.png"  # in a folder made for it

    assert cli.main(["plot", str(fast), str(slow), "-o", str(png)]) == 0

    assert "Plot saved to" in capsys.readouterr().err
    assert_a_plot_of_runs(png, [BLUE, ORANGE])
    assert [label for label, _ in load_runs([fast, slow])] == ["direct", "slow"]  # --label, else stem


def test_plot_refuses_a_result_without_timings(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    summary_only = tmp_path / "old.json"
    save_result(summarize(synthetic_run(5, 0.1, 0.01, seed=0), 1.0), summary_only)
    assert cli.main(["plot", str(summary_only), "-o", str(tmp_path / "x.png")]) == 2
    assert "no per-request timings in" in capsys.readouterr().err and not (tmp_path / "x.png").exists()
    assert cli.main(["plot", str(summary_only), "-o", str(tmp_path / "x.png"), "--labels", "a,b"]) == 2


async def test_bench_plot_draws_the_run_and_saves_its_timings(
    serve_fake, tmp_path: Path  # noqa: F811 - the imported fixture
) -> None:
    fake = FakeWorker(expect_concurrency=5)
    out, png = tmp_path / "result.json", tmp_path / "run.png"
    argv = bench_argv(await serve_fake(fake), out, "--plot", str(png), "--label", "unit")

    assert await asyncio.to_thread(bench.main, parse(argv)) == 0

    assert_a_plot_of_runs(png, [BLUE])
    result = json.loads(out.read_text())
    assert set(PER_REQUEST_FIELDS) & set(result) == {"timings"}  # not the full lists
    t = result["timings"]
    assert len(t["start_ms"]) == 20 and all(t["success"]) and t["output_tokens"] == [8] * 20
    assert t["itl_count"] == 20 * 7 and min(t["start_ms"]) == 0.0


def test_bench_imports_matplotlib_only_to_plot() -> None:
    code = "import sys; from meshserve.commands import cli; cli.build_parser(); print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
