"""The Worker gRPC service on port 0, in process, with the transformers engine on the tiny model
(cheap to start; the vLLM-backed worker is tested end to end by the integration tests)."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import pytest
from prometheus_client import REGISTRY

from meshserve.services import validation
from meshserve.services.config import WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import Running, insecure_channel
from meshserve.worker.server import WorkerServicer, start_worker
from meshserve.worker.weights import fingerprint

TIMEOUT = 30.0
LONG = 1500  # tokens: several seconds of one-at-a-time generate, far longer than any check


def worker_config(tiny_model: Path, **kw: object) -> WorkerConfig:
    return WorkerConfig(host="127.0.0.1", port=0, metrics_port=-1, engine="transformers",
                        model=str(tiny_model), max_queue=2, grace_seconds=5.0, **kw)


@pytest.fixture(scope="module")
async def worker(tiny_model: Path) -> AsyncIterator[tuple[Running, WorkerServicer]]:
    running, servicer = await start_worker(worker_config(tiny_model))
    yield running, servicer
    await running.shutdown()


async def wait_for_report(stub: pb_grpc.WorkerStub, ok: Callable[[pb.LoadReport], bool]) -> pb.LoadReport:
    """The first load report satisfying ``ok`` (fails after TIMEOUT)."""
    async def first() -> pb.LoadReport:
        async for report in stub.WatchLoad(pb.WatchLoadRequest()):
            if ok(report):
                return report
        raise AssertionError("WatchLoad ended")

    return await asyncio.wait_for(first(), TIMEOUT)


def requests_total(worker_id: str, reason: str) -> float:
    return REGISTRY.get_sample_value("meshserve_worker_requests_total",
                                     {"worker": worker_id, "finish_reason": reason}) or 0.0


async def test_generate_streams_greedy_tokens_with_usage_on_the_last_chunk(
    stub: pb_grpc.WorkerStub, worker: tuple[Running, WorkerServicer], tiny_model: Path
) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    request = pb.GenerateRequest(prompt="The capital of France is", max_tokens=12, temperature=0,
                                 ignore_eos=True, request_id="greedy-1")
    chunks = [c async for c in stub.Generate(request, timeout=TIMEOUT)]

    assert len(chunks) == 12  # one chunk per token
    assert all(c.request_id == "greedy-1" and c.worker == worker[1].worker_id for c in chunks)
    assert [c.finish_reason for c in chunks] == [""] * 11 + ["length"]
    token_ids = [t for c in chunks for t in c.token_ids]
    prompt_ids = tokenizer.encode(request.prompt)
    assert chunks[-1].usage == pb.Usage(prompt_tokens=len(prompt_ids), completion_tokens=12)
    # Text of an incomplete UTF-8 sequence at the very end is dropped, as vLLM does.
    expected_text = tokenizer.decode(token_ids, skip_special_tokens=True).rstrip("\ufffd")
    assert "".join(c.text for c in chunks) == expected_text

    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    expected = model.generate(torch.tensor([prompt_ids]), max_new_tokens=12, do_sample=False,
                              eos_token_id=None,
                              attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long))
    assert token_ids == expected[0, len(prompt_ids):].tolist()


async def test_stream_interval_groups_tokens_after_the_first(stub: pb_grpc.WorkerStub) -> None:
    def greedy(**kw: int) -> pb.GenerateRequest:
        return pb.GenerateRequest(prompt="Once upon a time", max_tokens=11, temperature=0, ignore_eos=True, **kw)

    one = [c async for c in stub.Generate(greedy(), timeout=TIMEOUT)]
    grouped = [c async for c in stub.Generate(greedy(stream_interval=4), timeout=TIMEOUT)]

    # The first token alone (time to first token unchanged), then 4 at a time, the rest at the end.
    assert [len(c.token_ids) for c in grouped] == [1, 4, 4, 2]
    assert [c.finish_reason for c in grouped] == ["", "", "", "length"]
    assert [t for c in grouped for t in c.token_ids] == [t for c in one for t in c.token_ids]
    assert "".join(c.text for c in grouped) == "".join(c.text for c in one)
    assert grouped[-1].usage == one[-1].usage


async def test_the_workers_stream_interval_is_a_floor(tiny_model: Path) -> None:
    running, _ = await start_worker(worker_config(tiny_model, stream_interval=3))
    try:
        async with insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.WorkerStub(channel)

            async def sizes(**kw: int) -> list[int]:
                request = pb.GenerateRequest(prompt="hi", max_tokens=7, temperature=0, ignore_eos=True, **kw)
                return [len(c.token_ids) async for c in stub.Generate(request, timeout=TIMEOUT)]

            assert await sizes() == [1, 3, 3]
            assert await sizes(stream_interval=1) == [1, 3, 3]  # a request may not go below it
            assert await sizes(stream_interval=5) == [1, 5, 1]
    finally:
        await running.shutdown()


async def test_chat_messages_are_rendered_with_the_chat_template(stub: pb_grpc.WorkerStub) -> None:
    request = pb.GenerateRequest(
        messages=[pb.ChatMessage(role="system", content="Be brief."),
                  pb.ChatMessage(role="user", content="Hi")],
        max_tokens=5, temperature=0, ignore_eos=True,
    )
    chunks = [c async for c in stub.Generate(request, timeout=TIMEOUT)]
    # <|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\n: far more tokens than "Hi" alone
    assert chunks[-1].usage.prompt_tokens > 8
    assert chunks[-1].usage.completion_tokens == 5


async def test_load_reports_count_every_request_received(stub: pb_grpc.WorkerStub) -> None:
    before = (await wait_for_report(stub, lambda r: True)).requests_received
    ok = pb.GenerateRequest(prompt="hi", max_tokens=2, temperature=0, ignore_eos=True)
    assert [c async for c in stub.Generate(ok, timeout=TIMEOUT)][-1].finish_reason == "length"
    with pytest.raises(grpc.aio.AioRpcError):  # refused requests arrived too
        async for _ in stub.Generate(pb.GenerateRequest(prompt=""), timeout=TIMEOUT):
            pass
    report = await wait_for_report(stub, lambda r: r.requests_received >= before + 2)
    assert report.requests_received == before + 2


async def test_info_describes_the_engine(
    stub: pb_grpc.WorkerStub, worker: tuple[Running, WorkerServicer]
) -> None:
    info = await stub.Info(pb.InfoRequest(), timeout=TIMEOUT)
    assert info.worker_id == f"127.0.0.1:{worker[0].port}"  # host:port by default
    assert (info.engine, info.model, info.max_num_seqs, info.tensor_parallel_size) == (
        "transformers", str(worker[1].cfg.model), 1, 1)
    assert info.max_model_len == 2048
    assert info.weights_id == fingerprint(str(worker[1].cfg.model))  # what the cache keys its answers by


async def test_watch_load_reports_periodically_with_increasing_sequence(
    stub: pb_grpc.WorkerStub, worker: tuple[Running, WorkerServicer]
) -> None:
    reports: list[pb.LoadReport] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    call = stub.WatchLoad(pb.WatchLoadRequest())
    async for report in call:
        reports.append(report)
        if len(reports) == 4:
            break
    call.cancel()
    # Idle: nothing changes, so these are the periodic reports (interval 0.1 s).
    assert loop.time() - start < 3.0
    assert all(r.worker_id == worker[1].worker_id and r.max_num_seqs == 1 for r in reports)
    assert all(not r.draining and r.num_in_flight == 0 for r in reports)
    assert [r.sequence for r in reports] == sorted({r.sequence for r in reports})


async def test_a_watcher_may_ask_for_fewer_reports_never_more(stub: pb_grpc.WorkerStub) -> None:
    """A router of many workers asks each for a report at most every min_interval_s: idle, the
    periodic reports then come that far apart (the worker's own: 0.1 s); asking for less than the
    worker's own minimum changes nothing."""
    loop = asyncio.get_running_loop()

    async def gaps(request: pb.WatchLoadRequest, n: int) -> list[float]:
        times: list[float] = []
        call = stub.WatchLoad(request)
        async for _ in call:
            times.append(loop.time())
            if len(times) == n:
                break
        call.cancel()
        return [b - a for a, b in zip(times, times[1:], strict=False)]

    assert min(await gaps(pb.WatchLoadRequest(min_interval_s=0.4), 4)) >= 0.39
    assert min(await gaps(pb.WatchLoadRequest(min_interval_s=-5.0), 4)) >= 0.04  # the worker's own 0.05
    assert statistics.median(await gaps(pb.WatchLoadRequest(), 6)) < 0.3


@pytest.mark.parametrize(("fields", "named"), [
    ({"prompt": ""}, "'prompt'"),
    ({"prompt": "hi", "temperature": -1.0}, "'temperature'"),
    ({"prompt": "hi", "top_p": 0.0}, "'top_p'"),
    ({"prompt": "hi", "max_tokens": 0}, "'max_tokens'"),
    ({"prompt": "hi", "stream_interval": 0}, "'stream_interval'"),
    ({"messages": [pb.ChatMessage(role="robot", content="x")]}, "'messages[0].role'"),
    ({"prompt": "word " * 1000, "max_tokens": 1500}, "'max_tokens'"),  # does not fit the context
    # vLLM's limits on its sampling fields
    ({"prompt": "hi", "temperature": 2.5}, "'temperature'"),
    ({"prompt": "hi", "presence_penalty": 2.5}, "'presence_penalty'"),
    ({"prompt": "hi", "frequency_penalty": -3}, "'frequency_penalty'"),
    ({"prompt": "hi", "repetition_penalty": 0}, "'repetition_penalty'"),
    ({"prompt": "hi", "top_k": -2}, "'top_k'"),
    ({"prompt": "hi", "min_p": 1.5}, "'min_p'"),
    ({"prompt": "hi", "max_tokens": 4, "min_tokens": 5}, "'min_tokens'"),
    ({"prompt": "hi", "stop_token_ids": [5, -1]}, "'stop_token_ids[1]'"),
    ({"prompt": "hi", "logit_bias": {5: 101.0}}, "'logit_bias'"),
    ({"prompt": "hi", "logprobs": 21}, "'logprobs'"),
    ({"prompt": "hi", "structured_outputs": pb.StructuredOutputs(json='{"type": 5}')}, "'structured_outputs.json'"),
    # The transformers baseline leaves constrained decoding to vLLM, and says so.
    ({"prompt": "hi", "structured_outputs": pb.StructuredOutputs(json_object=True)},
     "'structured_outputs' is not supported by the 'transformers' engine"),
    # tool_choice "auto" needs vLLM's tool parser, which this worker was not given
    ({"messages": [pb.ChatMessage(role="user", content="x")], "parse_tool_calls": True,
      "tools": '[{"type": "function", "function": {"name": "f"}}]'}, "'tool_choice' \"auto\" needs a tool-call parser"),
    ({"messages": [pb.ChatMessage(role="user", content="x")], "parse_tool_calls": True}, "'parse_tool_calls' needs"),
    # more variables for the chat template: a JSON object, for a chat, not the template call's own
    ({"messages": [pb.ChatMessage(role="user", content="x")], "chat_template_kwargs": "[1]"}, "'chat_template_kwargs' must"),
    ({"messages": [pb.ChatMessage(role="user", content="x")], "chat_template_kwargs": "{x"}, "'chat_template_kwargs' is not"),
    ({"prompt": "hi", "chat_template_kwargs": '{"a": 1}'}, "'chat_template_kwargs' needs"),
    ({"messages": [pb.ChatMessage(role="user", content="x")], "chat_template_kwargs": '{"tools": []}'},
     "'chat_template_kwargs' may not set 'tools'"),
])
async def test_bad_requests_are_invalid_argument_naming_the_field(
    stub: pb_grpc.WorkerStub, fields: dict, named: str
) -> None:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.Generate(pb.GenerateRequest(**fields), timeout=TIMEOUT):
            pass
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert named in err.value.details()
    # The field at fault travels as metadata, not only in the wording (OpenAI's `param`).
    assert validation.param_of(err.value.trailing_metadata()) == named.split("'")[1]


async def test_client_cancel_aborts_the_request_and_frees_the_engine(
    stub: pb_grpc.WorkerStub, worker: tuple[Running, WorkerServicer]
) -> None:
    worker_id = worker[1].worker_id
    aborts = requests_total(worker_id, "abort")
    # The model's own forward passes: num_running reads 0 once generate's thread is done, and
    # that is also true of a request the cancel failed to stop (LONG takes seconds, not 30).
    steps = 0

    def count_step(*_: object) -> None:
        nonlocal steps
        steps += 1

    hook = worker[1].engine._model.register_forward_hook(count_step)
    try:
        call = stub.Generate(pb.GenerateRequest(prompt="Tell me a story", max_tokens=LONG, ignore_eos=True))
        first = await asyncio.wait_for(call.read(), TIMEOUT)
        assert first.token_ids and not first.finish_reason
        call.cancel()

        await wait_for_report(stub, lambda r: r.num_in_flight == 0 and r.num_running == 0)
    finally:
        hook.remove()
    assert steps < LONG // 2  # the model stopped mid-stream
    assert requests_total(worker_id, "abort") == aborts + 1
    # The engine is free at once: a new request is served without waiting for LONG tokens.
    chunks = [c async for c in stub.Generate(pb.GenerateRequest(prompt="Hi", max_tokens=2, ignore_eos=True),
                                             timeout=TIMEOUT)]
    assert chunks[-1].finish_reason == "length"


async def test_past_max_queue_requests_are_resource_exhausted(
    stub: pb_grpc.WorkerStub, worker: tuple[Running, WorkerServicer]
) -> None:
    worker_id = worker[1].worker_id
    aborts = requests_total(worker_id, "abort")
    long = pb.GenerateRequest(prompt="Once upon a time", max_tokens=LONG, ignore_eos=True)
    calls = [stub.Generate(long) for _ in range(2)]  # max_queue=2: one running, one waiting
    report = await wait_for_report(stub, lambda r: r.num_in_flight == 2)
    assert (report.num_running, report.num_waiting) == (1, 1)

    with pytest.raises(grpc.aio.AioRpcError) as err:
        async for _ in stub.Generate(pb.GenerateRequest(prompt="one more", max_tokens=2), timeout=TIMEOUT):
            pass
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "max_queue" in err.value.details()

    for call in calls:
        call.cancel()
    await wait_for_report(stub, lambda r: r.num_in_flight == 0 and r.num_running == 0 and r.num_waiting == 0)
    assert requests_total(worker_id, "abort") == aborts + 2


async def test_metrics_are_exported_under_vllm_names(
    stub: pb_grpc.WorkerStub, worker: tuple[Running, WorkerServicer]
) -> None:
    labels = {"worker": worker[1].worker_id}
    ttft_before = REGISTRY.get_sample_value("vllm:time_to_first_token_seconds_count", labels) or 0.0
    request = pb.GenerateRequest(prompt="Hello", max_tokens=3, ignore_eos=True)
    async for _ in stub.Generate(request, timeout=TIMEOUT):
        pass
    assert REGISTRY.get_sample_value("vllm:time_to_first_token_seconds_count", labels) == ttft_before + 1
    assert REGISTRY.get_sample_value("vllm:e2e_request_latency_seconds_count", labels) >= 1
    assert REGISTRY.get_sample_value("vllm:inter_token_latency_seconds_count", labels) >= 2
    assert REGISTRY.get_sample_value("vllm:num_requests_running", labels) == 0
    assert REGISTRY.get_sample_value("vllm:num_requests_waiting", labels) == 0
    assert requests_total(worker[1].worker_id, "length") >= 1


async def test_shutdown_reports_draining_and_lets_streams_finish(tiny_model: Path) -> None:
    running, _ = await start_worker(worker_config(tiny_model, worker_id="draining-worker"))
    shutdown: asyncio.Task[None] | None = None
    try:
        async with insecure_channel(f"127.0.0.1:{running.port}") as channel:
            stub = pb_grpc.WorkerStub(channel)
            call = stub.Generate(pb.GenerateRequest(prompt="Hello", max_tokens=40, ignore_eos=True))
            await asyncio.wait_for(call.read(), TIMEOUT)  # in flight
            watch = stub.WatchLoad(pb.WatchLoadRequest())
            assert not (await asyncio.wait_for(watch.read(), TIMEOUT)).draining

            shutdown = asyncio.create_task(running.shutdown())
            reports = await asyncio.wait_for(_rest(watch), TIMEOUT)  # ends once drained
            rest = await asyncio.wait_for(_rest(call), TIMEOUT)
            await asyncio.wait_for(shutdown, TIMEOUT)
    finally:
        await (shutdown if shutdown is not None else running.shutdown())
    assert reports[-1].draining and reports[-1].num_in_flight == 0  # the stream ended once drained
    assert rest[-1].finish_reason == "length" and rest[-1].usage.completion_tokens == 40


async def _rest(call: grpc.aio.UnaryStreamCall) -> list:
    """The remaining messages of a stream already read with ``read()``."""
    messages = []
    while (message := await call.read()) is not grpc.aio.EOF:
        messages.append(message)
    return messages


def test_a_tool_parser_is_refused_at_start_by_engines_that_have_none(tiny_model: Path) -> None:
    from meshserve.worker.server import make_engine

    with pytest.raises(ValueError, match="--tool-call-parser is vLLM's"):
        make_engine(worker_config(tiny_model, tool_call_parser="pythonic"))
    with pytest.raises(ValueError, match="--reasoning-parser is vLLM's"):
        make_engine(worker_config(tiny_model, reasoning_parser="qwen3"))
