"""``meshserve trace ID``: one trace from the local receiver, printed as a waterfall."""

from __future__ import annotations

import argparse
import asyncio

import grpc

from meshserve.trace_service import server as traces


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("trace_id", help="32 hex digits: the x-trace-id response header, or trace= in the logs")
    parser.add_argument("--receiver", default=traces.DEFAULT_ADDRESS, help="the trace receiver (meshserve serve traces)")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    try:
        spans = asyncio.run(traces.fetch_trace(args.receiver, args.trace_id.strip().lower()))
    except grpc.RpcError as e:
        print(f"trace receiver at {args.receiver}: {e.code().name} {e.details()}")
        return 1
    console = Console()
    console.print(traces.render_waterfall(spans, console.width))
    return 0
