"""The sim engine on a fake clock: latency model, prefix cache, batching cap, KV pool, determinism."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import math
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from meshserve.services.config import WorkerConfig
from meshserve.services.offload import OFFLOAD_CHARS
from meshserve.services.prompts import sim_tokenize as tokenize
from meshserve.services.validation import InvalidRequest
from meshserve.worker.engine import Delta, Load, PromptTooLong, Request
from meshserve.worker import sim_engine
from meshserve.worker.sim_engine import SimEngine


class FakeClock:
    """Simulated time: a sleep first lets every ready task run (so readers see a step's tokens at
    the time they were made), then jumps the clock forward."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(0)
        self.now += seconds


@dataclasses.dataclass
class Result:
    deltas: list[Delta]
    times: list[float]       # fake-clock time each delta arrived
    loads: list[Load]        # the engine's load when each delta arrived
    start: float

    @property
    def text(self) -> str:
        return "".join(d.text for d in self.deltas)

    @property
    def token_ids(self) -> list[int]:
        return [t for d in self.deltas for t in d.token_ids]

    @property
    def ttft(self) -> float:
        return self.times[0] - self.start

    @property
    def itls(self) -> list[float]:
        return [b - a for a, b in zip(self.times, self.times[1:])]

    @property
    def last(self) -> Delta:
        return self.deltas[-1]


Make = Callable[..., Awaitable[tuple[SimEngine, FakeClock]]]


@pytest.fixture
async def make_engine() -> AsyncIterator[Make]:
    engines: list[SimEngine] = []

    async def make(offload_chars: float = math.inf, **overrides: object) -> tuple[SimEngine, FakeClock]:
        clock = FakeClock()
        cfg = WorkerConfig(**{"engine": "sim", "max_model_len": 4096, **overrides})  # type: ignore[arg-type]
        # Every prompt tokenized on the loop, unless a test says otherwise: a thread's time is not the clock's.
        engine = SimEngine(cfg, clock=clock, sleep=clock.sleep, offload_chars=offload_chars)  # type: ignore[arg-type]
        await engine.start()
        engines.append(engine)
        return engine, clock

    yield make
    for engine in engines:
        await engine.close()


def words(tag: str, n: int) -> str:
    """A prompt of exactly ``n`` simulated tokens (4-character words), distinct per ``tag``."""
    return " ".join(f"{tag}{i:03x}" for i in range(n))


def req(prompt: str, max_tokens: int = 4, **kw: object) -> Request:
    rid = f"r-{prompt[:8]}-{max_tokens}"
    return Request(request_id=rid, prompt=prompt, max_tokens=max_tokens, **kw)  # type: ignore[arg-type]


async def run(engine: SimEngine, clock: FakeClock, request: Request) -> Result:
    result = Result([], [], [], clock())
    async for delta in engine.generate(request):
        result.deltas.append(delta)
        result.times.append(clock())
        result.loads.append(engine.load())
    return result


def ms(x: float) -> float:
    return x / 1000.0


def test_stand_in_tokenizer_counts_four_character_pieces() -> None:
    assert len(tokenize(words("a", 37))) == 37
    assert tokenize("hello world") == tokenize("hello world")
    assert len(tokenize("internationalization")) == 5


async def test_ttft_grows_with_uncached_prompt_length(make_engine: Make) -> None:
    engine, clock = await make_engine()
    short = await run(engine, clock, req(words("a", 160)))
    long = await run(engine, clock, req(words("b", 1600)))
    # prefill of every prompt token + one decode step of a batch of one (the defaults: an 8B model on H100)
    assert short.ttft == pytest.approx(ms(160 * 0.06 + 7.0 + 0.05))
    assert long.ttft == pytest.approx(ms(1600 * 0.06 + 7.0 + 0.05))
    assert short.last.prompt_tokens == 160 and short.last.cached_prompt_tokens == 0
    assert short.last.finish_reason == "length" and short.last.completion_tokens == 4


async def test_repeated_prefix_hits_the_prefix_cache(make_engine: Make) -> None:
    engine, clock = await make_engine()
    system = words("s", 320)  # 20 full blocks of 16 tokens
    first = await run(engine, clock, req(system + " " + words("q", 40)))
    second = await run(engine, clock, req(system + " " + words("u", 40)))
    assert first.last.cached_prompt_tokens == 0
    assert second.last.cached_prompt_tokens == 320
    assert second.ttft == pytest.approx(ms(40 * 0.06 + 7.05))
    assert second.ttft < first.ttft
    assert engine.load().prefix_cache_hit_rate == pytest.approx(320 / 720)
    # The very same prompt: every full block but the last hits, one token must still be computed.
    again = await run(engine, clock, req(system + " " + words("u", 40)))
    assert again.last.cached_prompt_tokens == 352


