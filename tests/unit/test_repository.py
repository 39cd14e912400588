"""The repository stays readable: no tracked file that .gitignore keeps out, the benchmark
results only as the summaries the docs cite, words about the product (not about how it was
made), and the benchmark document opening with its headline table."""

from __future__ import annotations

import itertools
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS_BOUND = 2 * 2**20
TEXT = ["README.md", "docs", "bench", "gateway", "router", "worker", "cache_service", "trace_service", "services",
        "commands", "deploy", "tests", "protos"]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
DEVELOPMENT_WORDS = re.compile(r"\b(session|issue)s? [0-9]", re.IGNORECASE)


def git(*args: str) -> list[str]:
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    return subprocess.run(["git", *args], capture_output=True, text=True, check=True, cwd=ROOT).stdout.splitlines()


def tracked(*paths: str) -> list[Path]:
    return [ROOT / p for p in git("ls-files", "--", *paths)]


def test_no_tracked_file_is_one_gitignore_keeps_out() -> None:
    assert git("ls-files", "--cached", "--ignored", "--exclude-standard") == []


def test_benchmark_results_stay_small() -> None:
    size = sum(p.stat().st_size for p in tracked("bench/results") if p.is_file())
    assert size <= RESULTS_BOUND, f"bench/results holds {size / 2**20:.1f} MiB: keep the summaries the docs cite"


def test_the_project_speaks_of_the_product_not_of_how_it_was_made() -> None:
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for p in tracked(*TEXT) if p.is_file() and p.suffix not in (".json", ".jsonl", ".pb")
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1)
             if DEVELOPMENT_WORDS.search(line)]
    assert not found, "\n".join(found[:20])


def test_the_check_finds_words_about_the_making() -> None:
    number = "38"  # apart from the words, or this line would be one the check finds
    assert DEVELOPMENT_WORDS.search(f"measured in Session {number}") and DEVELOPMENT_WORDS.search(f"(issue {number})")
    assert not DEVELOPMENT_WORDS.search("the session key of session-affinity routing")


def test_the_benchmark_document_opens_with_its_headline_table() -> None:
    lines = (ROOT / "docs" / "benchmarks.md").read_text().splitlines()
    first_table = next(i for i, line in enumerate(lines) if line.startswith("|"))
    assert first_table < 40, "the headline table is not at the top"
    header, _, *rows = itertools.takewhile(lambda line: line.startswith("|"), lines[first_table:])
    columns = [c.strip().lower() for c in header.strip("|").split("|")]
    assert {"command", "commit", "date", "machine"} <= set(columns), columns
    assert rows
    for row in rows:
        cell = row.strip("|").split("|")[columns.index("command")]
        assert "bench/" in cell or "meshserve bench" in cell, f"a headline figure without its command: {row}"
    assert "docs/benchmarks.md" in (ROOT / "README.md").read_text()


def test_every_benchmark_the_docs_name_exists() -> None:
    named = {m for doc in DOCS for m in re.findall(r"\bbench/[\w./-]+\.(?:py|sh)\b", doc.read_text())}
    assert named, "the docs name no benchmark"
    missing = sorted(n for n in named if not (ROOT / n).is_file())
    assert not missing, f"the docs name benchmarks that are not in bench/: {missing}"
    assert not [n for n in named if n.startswith("bench/results/")], "a figure cites a script kept with results"
