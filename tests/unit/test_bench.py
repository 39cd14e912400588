"""The load generator (loadgen): the pure summary and arrival maths, then the whole ``meshserve bench``
command against a fake worker."""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from meshserve.commands import bench
from meshserve.loadgen import runner
from meshserve.loadgen.mesh import policy_runs
from meshserve.loadgen.results import PER_REQUEST_FIELDS, RequestResult, format_summary, summarize
from meshserve.loadgen.runner import measure
from meshserve.loadgen.workloads import (
    DEFAULT_PAIRS,
    arrival_offsets,
    model_choices,
    prefix_repetition_requests,
    random_requests,
    repeats_requests,
)
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc


def ok(ttft: float, latency: float, output_tokens: int, prompt_len: int = 10, itl: list[float] | None = None,
       start: float = 0.0) -> RequestResult:
    return RequestResult(True, prompt_len, output_tokens, ttft, latency, itl or [], start)


# ---------------------------------------------------------------------------------------------
# summarize
# ---------------------------------------------------------------------------------------------


def test_summarize_computes_vllm_metrics() -> None:
    results = [
        ok(0.1, 1.1, 11, itl=[0.1] * 10, start=0.0),
        ok(0.2, 2.2, 21, itl=[0.1] * 20, start=0.5),
        ok(0.3, 0.3, 1, start=1.0),  # one token: no TPOT
        ok(0.4, 4.4, 5, itl=[1.0] * 4, start=1.5),
        RequestResult(error_code="UNAVAILABLE", error="worker lost mid-stream", prompt_len=7),
        RequestResult(error_code="RESOURCE_EXHAUSTED", error="queue full", prompt_len=7),
        RequestResult(error_code="UNAVAILABLE", error="no worker", prompt_len=7),
    ]
    r = summarize(results, duration=10.0, percentiles=(50, 99, 99.9))

    assert r["completed"] == 4 and r["failed"] == 3
    assert r["total_input_tokens"] == 40  # failed requests' prompts are not counted
    assert r["total_output_tokens"] == 38
    assert r["request_throughput"] == pytest.approx(0.4)
    assert r["output_throughput"] == pytest.approx(3.8)
    assert r["total_token_throughput"] == pytest.approx(7.8)
    # TTFT 100, 200, 300, 400 ms: numpy's linear interpolation gives p99 = 300 + 0.97 * 100.
    assert r["mean_ttft_ms"] == pytest.approx(250)
    assert r["median_ttft_ms"] == pytest.approx(250)
    assert r["p50_ttft_ms"] == pytest.approx(250)
    assert r["p99_ttft_ms"] == pytest.approx(397)
    assert r["p99.9_ttft_ms"] == pytest.approx(399.7)
    assert r["std_ttft_ms"] == pytest.approx(math.sqrt(0.0125) * 1000)
    # TPOT = (e2e - ttft) / (tokens - 1): 100 ms, 100 ms and 1000 ms; the one-token request has none.
    assert r["mean_tpot_ms"] == pytest.approx(400)
    assert r["median_tpot_ms"] == pytest.approx(100)
    # ITL pools every gap: 30 of 100 ms, 4 of 1000 ms.
    assert r["mean_itl_ms"] == pytest.approx((30 * 100 + 4 * 1000) / 34)
    assert r["median_itl_ms"] == pytest.approx(100)
    assert r["mean_e2el_ms"] == pytest.approx(2000)
    assert r["p99_e2el_ms"] == pytest.approx(2200 + 0.97 * 2200)
    assert r["errors"] == {"UNAVAILABLE": 2, "RESOURCE_EXHAUSTED": 1}
    assert r["error_samples"]["RESOURCE_EXHAUSTED"] == "queue full"
    assert r["output_lens"] == [11, 21, 1, 5, 0, 0, 0]
    assert r["input_lens"] == [10, 10, 10, 10, 7, 7, 7]
    assert r["ttfts"][:4] == [0.1, 0.2, 0.3, 0.4]
    assert r["itls"][2] == [] and len(r["itls"][1]) == 20
    # Requests overlap: [0, 1.1], [0.5, 2.7], [1.0, 1.3], [1.5, 5.9] -> 3 at once at t=1.0.
    assert r["max_concurrent_requests"] == 3