async def test_prefix_caching_can_be_turned_off(make_engine: Make) -> None:
    engine, clock = await make_engine(enable_prefix_caching=False)
    first, second = [await run(engine, clock, req(words("s", 320))) for _ in range(2)]
    assert second.last.cached_prompt_tokens == 0 and second.ttft == first.ttft
    assert engine.load().prefix_cache_hit_rate == 0.0


async def test_itl_grows_with_batch_size(make_engine: Make) -> None:
    engine, clock = await make_engine(sim_itl_per_seq_ms=0.5)
    alone = await run(engine, clock, req(words("a", 16), max_tokens=8))
    batch = await asyncio.gather(*(run(engine, clock, req(words(f"{i:x}", 16), 8)) for i in range(32)))
    assert alone.itls == pytest.approx([ms(7.0 + 0.5)] * 7)
    for result in batch:
        assert result.itls == pytest.approx([ms(7.0 + 0.5 * 32)] * 7)


async def test_a_prompt_longer_than_the_step_budget_is_prefilled_in_chunks(make_engine: Make) -> None:
    engine, clock = await make_engine(sim_max_num_batched_tokens=1024, max_num_seqs=8, max_model_len=8192)
    result = await run(engine, clock, req(words("c", 2500)))
    # Three steps of 1,024, 1,024 and 452 prompt tokens; the last one gives the first token.
    assert result.ttft == pytest.approx(ms(2500 * 0.06 + 3 * (7.0 + 0.05)))
    assert result.itls == pytest.approx([ms(7.05)] * 3)


@pytest.mark.parametrize(("budget", "longest_gap_ms"), [
    (0, 3000 * 0.06 + 7.0 + 0.05 * 2),        # no budget: the whole prefill in one step
    (1024, 1023 * 0.06 + 7.0 + 0.05 * 2),     # a token for the stream, 1,023 of the prompt
])
async def test_a_long_prefill_stalls_a_decoding_stream_for_one_chunk_only(
    make_engine: Make, budget: int, longest_gap_ms: float
) -> None:
    engine, clock = await make_engine(sim_max_num_batched_tokens=budget, max_num_seqs=8, max_model_len=8192)
    times: list[float] = []
    long = None
    async for _ in engine.generate(req(words("d", 16), max_tokens=20)):
        times.append(clock())
        if len(times) == 2:  # decoding: now a 3,000-token prompt arrives
            long = asyncio.create_task(run(engine, clock, req(words("e", 3000), max_tokens=2)))
    assert long is not None and (await long).last.completion_tokens == 2
    assert max(b - a for a, b in itertools.pairwise(times)) == pytest.approx(ms(longest_gap_ms))


async def test_the_blocks_of_a_prompt_scheduled_so_far_are_in_the_prefix_cache(make_engine: Make) -> None:
    # Two prompts sharing 2,400 tokens arrive together; the second is admitted in the third step,
    # after the first's last chunk (tokens 2,048-2,500) was scheduled in it: as in vLLM v1, whose
    # scheduler commits a block to the prefix cache when it allocates it, the second reuses all
    # 150 shared blocks, those computed in the same step included.
    engine, clock = await make_engine(sim_max_num_batched_tokens=1024, max_num_seqs=8, max_model_len=8192)
    first, second = await asyncio.gather(run(engine, clock, req(words("c", 2500))),
                                         run(engine, clock, req(words("c", 2400) + " " + words("z", 100))))
    assert first.last.cached_prompt_tokens == 0
    assert second.last.cached_prompt_tokens == 2400


async def test_a_burst_sharing_a_prefix_computes_it_once(make_engine: Make) -> None:
    # Eight prompts with one 1,024-token prefix, admitted in one step (no token budget): the first
    # computes the prefix, the seven after it reuse its 64 blocks.
    engine, clock = await make_engine(max_num_seqs=8)
    results = await asyncio.gather(*(run(engine, clock, req(words("p", 1024) + " " + words(f"q{i}", 32)))
                                     for i in range(8)))
    assert [r.last.cached_prompt_tokens for r in results] == [0] + [1024] * 7


