"""``meshserve plot``: saved ``meshserve bench`` results side by side in one PNG (loadgen.plot)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from meshserve.commands.compare import LABELS_HELP
from meshserve.loadgen.compare import load_runs
from meshserve.loadgen.plot import plot_runs
from meshserve.loadgen.results import TIMINGS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", type=Path, metavar="RESULT.json",
                        help="results of `meshserve bench --save-result` run with --plot or --save-detailed")
    parser.add_argument("-o", "--output", type=Path, required=True, metavar="FILE.png", help="the PNG")
    parser.add_argument("--labels", default=None, help=LABELS_HELP)


def main(args: argparse.Namespace) -> int:
    try:
        runs = load_runs(args.results, args.labels)
        missing = [str(path) for path, (_, result) in zip(args.results, runs) if TIMINGS not in result]
        if missing:
            raise ValueError(f"no per-request timings in {', '.join(missing)} "
                             "(save the run with `meshserve bench --plot` or --save-detailed)")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plot_runs(runs, args.output)
    print(f"Plot saved to {args.output}", file=sys.stderr)
    return 0
