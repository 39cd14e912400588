"""``meshserve compare``: the headline figures of saved ``meshserve bench`` results and their
ratios to the first run (loadgen.compare), as a terminal or a Markdown table."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from meshserve.loadgen.compare import load_runs, markdown, render

LABELS_HELP = "comma-separated names of the runs (default: each result's --label, else its file name)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULT.json",
                        help="results saved by `meshserve bench --save-result`; ratios are to the first")
    parser.add_argument("--labels", default=None, help=LABELS_HELP)
    parser.add_argument("--markdown", action="store_true", help="a Markdown table, for docs/benchmarks.md")


def main(args: argparse.Namespace) -> int:
    try:
        runs = load_runs(args.results, args.labels)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.markdown:
        print(markdown(runs))
        return 0
    from rich.console import Console

    Console().print(render(runs))
    return 0
