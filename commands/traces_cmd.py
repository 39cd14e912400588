"""``meshserve traces --slowest N``: the slowest recent traces in the local trace receiver."""

from __future__ import annotations

import argparse
import asyncio

import grpc

from meshserve.trace_service import server as traces


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slowest", type=int, default=10, help="how many of the slowest recent traces to list")
    parser.add_argument("--receiver", default=traces.DEFAULT_ADDRESS, help="the trace receiver (meshserve serve traces)")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    try:
        found = asyncio.run(traces.fetch_slowest(args.receiver, args.slowest))
    except grpc.RpcError as e:
        print(f"trace receiver at {args.receiver}: {e.code().name} {e.details()}")
        return 1
    if not found:
        print(f"no traces yet at {args.receiver}")
        return 0
    console = Console()
    console.print(traces.render_slowest(found, console.width))
    return 0