async def test_a_step_budget_below_max_num_seqs_is_refused() -> None:
    with pytest.raises(ValueError, match="--sim-max-num-batched-tokens .100. must be 0 .no budget. or at least "
                                         "--max-num-seqs .256."):
        SimEngine(WorkerConfig(engine="sim", max_num_seqs=256, sim_max_num_batched_tokens=100))


async def test_max_num_seqs_caps_the_batch_and_the_rest_wait(make_engine: Make) -> None:
    engine, clock = await make_engine(max_num_seqs=4)
    results = await asyncio.gather(*(run(engine, clock, req(words(f"{i}", 16), 5)) for i in range(6)))
    assert results[0].loads[0].num_running == 4
    assert results[0].loads[0].num_waiting == 2
    first_four_done = max(r.times[-1] for r in results[:4])
    for late in results[4:]:
        assert late.times[0] - late.start > first_four_done - late.start
    assert all(r.last.finish_reason == "length" and r.last.completion_tokens == 5 for r in results)


async def test_cancelling_a_stream_aborts_it_and_frees_its_blocks(make_engine: Make) -> None:
    engine, clock = await make_engine(max_num_seqs=1)
    first_token = asyncio.Event()

    async def consume(request: Request) -> None:
        async for _ in engine.generate(request):
            first_token.set()

    running = asyncio.create_task(consume(req(words("a", 100), max_tokens=1000)))
    waiting = asyncio.create_task(consume(req(words("b", 100), max_tokens=1000)))
    await asyncio.wait_for(first_token.wait(), 5)
    load = engine.load()
    assert (load.num_running, load.num_waiting) == (1, 1)
    assert load.kv_cache_usage > 0

    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert (engine.load().num_running, engine.load().num_waiting) == (1, 0)

    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert engine.load() == Load(num_running=0, num_waiting=0, kv_cache_usage=0.0, prefix_cache_hit_rate=0.0)


async def test_same_prompt_and_seed_give_the_same_output(make_engine: Make) -> None:
    (one, clock1), (two, clock2) = await make_engine(), await make_engine()
    prompt = words("p", 50)
    a = await run(one, clock1, req(prompt, max_tokens=20, temperature=0.8, seed=7))
    b = await run(two, clock2, req(prompt, max_tokens=20, temperature=0.8, seed=7))
    c = await run(two, clock2, req(prompt, max_tokens=20, temperature=0.8, seed=8))
    assert (a.text, a.token_ids) == (b.text, b.token_ids)
    assert len(a.token_ids) == 20 and a.text.count(" ") == 20
    assert c.text != a.text
    greedy = [await run(one, clock1, req(prompt, max_tokens=20, temperature=0.0, seed=s)) for s in (None, 1)]
    assert greedy[0].text == greedy[1].text
    # Re-tokenizing the output gives back its token ids (so multi-turn prompts can hit the cache).
    assert tokenize(a.text) == a.token_ids


async def test_stop_string_ends_the_stream_before_it(make_engine: Make) -> None:
    engine, clock = await make_engine()
    prompt = words("p", 30)
    full = await run(engine, clock, req(prompt, max_tokens=30, temperature=0.0))
    stop = full.text.split(" ")[5][:3]  # part of the fifth word: may also occur earlier
    cut = full.text.index(stop)
    stopped = await run(engine, clock, req(prompt, max_tokens=30, temperature=0.0, stop=[stop, "never-seen"]))
    assert stopped.text == full.text[:cut]
    assert stopped.last.finish_reason == "stop"
    assert stopped.token_ids == full.token_ids[: len(stopped.token_ids)]
    assert stop not in "".join(d.text for d in stopped.deltas)


