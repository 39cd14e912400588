"""``meshserve generate``: stream one completion from the mesh with the gRPC stub and print it."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time

import grpc

from meshserve.services import validation
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from meshserve.services.telemetry import TRACE_ID_METADATA


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the prompt text")
    parser.add_argument("--max-tokens", type=int, default=None,
                        help=f"tokens to generate (server default: {validation.DEFAULT_MAX_TOKENS})")
    parser.add_argument("--temperature", type=float, default=None,
                        help=f"0 is greedy (server default: {validation.DEFAULT_TEMPERATURE})")
    parser.add_argument("--top-p", type=float, default=None,
                        help=f"nucleus sampling (server default: {validation.DEFAULT_TOP_P})")
    parser.add_argument("--seed", type=int, default=None, help="sampling seed (reproducible output)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    parser.add_argument("--skip-cache", action="store_true", help="bypass the mesh's response cache")
    parser.add_argument("--target", default="127.0.0.1:8080", help="HOST:PORT of Envoy or the gateway")
    parser.add_argument("--no-stream", action="store_true", help="one unary Complete call, no stream")
    parser.add_argument("--timeout", type=float, default=300.0, help="deadline of the call, seconds")


def build_request(args: argparse.Namespace) -> pb.GenerateRequest:
    req = pb.GenerateRequest(
        prompt=args.prompt, stop=args.stop, ignore_eos=args.ignore_eos, skip_cache=args.skip_cache
    )
    if args.max_tokens is not None:
        req.max_tokens = args.max_tokens
    if args.temperature is not None:
        req.temperature = args.temperature
    if args.top_p is not None:
        req.top_p = args.top_p
    if args.seed is not None:
        req.seed = args.seed
    return req


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


async def run(args: argparse.Namespace) -> int:
    """Prints the completion to stdout as it arrives and a one-line summary to stderr."""
    req = build_request(args)
    printed = False
    async with insecure_channel(args.target) as channel:
        stub = pb_grpc.InferenceStub(channel)
        start = time.perf_counter()
        ttft: float | None = None
        try:
            if args.no_stream:
                last: pb.GenerateResponse | pb.CompleteResponse
                unary = stub.Complete(req, timeout=args.timeout)  # no TTFT without a stream
                last = await unary
                trace_id = await _trace_id(unary)
                sys.stdout.write(last.text)
                printed = True
            else:
                last = pb.GenerateResponse()
                call = stub.Generate(req, timeout=args.timeout)
                trace_id = await _trace_id(call)
                async for chunk in call:
                    if chunk.text:
                        if ttft is None:
                            ttft = time.perf_counter() - start
                        sys.stdout.write(chunk.text)
                        sys.stdout.flush()
                        printed = True
                    # Identity fields may ride on any chunk; usage and finish_reason on the last.
                    last.MergeFrom(chunk)
        except grpc.aio.AioRpcError as e:
            if printed:
                print()
            trace = dict(e.trailing_metadata() or ()).get(TRACE_ID_METADATA)
            print(f"error: {e.code().name}: {e.details()}" + (f" [trace {trace}]" if trace else ""), file=sys.stderr)
            return 1
        total = time.perf_counter() - start
    print()
    ttft_text = f"{ttft * 1000:.1f} ms" if ttft is not None else "-"
    print(
        f"[{last.usage.completion_tokens} tokens ({last.usage.prompt_tokens} prompt), ttft {ttft_text}, "
        f"total {total * 1000:.1f} ms, finish {last.finish_reason or '-'}, "
        f"cached {'yes' if last.cached else 'no'}, worker {last.worker or '-'}, id {last.request_id or '-'}, "
        f"trace {trace_id or '-'}]",
        file=sys.stderr,
    )
    return 0


async def _trace_id(call: grpc.aio.Call) -> str:
    """The trace id the mesh answered with (``meshserve trace ID`` shows it), or ''."""
    return str(dict(await call.initial_metadata() or ()).get(TRACE_ID_METADATA, ""))