def failure(code: str, latency: float) -> RequestResult:
    return RequestResult(latency=latency, error_code=code, error=f"{code} after {latency}s")


def test_summarize_reports_time_to_error_overall_and_by_code() -> None:
    results = [
        ok(0.1, 1.0, 10),  # a success's latency is not a time to error
        failure("RESOURCE_EXHAUSTED", 0.001),
        failure("RESOURCE_EXHAUSTED", 0.002),
        failure("RESOURCE_EXHAUSTED", 0.003),
        failure("DEADLINE_EXCEEDED", 5.0),
    ]
    r = summarize(results, duration=10.0, percentiles=(50, 99))

    assert r["mean_error_ms"] == pytest.approx((1 + 2 + 3 + 5000) / 4)
    assert r["median_error_ms"] == pytest.approx(2.5)
    assert r["p50_error_ms"] == pytest.approx(2.5)
    assert r["p99_error_ms"] == pytest.approx(3 + 0.97 * 4997)  # numpy's linear interpolation
    assert r["std_error_ms"] > 0
    by_code = r["error_ms_by_code"]
    assert set(by_code) == {"RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}
    assert by_code["RESOURCE_EXHAUSTED"]["median"] == pytest.approx(2.0)
    assert by_code["RESOURCE_EXHAUSTED"]["p99"] == pytest.approx(2.98)
    assert by_code["RESOURCE_EXHAUSTED"]["mean"] == pytest.approx(2.0)
    assert by_code["DEADLINE_EXCEEDED"]["p50"] == pytest.approx(5000)
    # vLLM's keys are untouched by failures.
    assert r["mean_e2el_ms"] == pytest.approx(1000) and r["p99_ttft_ms"] == pytest.approx(100)
    assert r["errors"] == {"RESOURCE_EXHAUSTED": 3, "DEADLINE_EXCEEDED": 1}


def test_summarize_without_failures_has_zero_time_to_error() -> None:
    r = summarize([ok(0.1, 1.0, 10)], duration=1.0)
    assert r["mean_error_ms"] == r["median_error_ms"] == r["p99_error_ms"] == 0.0
    assert r["error_ms_by_code"] == {} and r["errors"] == {}


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def test_measure_times_a_failure_from_send_to_error(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(runner.time, "perf_counter", clock)

    async def refused() -> AsyncIterator[pb.GenerateResponse]:
        clock.now += 0.004
        raise grpc.aio.AioRpcError(
            grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(), grpc.aio.Metadata(),
            details="at capacity",
        )
        yield pb.GenerateResponse()  # pragma: no cover - makes this an async generator

    async def lost_mid_stream() -> AsyncIterator[pb.GenerateResponse]:
        clock.now += 0.010
        yield pb.GenerateResponse(text=" a", token_ids=[1])
        clock.now += 0.5
        raise ConnectionResetError("peer went away")

    r = await measure(refused, prompt_len=3)
    assert not r.success and r.error_code == "RESOURCE_EXHAUSTED" and r.error == "at capacity"
    assert r.latency == pytest.approx(0.004)
    r = await measure(lost_mid_stream, prompt_len=3)
    assert not r.success and r.error_code == "ConnectionResetError"
    assert r.latency == pytest.approx(0.510)


async def test_measure_digests_the_answer_and_times_the_pause_at_each_splice(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeClock()
    monkeypatch.setattr(runner.time, "perf_counter", clock)

    def stream(*chunks: tuple[float, list[int], str]):  # noqa: ANN202 - (seconds before, token ids, worker)
        async def open_stream() -> AsyncIterator[pb.GenerateResponse]:
            for i, (wait, ids, worker) in enumerate(chunks):
                clock.now += wait
                last = i == len(chunks) - 1
                yield pb.GenerateResponse(text="x" * len(ids), token_ids=ids, worker=worker,
                                          finish_reason="length" if last else "")
        return open_stream

    one = await measure(stream((0.01, [1], "w0"), (0.01, [2, 3], "w0"), (0.01, [4], "w0")), 3)
    moved = await measure(stream((0.01, [1, 2], "w0"), (0.25, [3], "w1"), (0.01, [4], "w1")), 3)
    other = await measure(stream((0.01, [1, 2, 3, 5], "w0")), 3)
    assert one.digest == moved.digest != other.digest  # the same tokens, however chunked
    assert one.splice_gaps == [] and moved.splice_gaps == [pytest.approx(0.25)]
    result = summarize([one, moved, other], 1.0)
    assert result["migrated"] == 1 and result["median_splice_gap_ms"] == pytest.approx(250)
    assert result["answer_digests"] == [one.digest, moved.digest, other.digest]


@pytest.mark.parametrize("honor", [False, True])
async def test_a_refused_request_is_sent_again_after_its_retry_after_only_when_asked(
    monkeypatch: pytest.MonkeyPatch, honor: bool
) -> None:
    events: list[str] = []

    async def backoff(seconds: float) -> None:
        events.append(f"sleep {seconds}")

    monkeypatch.setattr(runner, "backoff", backoff)
    refusals = {0: 2, 1: 0}  # request 0 is refused twice, then served; request 1 is served

    def stream(i: int) -> runner.OpenStream:
        async def answer() -> AsyncIterator[pb.GenerateResponse]:
            events.append(f"send {i}")
            if refusals[i]:
                refusals[i] -= 1
                raise grpc.aio.AioRpcError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(),
                    grpc.aio.Metadata(("retry-after", "2")), details="at capacity",
                )
            yield pb.GenerateResponse(text="x", token_ids=[1], finish_reason="length")
        return answer

    # One user (concurrency 1), two requests sent at once: the second waits for the first's slot.
    results, _ = await runner.run_requests([(stream(0), 1), (stream(1), 1)], [0.0, 0.0], 1,
                                           honor_retry_after=honor)
    if honor:
        assert events == ["send 0", "sleep 2.0", "send 0", "sleep 2.0", "send 0", "send 1"]
        assert [(r.success, r.retries) for r in results] == [(True, 2), (True, 0)]
        assert summarize(results, 1.0)["retries"] == 2
    else:
        assert events == ["send 0", "send 1"]
        assert [r.success for r in results] == [False, True] and results[0].retry_after == 2.0


async def test_a_request_refused_every_time_is_sent_again_a_bounded_number_of_times(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    sent: list[int] = []

    async def backoff(seconds: float) -> None:
        pass

    monkeypatch.setattr(runner, "backoff", backoff)
    monkeypatch.setattr(runner, "MAX_RETRIES", 3)

    async def refused() -> AsyncIterator[pb.GenerateResponse]:
        sent.append(1)
        raise grpc.aio.AioRpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.aio.Metadata(),
                                   grpc.aio.Metadata(("retry-after", "1")), details="at capacity")
        yield pb.GenerateResponse()  # pragma: no cover - makes this an async generator

    (result,), _ = await runner.run_requests([(refused, 1)], [0.0], 1, honor_retry_after=True)
    assert len(sent) == 4 and result.retries == 3 and result.error_code == "RESOURCE_EXHAUSTED"


def test_peak_output_throughput_counts_chunks_per_wall_clock_second() -> None:
    a = ok(0.25, 1.5, 6, itl=[0.25] * 5, start=0.0)  # chunks at 0.25 0.5 0.75 | 1.0 1.25 1.5
    b = ok(0.25, 1.25, 5, itl=[0.125] * 4, start=0.5)  # chunks at 0.75 0.875 | 1.0 1.125 1.25
    assert summarize([a, b], duration=2.0)["max_output_tokens_per_s"] == 6


def test_summarize_of_only_failures_has_zero_metrics_and_all_keys() -> None:
    r = summarize([RequestResult(error_code="DEADLINE_EXCEEDED")], duration=2.0)
    assert r["completed"] == 0 and r["failed"] == 1
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p99"):
            assert r[f"{stat}_{name}_ms"] == 0.0
    assert r["request_throughput"] == 0.0
    assert set(r["error_ms_by_code"]) == {"DEADLINE_EXCEEDED"} and "p99_error_ms" in r
    assert r["errors"] == {"DEADLINE_EXCEEDED": 1}


def test_format_summary_has_vllm_lines() -> None:
    results = [ok(0.1, 1.1, 11, itl=[0.1] * 10), failure("UNAVAILABLE", 0.0125)]
    text = format_summary(summarize(results, 2.0), ("ttft", "tpot", "itl", "e2el"), (99,))
    lines = [
        "============ Serving Benchmark Result ============", "Successful requests:",
        "Benchmark duration (s):", "Total input tokens:", "Total generated tokens:",
        "Request throughput (req/s):", "Output token throughput (tok/s):",
        "Mean TTFT (ms):", "Median TPOT (ms):", "P99 ITL (ms):",
        "Mean E2EL (ms):", "UNAVAILABLE:", "Mean time to error (ms):",
    ]  # fmt: skip
    for line in lines:
        assert line in text
    assert "P99 time to error (ms):                  12.50" in text
    assert "(time to error ms: median 12.50, p99 12.50)" in text
    without_failures = format_summary(summarize(results[:1], 2.0), ("ttft",), (99,))
    assert "time to error" not in without_failures


# ---------------------------------------------------------------------------------------------
# Workload
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("rate, burstiness", [(10.0, 1.0), (50.0, 0.5), (2.0, 4.0)])
def test_arrivals_have_mean_gap_of_one_over_rate(rate: float, burstiness: float) -> None:
    offsets = arrival_offsets(20_000, rate, random.Random(1), burstiness)
    gaps = [b - a for a, b in zip(offsets, offsets[1:])]
    assert offsets[0] == 0.0 and all(g >= 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(1 / rate, rel=0.03)
    # Gamma(k, θ) has coefficient of variation 1/sqrt(k): Poisson arrivals have std == mean.
    cv = statistics.pstdev(gaps) / statistics.fmean(gaps)
    assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_arrivals_are_seeded_and_infinite_rate_sends_at_once() -> None:
    assert arrival_offsets(50, 5.0, random.Random(3)) == arrival_offsets(50, 5.0, random.Random(3))
    assert arrival_offsets(50, 5.0, random.Random(3)) != arrival_offsets(50, 5.0, random.Random(4))
    assert arrival_offsets(5, math.inf, random.Random(0)) == [0.0] * 5


def test_random_requests_lengths_and_shared_prefix() -> None:
    reqs = random_requests(200, 100, 20, range_ratio=0.5, rng=random.Random(0), prefix_len=8)
    assert all(58 <= r.prompt_len <= 158 for r in reqs)  # 8 prefix words + 50..150
    assert all(10 <= r.output_len <= 30 for r in reqs)
    assert {r.prompt.split()[:8] == reqs[0].prompt.split()[:8] for r in reqs} == {True}
    assert all(len(r.prompt.split()) == r.prompt_len for r in reqs)
    assert len({r.prompt for r in reqs}) == 200
    fixed = random_requests(10, 32, 16, 0.0, random.Random(0))
    assert {r.prompt_len for r in fixed} == {32} and {r.output_len for r in fixed} == {16}
    burst = random_requests(9, 32, 16, 0.0, random.Random(0), distinct=2)
    assert len(burst) == 9 and len({r.prompt for r in burst}) == 2
    assert [r.prompt for r in burst[:2]] == [r.prompt for r in burst[2:4]]


def test_repeats_asks_a_share_again_after_the_first_time_some_in_other_words() -> None:
    reqs = repeats_requests(200, 0.2, 0.5, DEFAULT_PAIRS, 16, random.Random(0))
    prompts = [r.prompt for r in reqs]
    pairs = [json.loads(line) for line in DEFAULT_PAIRS.read_text().splitlines()]
    paraphrase_of = {p["b"]: p["a"] for p in pairs if p["label"] == "paraphrase"}
    exact_repeats = len(prompts) - len(set(prompts))
    paraphrased = [i for i, q in enumerate(prompts) if q in paraphrase_of]
    assert len(reqs) == 200 and exact_repeats == 20 and len(paraphrased) == 20
    for i in paraphrased:  # the question comes first, its paraphrase later
        assert paraphrase_of[prompts[i]] in prompts[:i]
    assert {r.output_len for r in reqs} == {16}
    assert prompts == [r.prompt for r in repeats_requests(200, 0.2, 0.5, DEFAULT_PAIRS, 16,
                                                                random.Random(0))]


def test_summarize_reports_how_requests_were_answered_and_their_ttft() -> None:
    results = [ok(0.2, 1.0, 4), ok(0.3, 1.0, 4), ok(0.002, 0.01, 4), failure("UNAVAILABLE", 0.01)]
    results[1].answer, results[2].answer = "coalesced", "exact"
    result = summarize(results, 1.0, percentiles=(50,))
    assert result["answers"] == {"generated": 1, "coalesced": 1, "exact": 1}
    assert result["ttft_ms_by_answer"]["exact"]["median"] == pytest.approx(2.0)
    assert result["ttft_ms_by_answer"]["coalesced"]["p50"] == pytest.approx(300.0)
    text = format_summary(result, ("ttft",), (50,))
    assert "Answered by (TTFT ms)" in text and "coalesced:" in text and "exact:" in text
    assert "Answered by" not in format_summary(summarize(results[:1], 1.0), ("ttft",), (99,))


# ---------------------------------------------------------------------------------------------
# The whole command against an in-process fake worker
# ---------------------------------------------------------------------------------------------


class FakeWorker(pb_grpc.WorkerServicer):
    """Streams ``max_tokens`` one-token chunks; fails the requests whose index ``fail`` maps to a code.

    Every timed stream waits until ``expect_concurrency`` are open at once (or times out), so a run
    that never reaches the concurrency it asked for fails instead of passing by luck.
    """

    def __init__(self, expect_concurrency: int, fail: dict[int, grpc.StatusCode] | None = None) -> None:
        self.fail = fail or {}
        self.expect = expect_concurrency
        self.in_flight = 0
        self.max_in_flight = 0
        self.reached = asyncio.Event()
        self.requests: list[pb.GenerateRequest] = []
        self.peers: set[str] = set()

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        self.requests.append(request)
        self.peers.add(context.peer())
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.in_flight >= self.expect:
            self.reached.set()
        try:
            warmup = "warmup" in request.request_id
            if not warmup:
                await asyncio.wait_for(self.reached.wait(), timeout=5)
            code = None if warmup else self.fail.get(int(request.request_id.rsplit("-", 1)[1]))
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
                await context.abort(code, "worker queue is full")
            n = request.max_tokens
            for i in range(n):
                if code is not None and i == n // 2:
                    await context.abort(code, "worker lost mid-stream")
                yield pb.GenerateResponse(request_id=request.request_id, text=f" t{i}", token_ids=[i])
            yield pb.GenerateResponse(
                request_id=request.request_id,
                finish_reason="length",
                usage=pb.Usage(prompt_tokens=len(request.prompt.split()), completion_tokens=n),
            )
        finally:
            self.in_flight -= 1


@pytest.fixture
async def serve_fake() -> AsyncIterator:
    servers: list[grpc.aio.Server] = []

    async def start(servicer: FakeWorker) -> str:
        server = grpc.aio.server()
        pb_grpc.add_WorkerServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    yield start
    for server in servers:
        await server.stop(None)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


def bench_argv(target: str, out: Path, *extra: str) -> list[str]:
    return [
        "--target", target, "--service", "worker", "--num-prompts", "20", "--max-concurrency", "5",
        "--random-input-len", "16", "--random-output-len", "8", "--disable-tqdm", "--timeout", "20",
        "--save-result", str(out), *extra,
    ]  # fmt: skip


async def test_bench_against_fake_worker(serve_fake, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    fake = FakeWorker(expect_concurrency=5)
    target = await serve_fake(fake)
    out = tmp_path / "result.json"
    argv = bench_argv(target, out, "--num-warmups", "2", "--num-channels", "2", "--save-detailed",
                      "--metadata", "engine=fake", "gpu=none", "--label", "unit")  # fmt: skip

    # main() runs its own event loop; the fake server keeps running on this one.
    rc = await asyncio.to_thread(bench.main, parse(argv))

    assert rc == 0
    result = json.loads(out.read_text())
    assert result["completed"] == 20 and result["failed"] == 0 and result["errors"] == {}
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p99"):
            assert result[f"{stat}_{name}_ms"] > 0
    timed = [r for r in fake.requests if "warmup" not in r.request_id]
    assert len(fake.requests) == 22 and len(timed) == 20
    timed.sort(key=lambda r: int(r.request_id.rsplit("-", 1)[1]))
    assert result["input_lens"] == [len(r.prompt.split()) for r in timed]
    assert result["output_lens"] == [8] * 20 and result["total_output_tokens"] == 160
    assert all(len(gaps) == 7 for gaps in result["itls"]) and all(t > 0 for t in result["ttfts"])
    assert result["request_throughput"] == pytest.approx(20 / result["duration"])
    assert fake.max_in_flight == 5 and result["max_concurrency"] == 5
    assert len(fake.peers) == 2  # two channels are two connections
    for r in fake.requests:
        assert r.skip_cache and r.ignore_eos and r.temperature == 0 and r.max_tokens == 8
        assert not r.HasField("stream_interval")  # the worker's default unless asked
    assert result["engine"] == "fake" and result["gpu"] == "none" and result["label"] == "unit"
    assert result["service"] == "worker" and result["target"] == target and result["num_prompts"] == 20
    assert "============ Serving Benchmark Result ============" in capsys.readouterr().out


async def test_bench_counts_failures_by_status_code(
    serve_fake, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    fail = {i: grpc.StatusCode.RESOURCE_EXHAUSTED for i in (0, 4, 8, 12, 16)}
    fail |= {i: grpc.StatusCode.UNAVAILABLE for i in (3, 10, 17)}  # after half the tokens
    fake = FakeWorker(expect_concurrency=5, fail=fail)
    out = tmp_path / "sub" / "failures.json"
    argv = bench_argv(await serve_fake(fake), out, "--allow-cache", "--metric-percentiles", "50,90", "--save-detailed",
                      "--stream-interval", "4")  # fmt: skip

    rc = await asyncio.to_thread(bench.main, parse(argv))

    assert rc == 0
    result = json.loads(out.read_text())
    assert result["completed"] == 12 and result["failed"] == 8
    assert result["errors"] == {"RESOURCE_EXHAUSTED": 5, "UNAVAILABLE": 3}
    assert result["error_samples"]["UNAVAILABLE"] == "worker lost mid-stream"
    assert [result["output_lens"][i] for i in sorted(fail)] == [0] * 8
    assert result["total_output_tokens"] == 12 * 8
    assert "p90_ttft_ms" in result and "p99_ttft_ms" not in result
    # Each failure is timed from send to error, overall and per status code.
    by_code = result["error_ms_by_code"]
    assert set(by_code) == {"RESOURCE_EXHAUSTED", "UNAVAILABLE"}
    assert set(by_code["UNAVAILABLE"]) == {"mean", "median", "std", "p50", "p90"}
    assert 0 < result["mean_error_ms"] <= result["p90_error_ms"] < 20_000
    assert by_code["RESOURCE_EXHAUSTED"]["mean"] > 0 and by_code["UNAVAILABLE"]["mean"] > 0
    assert not any(r.skip_cache for r in fake.requests)
    assert {r.stream_interval for r in fake.requests} == {4} and result["stream_interval"] == 4
    assert "RESOURCE_EXHAUSTED:" in capsys.readouterr().out


async def test_bench_with_every_request_failing_exits_1(serve_fake, tmp_path: Path) -> None:
    fake = FakeWorker(expect_concurrency=5, fail={i: grpc.StatusCode.RESOURCE_EXHAUSTED for i in range(20)})
    out = tmp_path / "all-failed.json"
    rc = await asyncio.to_thread(bench.main, parse(bench_argv(await serve_fake(fake), out)))
    assert rc == 1
    result = json.loads(out.read_text())
    assert result["failed"] == 20
    # Without --save-detailed the file holds the summary only, as vllm bench serve's does.
    assert not set(PER_REQUEST_FIELDS) & set(result) and "p99_error_ms" in result


def test_bench_unreachable_target_exits_1(capsys: pytest.CaptureFixture) -> None:
    from tests.conftest import free_port

    args = parse(["--target", f"127.0.0.1:{free_port()}", "--num-prompts", "1", "--disable-tqdm"])
    assert bench.main(args) == 1
    assert "cannot connect" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--random-range-ratio", "1.0"], "--random-range-ratio"),
    (["--metadata", "novalue"], "KEY=VALUE"),
    (["--percentile-metrics", "ttft,foo"], "unknown"),
])  # fmt: skip
def test_bench_rejects_bad_arguments(argv: list[str], message: str, capsys: pytest.CaptureFixture) -> None:
    assert bench.main(parse(argv)) == 2
    assert message in capsys.readouterr().err


def test_save_result_forms(tmp_path: Path) -> None:
    def path(*argv: str) -> Path:
        return bench._result_path(parse(list(argv)), "D")

    assert path("--save-result", "x.json") == Path("x.json")
    named = path("--save-result", "--result-filename", "y.json", "--result-dir", str(tmp_path))
    assert named == tmp_path / "y.json"
    generated = path("--save-result", "--max-concurrency", "4", "--request-rate", "2")
    assert generated == Path("meshserve-inference-2.0qps-concurrency4-D.json")


# ---------------------------------------------------------------------------------------------
# Datasets where routing matters
# ---------------------------------------------------------------------------------------------


def test_prefix_repetition_shares_prefixes_in_equal_or_hot_shares() -> None:
    reqs = prefix_repetition_requests(40, 4, 50, 10, 8, random.Random(0))
    assert sorted(Counter(" ".join(r.prompt.split()[:50]) for r in reqs).values()) == [10, 10, 10, 10]
    assert all(len(r.prompt.split()) == r.prompt_len == 60 and r.output_len == 8 for r in reqs)
    assert len({r.prompt for r in reqs}) == 40  # each request its own suffix
    hot = prefix_repetition_requests(40, 4, 50, 10, 8, random.Random(0), hot_share=0.5)
    counts = sorted(Counter(" ".join(r.prompt.split()[:50]) for r in hot).values())
    assert counts[-1] == 20 and sum(counts) == 40 and len(counts) == 4


class ChatFake(pb_grpc.WorkerServicer):
    """Answers every chat turn with text naming how many messages it got."""

    def __init__(self) -> None:
        self.requests: list[pb.GenerateRequest] = []

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        self.requests.append(request)
        answer = f"answer {request.request_id} after {len(request.messages)}"
        for word in answer.split():
            yield pb.GenerateResponse(request_id=request.request_id, text=" " + word, token_ids=[1])
        yield pb.GenerateResponse(finish_reason="length", usage=pb.Usage(prompt_tokens=7, completion_tokens=4))


async def test_multi_turn_users_join_one_after_another_over_the_ramp_up(
    serve_fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    waits: list[float] = []

    async def wait(seconds: float) -> None:  # the users' waits, recorded instead of slept
        waits.append(seconds)

    monkeypatch.setattr(runner, "backoff", wait)
    target = await serve_fake(ChatFake())
    argv = ["--target", target, "--service", "worker", "--dataset-name", "multi_turn", "--multi-turn-num-users", "4",
            "--multi-turn-num-turns", "2", "--multi-turn-ramp-up", "2", "--disable-tqdm",
            "--save-result", str(tmp_path / "result.json")]  # fmt: skip

    assert await asyncio.to_thread(bench.main, parse(argv)) == 0

    assert sorted(waits) == [0.5, 1.0, 1.5]  # users 1-3 join 0.5 s apart; user 0 at once
    assert json.loads((tmp_path / "result.json").read_text())["completed"] == 8


@pytest.mark.parametrize("flag", ["--multi-turn-ramp-up", "--multi-turn-think-time", "--multi-turn-system-prompt-len",
                                  "--multi-turn-user-history-len"])
def test_a_negative_multi_turn_duration_or_length_is_refused(flag: str) -> None:
    with pytest.raises(SystemExit):
        parse([flag, "-1"])


async def test_multi_turn_users_bring_their_own_history_to_every_turn(serve_fake, tmp_path: Path) -> None:
    fake = ChatFake()
    target = await serve_fake(fake)
    argv = ["--target", target, "--service", "worker", "--dataset-name", "multi_turn", "--multi-turn-num-users", "3",
            "--multi-turn-num-turns", "2", "--multi-turn-system-prompt-len", "5", "--multi-turn-question-len", "4",
            "--multi-turn-user-history-len", "50", "--disable-tqdm", "--save-result", str(tmp_path / "r.json")]  # fmt: skip

    assert await asyncio.to_thread(bench.main, parse(argv)) == 0

    first = {r.request_id.rsplit("-t", 1)[0]: r.messages[1].content for r in fake.requests if r.request_id.endswith("-t0")}
    assert len(first) == 3 and len(set(first.values())) == 3  # each user's own
    for text in first.values():
        history, question = text.split("\n\n")
        assert len(history.split()) == 50 and len(question.split()) == 4
    for r in fake.requests:  # every later turn opens with the same first message
        assert r.messages[1].content == first[r.request_id.rsplit("-t", 1)[0]]


async def test_multi_turn_sends_each_turn_with_the_answers_the_mesh_gave(serve_fake, tmp_path: Path) -> None:
    fake = ChatFake()
    target = await serve_fake(fake)
    out = tmp_path / "result.json"
    argv = ["--target", target, "--service", "worker", "--dataset-name", "multi_turn", "--multi-turn-num-users", "3",
            "--multi-turn-num-turns", "3", "--multi-turn-system-prompt-len", "5", "--multi-turn-question-len", "4",
            "--disable-tqdm", "--save-result", str(out)]  # fmt: skip

    assert await asyncio.to_thread(bench.main, parse(argv)) == 0

    result = json.loads(out.read_text())
    assert result["completed"] == 9 and result["dataset_name"] == "multi_turn"
    assert result["multi_turn_num_users"] == 3
    by_id = {r.request_id: r for r in fake.requests}
    systems = {r.messages[0].content for r in fake.requests}
    assert len(systems) == 1 and len(next(iter(systems)).split()) == 5  # one shared system prompt
    for r in fake.requests:
        user, turn = r.request_id.rsplit("-t", 1)
        turn_no = int(turn)
        assert [m.role for m in r.messages] == ["system", *["user", "assistant"] * turn_no, "user"]
        assert r.user == user  # one session key per conversation
        for t in range(turn_no):  # every earlier answer, as this fake gave it
            assert r.messages[2 + 2 * t].content == f" answer {user}-t{t} after {2 + 2 * t}"
        if turn_no:
            assert r.messages[:-2] == by_id[f"{user}-t{turn_no - 1}"].messages[:]


def test_models_are_drawn_uniformly_or_by_zipf_and_seeded() -> None:
    names = ["a", "b", "c", "d"]
    uniform = model_choices(8000, names, "uniform", random.Random(1))
    zipf = model_choices(8000, names, "zipf", random.Random(1))
    assert all(1800 < uniform.count(n) < 2200 for n in names)
    counts = [zipf.count(n) for n in names]  # 1 : 1/2 : 1/3 : 1/4 of 2.083
    assert counts == sorted(counts, reverse=True) and 3600 < counts[0] < 4100 and 850 < counts[3] < 1050
    assert zipf == model_choices(8000, names, "zipf", random.Random(1))


def test_several_models_apply_to_single_requests_not_to_conversations(capsys: pytest.CaptureFixture) -> None:
    assert bench.main(parse(["--lora-modules", "a", "b", "--dataset-name", "multi_turn"])) == 2
    assert "not to multi_turn" in capsys.readouterr().err


def test_a_mesh_stack_with_edge_tls_is_reached_over_https_trusting_its_ca(tmp_path: Path) -> None:
    from meshserve.loadgen.stacks import Stack

    tls = Stack("mesh", "m", tmp_path, tmp_path, ["--no-mesh-tls", "--tls-self-signed"])
    assert tls.base_url(8080) == "https://127.0.0.1:8080"
    assert tls.client_env() == {"SSL_CERT_FILE": str(tmp_path / "mesh-run" / "tls" / "ca.pem")}
    for plain in (Stack("mesh", "m", tmp_path, tmp_path, ["--no-mesh-tls"]), Stack("vllm", "m", tmp_path)):
        assert plain.base_url(8100) == "http://127.0.0.1:8100" and plain.client_env() == {}


def test_a_routing_benchmark_runs_each_policy_and_each_variant_under_its_label() -> None:
    assert policy_runs("kv-aware,round-robin,", ["bound2=kv-aware --load-bound 2"]) == {
        "kv-aware": ["--routing", "kv-aware"], "round-robin": ["--routing", "round-robin"],
        "bound2": ["--routing", "kv-aware", "--load-bound", "2"]}