async def test_stop_token_ids_min_tokens_and_include_stop_str(make_engine: Make) -> None:
    engine, clock = await make_engine()
    prompt = words("q", 30)
    full = await run(engine, clock, req(prompt, max_tokens=30, temperature=0.0))
    third = full.token_ids[2]
    at = full.token_ids.index(third)  # may occur earlier than the third position
    by_id = await run(engine, clock, req(prompt, max_tokens=30, temperature=0.0, stop_token_ids=[third]))
    assert by_id.token_ids == full.token_ids[: at + 1] and by_id.last.finish_reason == "stop"
    assert by_id.text == " ".join(full.text.split(" ")[: at + 1])  # the stop token's text is left out
    kept = await run(engine, clock, req(prompt, max_tokens=30, temperature=0.0, stop_token_ids=[third],
                                        include_stop_str_in_output=True))
    assert kept.text == " ".join(full.text.split(" ")[: at + 2])
    # Before min_tokens a stop token is never drawn (as vLLM masks its logit).
    first = full.token_ids[0]
    later = await run(engine, clock, req(prompt, max_tokens=30, temperature=0.0, stop_token_ids=[first], min_tokens=30))
    assert len(later.token_ids) == 30 and first not in later.token_ids
    stop = full.text.split(" ")[5][:3]
    with_stop = await run(engine, clock, req(prompt, max_tokens=30, temperature=0.0, stop=[stop],
                                             include_stop_str_in_output=True))
    assert with_stop.text == full.text[: full.text.index(stop) + len(stop)]


async def test_logprobs_are_the_simulators_own_distribution(make_engine: Make) -> None:
    engine, clock = await make_engine()
    out = await run(engine, clock, req(words("r", 10), max_tokens=6, temperature=0.0, logprobs=3))
    logprobs = [lp for d in out.deltas for lp in (d.logprobs or [])]
    assert [lp.token_id for lp in logprobs] == out.token_ids
    for lp in logprobs:
        assert len(lp.top) == 3 and lp.top[0][0] == lp.token_id
        assert 0 < sum(math.exp(v) for _, _, v in lp.top) <= 1
        assert tokenize(lp.token) == [lp.token_id]
    plain = await run(engine, clock, req(words("r", 10), max_tokens=6, temperature=0.0))
    assert all(d.logprobs is None for d in plain.deltas) and plain.token_ids == out.token_ids


async def test_a_constraint_is_refused_naming_it(make_engine: Make) -> None:
    engine, clock = await make_engine()
    with pytest.raises(InvalidRequest, match="^'structured_outputs' is not supported by the 'sim' engine"):
        await run(engine, clock, req(words("s", 4), structured_outputs={"json_object": True}))
    assert engine.load() == Load()


async def test_lru_eviction_keeps_the_recently_used_prefix(make_engine: Make) -> None:
    # 6 blocks of 4 tokens; each 9-token prompt takes 3 blocks and leaves 2 full ones cached.
    engine, clock = await make_engine(block_size=4, sim_num_kv_blocks=6)
    a, b, c = (words(t, 9) for t in "abc")
    for prompt in (a, b, a, c):  # a is used after b, so b is the least recently used
        await run(engine, clock, req(prompt, max_tokens=1))
    a_again = await run(engine, clock, req(a, max_tokens=1))
    b_again = await run(engine, clock, req(b, max_tokens=1))
    assert a_again.last.cached_prompt_tokens == 8
    assert b_again.last.cached_prompt_tokens < 8
    assert engine._pool.evictions > 0


async def test_full_kv_pool_makes_requests_wait_and_preempts_without_changing_output(
    make_engine: Make,
) -> None:
    engine, clock = await make_engine(block_size=4, sim_num_kv_blocks=6)
    requests = [req(words(t, 8), max_tokens=12, seed=3) for t in "ab"]
    together = await asyncio.gather(*(run(engine, clock, r) for r in requests))
    assert engine.num_preemptions > 0
    assert any(load.num_waiting > 0 for r in together for load in r.loads)
    for request, result in zip(requests, together):
        alone_engine, alone_clock = await make_engine(block_size=4, sim_num_kv_blocks=6)
        alone = await run(alone_engine, alone_clock, request)
        assert (result.text, result.token_ids) == (alone.text, alone.token_ids)
        assert result.last.completion_tokens == 12
    assert engine.load().kv_cache_usage == 0.0


async def test_prompt_too_long_is_refused_before_any_output(make_engine: Make) -> None:
    engine, _ = await make_engine(max_model_len=100)
    with pytest.raises(PromptTooLong):
        await anext(engine.generate(req(words("a", 90), max_tokens=20)))
    assert engine.load().num_waiting == 0


async def test_load_signal_wakes_watchers_on_change(make_engine: Make) -> None:
    engine, clock = await make_engine()
    await engine.load_signal.wait(0)  # clear
    task = asyncio.create_task(run(engine, clock, req(words("a", 10), max_tokens=3)))
    started = time.monotonic()
    await engine.load_signal.wait(10.0)
    assert time.monotonic() - started < 5.0
    await task


