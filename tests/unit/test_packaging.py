"""One installed name: the distribution installs the package ``meshserve`` (its parts as
subpackages, with the data files they read) and nothing else at the top level of site-packages."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_distribution_installs_one_top_level_package(tmp_path: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(ROOT),
                    "-w", str(tmp_path)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("meshserve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"meshserve", wheel.name.split("-py3")[0] + ".dist-info"}
    for part in ("gateway/orchestrator.py", "services/gen/meshserve_pb2.py", "deploy/envoy/meshserve.pb",
                 "worker/data/corpus.txt", "commands/cli.py", "loadgen/runner.py"):
        assert f"meshserve/{part}" in names, part
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    assert "meshserve = meshserve.commands.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()
