"""Every benchmark the docs cite is a maintained entry point: each script in bench/ answers
--help (so a renamed import or a broken argument list fails here, not at a reader's first run),
and the pick benchmark runs a tiny measurement."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
PY_SCRIPTS = sorted(p.name for p in BENCH.glob("*.py") if "__main__" in p.read_text())
SH_SCRIPTS = sorted(p.name for p in BENCH.glob("*.sh") if p.name not in ("lib.sh", "usage.sh"))


@pytest.mark.parametrize("script", PY_SCRIPTS)
def test_each_python_benchmark_answers_help(script: str) -> None:
    done = subprocess.run([sys.executable, str(BENCH / script), "--help"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout


@pytest.mark.parametrize("script", SH_SCRIPTS)
def test_each_shell_benchmark_answers_help(script: str, tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(BENCH / script), "--help"], capture_output=True, text=True, timeout=30,
                          cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert f"bench/{script}" in done.stdout  # the header names the script and its arguments
    assert not any(tmp_path.iterdir())  # nothing was started or written


def test_the_pick_benchmark_measures_picks_in_process(tmp_path: Path) -> None:
    out = tmp_path / "picks.json"
    subprocess.run([sys.executable, str(BENCH / "router_scale.py"), "--in-process", "--workers", "8",
                    "--seconds", "0.3", "--out", str(out)], check=True, capture_output=True, timeout=120, cwd=ROOT)
    figures = json.loads(out.read_text())
    assert figures["workers"] == 8 and figures["picks"] > 0
    assert 0 < figures["p50_ms"] <= figures["p99_ms"]