async def test_chat_messages_are_rendered_into_the_prompt(make_engine: Make) -> None:
    engine, clock = await make_engine()
    messages = [{"role": "system", "content": words("s", 40)}, {"role": "user", "content": "hi"}]
    result = await run(engine, clock, Request(request_id="chat", messages=messages, max_tokens=2))
    assert result.last.prompt_tokens > 40 and result.last.finish_reason == "length"


async def test_an_engine_failure_mid_admission_ends_every_request(make_engine: Make) -> None:
    """A request the failing step had taken off the queue, but not yet into the batch, still ends."""
    engine, clock = await make_engine()

    def broken(*_: object) -> None:
        raise RuntimeError("a bug in the step")

    engine._record_prefix_query = broken  # type: ignore[method-assign]  # noqa: SLF001
    result = await asyncio.wait_for(run(engine, clock, req(words("f", 40))), 5)
    assert result.last.finish_reason == "abort"


@pytest.mark.parametrize("sampling", [{"temperature": 0.0}, {"temperature": 0.8, "seed": 3}])
async def test_a_continued_stream_goes_on_as_the_undisturbed_one(make_engine: Make, sampling: dict) -> None:
    # Another worker (engine) continues a migrated stream from the tokens the client already has.
    (one, clock1), (two, clock2) = await make_engine(), await make_engine()
    prompt = words("c", 40)
    whole = await run(one, clock1, req(prompt, max_tokens=20, **sampling))
    head = whole.token_ids[:7]
    rest = await run(two, clock2, req(prompt, max_tokens=20, continue_token_ids=head, **sampling))
    assert rest.token_ids == whole.token_ids[7:]  # nothing again, nothing missing
    assert head + rest.token_ids == whole.token_ids
    assert whole.text.endswith(rest.text) and len(rest.text) == len(whole.text) - len(tokenize_text(whole, 7))
    assert rest.last.finish_reason == "length"
    assert (rest.last.prompt_tokens, rest.last.completion_tokens) == (whole.last.prompt_tokens, 20)


def tokenize_text(result: Result, n: int) -> str:
    """The text of a result's first ``n`` tokens (the sim streams one word per token)."""
    return "".join(d.text for d in result.deltas[:n])


async def first_token(engine: SimEngine, r: Request, order: list[str]) -> None:
    """Appends ``r``'s id to ``order`` when its first token comes."""
    async for _ in engine.generate(r):
        order.append(r.request_id)
        break


async def test_with_the_priority_policy_the_most_urgent_waiting_request_runs_next(make_engine: Make) -> None:
    engine, clock = await make_engine(max_num_seqs=1)
    first_tokens: list[str] = []
    running = asyncio.create_task(run(engine, clock, req(words("run", 8), max_tokens=20)))
    await asyncio.sleep(0)  # it is running; the rest wait
    low = [asyncio.create_task(first_token(engine, Request(request_id=f"low-{i}", prompt=words(f"l{i}", 8),
                                                           max_tokens=2), first_tokens)) for i in range(3)]
    await asyncio.sleep(0)
    urgent = asyncio.create_task(first_token(engine, Request(request_id="urgent", prompt=words("u", 8), max_tokens=2,
                                                             priority=-1), first_tokens))
    await asyncio.gather(running, urgent, *low)
    assert first_tokens == ["urgent", "low-0", "low-1", "low-2"]  # queued last, served first


async def test_fcfs_serves_in_arrival_order_whatever_the_priority(make_engine: Make) -> None:
    engine, clock = await make_engine(max_num_seqs=1, scheduling_policy="fcfs")
    order: list[str] = []
    running = asyncio.create_task(run(engine, clock, req(words("run", 8), max_tokens=20)))
    await asyncio.sleep(0)
    tasks = [asyncio.create_task(first_token(engine, Request(request_id=rid, prompt=words(rid, 8), max_tokens=2,
                                                             priority=p), order)) for rid, p in (("a", 0), ("b", -5))]
    await asyncio.gather(running, *tasks)
    assert order == ["a", "b"]


async def test_with_the_priority_policy_a_full_kv_pool_preempts_the_least_urgent(make_engine: Make) -> None:
    engine, clock = await make_engine(block_size=4, sim_num_kv_blocks=6)
    urgent = Request(request_id="urgent", prompt=words("u", 8), max_tokens=12, seed=3, priority=-1)
    routine = Request(request_id="routine", prompt=words("r", 8), max_tokens=12, seed=3)
    # The routine request arrives first; the urgent one is the newest, which fcfs would preempt.
    results = await asyncio.gather(run(engine, clock, routine), run(engine, clock, urgent))
    assert engine.num_preemptions > 0
    routine_done, urgent_done = (r.times[-1] for r in results)
    assert urgent_done < routine_done  # the routine one gave up its blocks and finished later


