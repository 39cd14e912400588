"""``meshserve generate`` against an in-process fake Inference server."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from meshserve.commands import client
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.telemetry import TRACE_ID_METADATA

TRACE_ID = "6612d53fa1a457c5f176ea79b1c0ffee"


class FakeInference(pb_grpc.InferenceServicer):
    """Streams "Hello, world!" in three chunks; the prompt "bad" is rejected, "lost" fails mid-stream."""

    def __init__(self) -> None:
        self.requests: list[pb.GenerateRequest] = []

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        self.requests.append(request)
        await context.send_initial_metadata(((TRACE_ID_METADATA, TRACE_ID),))  # as the gateway does
        if request.prompt == "bad":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "'max_tokens' must be at least 1, got 0")
        for i, text in enumerate(["Hello", ", world", "!"]):
            if request.prompt == "lost" and i == 2:
                await context.abort(grpc.StatusCode.UNAVAILABLE, "worker lost mid-stream")
            yield pb.GenerateResponse(
                request_id="r-1", text=text, token_ids=[i], worker="worker-a", cached=True
            )
        yield pb.GenerateResponse(
            request_id="r-1", finish_reason="stop", usage=pb.Usage(prompt_tokens=4, completion_tokens=3),
            worker="worker-a", cached=True,
        )  # fmt: skip

    async def Complete(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> pb.CompleteResponse:
        self.requests.append(request)
        await context.send_initial_metadata(((TRACE_ID_METADATA, TRACE_ID),))
        return pb.CompleteResponse(
            request_id="r-2", text="Hello, world!", token_ids=[0, 1, 2], finish_reason="length",
            usage=pb.Usage(prompt_tokens=4, completion_tokens=3), worker="worker-b",
        )  # fmt: skip


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeInference, str]]:
    servicer = FakeInference()
    server = grpc.aio.server()
    pb_grpc.add_InferenceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield servicer, f"127.0.0.1:{port}"
    await server.stop(None)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    client.add_arguments(parser)
    return parser.parse_args(argv)


async def generate(argv: list[str]) -> int:
    # main() runs its own event loop; the fake server keeps running on this one.
    return await asyncio.to_thread(client.main, parse(argv))


async def test_streams_text_and_prints_summary(fake, capsys: pytest.CaptureFixture) -> None:
    servicer, target = fake
    argv = ["hi there", "--target", target, "--max-tokens", "3", "--temperature", "0", "--top-p", "0.5",
            "--seed", "7", "--stop", "\n", "--skip-cache"]  # fmt: skip
    assert await generate(argv) == 0
    out, err = capsys.readouterr()
    assert out == "Hello, world!\n"
    assert "3 tokens" in err and "ttft" in err and "cached yes" in err and "worker worker-a" in err
    assert "finish stop" in err and f"trace {TRACE_ID}" in err  # whole, to copy into `meshserve trace`
    (req,) = servicer.requests
    assert (req.prompt, req.max_tokens, req.temperature, req.top_p, req.seed) == ("hi there", 3, 0.0, 0.5, 7)
    assert list(req.stop) == ["\n"] and req.skip_cache and not req.ignore_eos


async def test_unset_flags_leave_server_defaults(fake) -> None:
    servicer, target = fake
    assert await generate(["hi", "--target", target]) == 0
    (req,) = servicer.requests
    for name in ("max_tokens", "temperature", "top_p", "seed"):
        assert not req.HasField(name)


async def test_no_stream_uses_complete(fake, capsys: pytest.CaptureFixture) -> None:
    servicer, target = fake
    assert await generate(["hi", "--target", target, "--no-stream"]) == 0
    out, err = capsys.readouterr()
    assert out == "Hello, world!\n"
    assert "worker worker-b" in err and "cached no" in err and "finish length" in err and "ttft -" in err
    assert f"trace {TRACE_ID}" in err


@pytest.mark.parametrize("prompt, expected_out, expected_err", [
    ("bad", "", "error: INVALID_ARGUMENT: 'max_tokens' must be at least 1, got 0"),
    ("lost", "Hello, world\n", "error: UNAVAILABLE: worker lost mid-stream"),
])  # fmt: skip
async def test_grpc_errors_exit_1_with_code_and_message(
    fake, capsys: pytest.CaptureFixture, prompt: str, expected_out: str, expected_err: str
) -> None:
    _, target = fake
    assert await generate([prompt, "--target", target]) == 1
    out, err = capsys.readouterr()
    assert out == expected_out
    assert err.strip() == expected_err


def test_unreachable_target_exits_1(capsys: pytest.CaptureFixture) -> None:
    from tests.conftest import free_port

    assert client.main(parse(["hi", "--target", f"127.0.0.1:{free_port()}", "--timeout", "5"])) == 1
    assert "error: UNAVAILABLE" in capsys.readouterr().err