LORA = {"enable_lora": True, "lora_modules": ["a=/adapters/a", "b=/adapters/b", "c=/adapters/c"]}


async def test_each_adapter_answers_as_itself_and_the_base_model_as_before(make_engine: Make) -> None:
    engine, clock = await make_engine(**LORA)
    plain, _ = await make_engine()
    prompt = words("p", 40)
    base = await run(plain, clock, req(prompt, max_tokens=12, temperature=0.0))
    texts = [(await run(engine, clock, req(prompt, max_tokens=12, temperature=0.0, adapter=a))).text
             for a in (None, "a", "b", "a")]
    assert texts[0] == base.text  # LoRA on changes nothing for the base model
    assert len({texts[0], texts[1], texts[2]}) == 3 and texts[3] == texts[1]


async def test_an_adapters_blocks_are_its_own(make_engine: Make) -> None:
    engine, clock = await make_engine(**LORA)
    prompt = words("q", 64)
    await run(engine, clock, req(prompt, max_tokens=2, temperature=0.0, adapter="a"))
    others = [await run(engine, clock, req(prompt, max_tokens=2, temperature=0.0, adapter=a)) for a in (None, "b")]
    again = await run(engine, clock, req(prompt, max_tokens=2, temperature=0.0, adapter="a"))
    assert [r.last.cached_prompt_tokens for r in others] == [0, 0]
    assert again.last.cached_prompt_tokens == 48  # its own three full blocks (the last token is computed)


async def test_requests_on_more_adapters_than_slots_wait_for_one(make_engine: Make) -> None:
    """Two slots, requests on three adapters: the third adapter's waits while the other two run,
    and a base-model request behind it goes on."""
    engine, clock = await make_engine(**LORA, max_loras=2)
    results = await asyncio.gather(*(run(engine, clock, req(words(f"{a}{i}", 16), 8, adapter=a))
                                     for i, a in enumerate(["a", "b", "c", None])))
    assert results[0].loads[0].num_running == 3 and results[0].loads[0].num_waiting == 1
    assert results[0].loads[0].running_adapters == ("a", "b")  # c waits: both slots run others
    assert results[0].loads[0].waiting_adapters == ("c",)
    first_two_done = max(r.times[-1] for r in results[:2])
    assert results[2].times[0] > first_two_done
    assert results[3].times[0] < first_two_done


async def test_an_adapter_the_engine_does_not_hold_is_refused(make_engine: Make) -> None:
    engine, clock = await make_engine(**LORA)
    with pytest.raises(InvalidRequest, match="'z' is not loaded"):
        await run(engine, clock, req(words("r", 8), adapter="z"))


async def test_an_adapters_blocks_are_reported_on_its_own_chain(make_engine: Make) -> None:
    from meshserve.services.prompts import block_hashes, chain_root

    engine, clock = await make_engine(**LORA)
    prompt = words("s", 40)
    await run(engine, clock, req(prompt, max_tokens=2, temperature=0.0, adapter="a"))
    assert engine.kv_cache is not None
    ids = tokenize(prompt)
    assert all(h in engine.kv_cache for h in block_hashes(ids, 16, parent=chain_root("a")))
    assert not any(h in engine.kv_cache for h in block_hashes(ids, 16))
    assert len({chain_root(None), chain_root("a"), chain_root("b")}) == 3


# (start: the slots' and CPU's adapters, then requests as (adapter, its running neighbours)) ->
# each request's load cost, and the slots and CPU after.
SLOT_CASES = [
    pytest.param(["a", "b"], [("b", set())], [0.0], ("a", "b"), ("a", "b"), id="in-a-slot-costs-nothing"),
    pytest.param([], [("a", set())], [55.0], ("a",), ("a",), id="a-free-slot-from-disk"),
    pytest.param(["a", "b", "c"], [("a", set())], [5.0], ("c", "a"), ("b", "c", "a"),
                 id="evicts-the-lru-slot-from-cpu"),
    pytest.param(["a", "b", "c"], [("a", {"b"}), ("b", {"a"})], [5.0, 0.0], ("a", "b"), ("b", "c", "a"),
                 id="a-busy-adapter-is-not-evicted"),
    pytest.param(["a", "b", "c", "d"], [("a", set())], [55.0], ("d", "a"), ("c", "d", "a"),
                 id="evicted-from-cpu-too-reads-disk"),
]


@pytest.mark.parametrize(("preloaded", "requests", "costs", "slots", "cpu"), SLOT_CASES)
def test_adapter_slots_load_what_they_lack_and_evict_the_least_recently_used_idle_one(
    preloaded: list[str], requests: list[tuple[str, set[str]]], costs: list[float],
    slots: tuple[str, ...], cpu: tuple[str, ...],
) -> None:
    held = sim_engine.AdapterSlots(max_loras=2, max_cpu_loras=3, load_ms=5.0, disk_load_ms=50.0, preloaded=preloaded)
    assert [held.bring(adapter, busy) for adapter, busy in requests] == costs
    assert held.active == slots
    assert tuple(held._cpu) == cpu  # noqa: SLF001
    assert sum(held.loads.values()) == sum(1 for c in costs if c)
    assert sum(held.disk_loads.values()) == sum(1 for c in costs if c > 5.0)


def test_a_step_using_an_adapter_keeps_it_from_eviction() -> None:
    held = sim_engine.AdapterSlots(2, 2, 5.0, 50.0, preloaded=["a", "b"])
    held.used(["a"])  # a ran in the last step: b is now the least recently used
    held.bring("c", set())
    assert held.active == ("a", "c")


LORA_COSTS = {**LORA, "max_loras": 1, "max_cpu_loras": 1, "sim_lora_load_ms": 5.0, "sim_lora_disk_load_ms": 50.0,
              "sim_lora_step_overhead": 0.5, "sim_lora_adapter_ms": 1.0, "sim_prefill_ms_per_token": 0.0,
              "sim_itl_per_seq_ms": 0.0}


async def test_bringing_an_adapter_into_a_slot_lengthens_its_first_step(make_engine: Make) -> None:
    """One slot and one adapter in CPU memory (c, the last loaded at start): c runs at once, a is
    read from disk and evicts c, a again costs nothing, then c comes back from disk."""
    engine, clock = await make_engine(**LORA_COSTS)
    step = 7.0 * 1.5 + 1.0  # the base step with the LoRA kernels and one adapter's weights
    assert engine.load().active_adapters == ("c",)
    ttfts = [(await run(engine, clock, req(words(f"t{a}{i}", 8), 1, adapter=a))).ttft
             for i, a in enumerate(["c", "a", "a", "c"])]
    assert ttfts == pytest.approx([ms(step), ms(step + 55.0), ms(step), ms(step + 55.0)])
    assert dict(engine.adapter_loads()) == {"a": 1, "c": 1}
    assert engine.load().active_adapters == ("c",)


async def test_a_batch_of_two_adapters_reads_both_every_step(make_engine: Make) -> None:
    engine, clock = await make_engine(**{**LORA_COSTS, "max_loras": 2, "max_cpu_loras": 3})
    together = await asyncio.gather(*(run(engine, clock, req(words(f"u{a}", 8), 6, adapter=a)) for a in "bc"))
    assert together[0].itls == pytest.approx([ms(7.0 * 1.5 + 2.0)] * 5)
    assert engine.adapter_loads() == {}  # b and c were in the slots from the start


@pytest.mark.parametrize(("prompt_chars", "on_the_loop"), [(OFFLOAD_CHARS - 1, True), (OFFLOAD_CHARS, False)])
async def test_a_large_prompt_is_tokenized_off_the_event_loop(
    make_engine: Make, monkeypatch: pytest.MonkeyPatch, prompt_chars: int, on_the_loop: bool
) -> None:
    """Below the threshold on the loop (a hop to a thread would cost more), from it on in the
    engine's thread; refused the same way when it does not fit."""
    threads: list[threading.Thread] = []

    def recording(text: str) -> list[int]:
        threads.append(threading.current_thread())
        return tokenize(text)

    monkeypatch.setattr(sim_engine, "sim_tokenize", recording)
    engine, _ = await make_engine(offload_chars=OFFLOAD_CHARS, max_model_len=100)
    with pytest.raises(PromptTooLong):
        await anext(engine.generate(req("x" * prompt_chars, max_tokens=20)))
    assert [t is threading.main_thread() for t in threads] == [on_the_loop]
