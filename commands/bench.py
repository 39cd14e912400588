"""``meshserve bench``: the command line of the load generator (loadgen), in the manner of
``vllm bench serve``.

It streams random prompts to the mesh's public ``Inference/Generate`` (through Envoy or the
gateway) or to one worker's ``Worker/Generate``, measures TTFT, TPOT, ITL and end-to-end latency
per request, prints vLLM's summary table and can save vLLM's JSON result keys.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import random
import sys
import uuid
from collections.abc import Sequence
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from meshserve.loadgen.plot import plot_runs
from meshserve.loadgen.results import METRIC_HEADERS, format_summary, save_result, summarize
from meshserve.loadgen.runner import (
    STREAMS_PER_CHANNEL,
    OpenStream,
    OpenTurn,
    connect,
    open_channels,
    run_conversations,
    run_requests,
)
from meshserve.loadgen.workloads import (
    DEFAULT_PAIRS,
    BenchRequest,
    Conversation,
    arrival_offsets,
    multi_turn_conversations,
    prefix_repetition_requests,
    model_choices,
    random_requests,
    repeats_requests,
)
from meshserve.services import config
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)

_positive_int = config.at_least(int, 1)
_non_negative_float = config.at_least(float, 0.0)
_non_negative_int = config.at_least(int, 0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    target.add_argument("--target", default="127.0.0.1:8080", help="HOST:PORT to load (default: Envoy)")
    target.add_argument(
        "--service",
        choices=["inference", "worker"],
        default="inference",
        help="inference: the mesh's public Inference/Generate; worker: one worker's Worker/Generate",
    )
    target.add_argument("--num-channels", type=_positive_int, default=None,
                        help="gRPC connections to spread streams over "
                        f"(default: one per {STREAMS_PER_CHANNEL} concurrent streams)")
    target.add_argument("--timeout", type=float, default=600.0, help="per-request deadline, seconds")
    target.add_argument("--model", default="",
                        help="model name to send (a served one); several, comma-separated (base models of a mesh "
                             "that serves several, or adapters): each request names one of them, as --lora-modules, "
                             "and the summary breaks down by model")
    target.add_argument("--lora-modules", nargs="+", default=[], metavar="NAME",
                        help="LoRA adapters the mesh serves (vLLM's flag; space- or comma-separated): each request "
                             "names one of them, as --lora-popularity draws; the summary breaks down by adapter")
    target.add_argument("--lora-popularity", choices=["uniform", "zipf"], default="uniform",
                        help="how often each of --lora-modules (or --model's names) is asked: uniform, or Zipf "
                             "(the first name the most popular)")
    target.add_argument("--zipf-exponent", type=float, default=1.0, help="the Zipf skew s of --lora-popularity zipf")

    load = parser.add_argument_group("load")
    load.add_argument("--num-prompts", type=_positive_int, default=1000, help="number of requests")
    load.add_argument("--max-concurrency", type=_positive_int, default=None,
                      help="most requests in flight at once (default: no limit)")
    load.add_argument("--request-rate", type=float, default=float("inf"),
                      help="requests per second, Poisson arrivals; inf sends all at once")
    load.add_argument("--burstiness", type=float, default=1.0,
                      help="gamma shape of inter-arrival times: 1 is Poisson, <1 burstier, >1 more regular")
    load.add_argument("--num-warmups", type=int, default=0, help="untimed requests sent before the benchmark")
    load.add_argument("--seed", type=int, default=0, help="seed of the prompts and arrival times")
    load.add_argument("--honor-retry-after", action="store_true",
                      help="a refused request's user waits the refusal's retry-after and sends it again (as the "
                           "OpenAI SDK does; the request is timed on its last try); default: refused, it counts "
                           "as failed and the user sends its next request at once")

    parser.add_argument("--dataset-name", default="random",
                        choices=["random", "prefix_repetition", "multi_turn", "repeats"],
                        help="the prompts: random words, shared prefixes plus random suffixes, or "
                             "conversations (closed loop: each turn after the previous answer)")
    data = parser.add_argument_group("random dataset")
    data.add_argument("--random-input-len", type=_positive_int, default=1024,
                      help="prompt length in words (about one token each)")
    data.add_argument("--random-output-len", type=_positive_int, default=128, help="max_tokens per request")
    data.add_argument("--random-range-ratio", type=float, default=0.0,
                      help="lengths are uniform in [len * (1 - r), len * (1 + r)], 0 <= r < 1")
    data.add_argument("--random-distinct-prompts", type=int, default=0,
                      help="only this many different requests, sent in turn (0: every request differs); "
                           "1 with --allow-cache: a burst of identical requests, coalesced by the gateway")
    data.add_argument("--random-prefix-len", type=int, default=0,
                      help="words of a prefix shared by every prompt")

    rep = parser.add_argument_group("prefix_repetition dataset (vLLM's flag names)")
    rep.add_argument("--prefix-repetition-num-prefixes", type=_positive_int, default=10,
                     help="distinct prefixes, each shared by an equal share of the requests")
    rep.add_argument("--prefix-repetition-prefix-len", type=_positive_int, default=256, help="words per prefix")
    rep.add_argument("--prefix-repetition-suffix-len", type=_positive_int, default=256,
                     help="random words after the prefix, per request")
    rep.add_argument("--prefix-repetition-output-len", type=_positive_int, default=128, help="max_tokens per request")
    rep.add_argument("--prefix-repetition-hot-share", type=float, default=0.0,
                     help="fraction of the requests that share the first prefix (a hot prompt; not in vLLM)")
    turns = parser.add_argument_group("multi_turn dataset (--num-prompts, --max-concurrency and the "
                                      "request rate do not apply: the users are the load)")
    turns.add_argument("--multi-turn-num-users", type=_positive_int, default=100, help="concurrent users")
    turns.add_argument("--multi-turn-num-turns", type=_positive_int, default=5, help="turns per conversation")
    turns.add_argument("--multi-turn-system-prompt-len", type=_non_negative_int, default=200,
                       help="words of the system prompt all users share")
    turns.add_argument("--multi-turn-question-len", type=_positive_int, default=32, help="words per question")
    turns.add_argument("--multi-turn-user-history-len", type=_non_negative_int, default=0,
                       help="words of each user's own history before its first question, repeated in every turn "
                            "(production-stack's --user-history-prompt; 0: none)")
    turns.add_argument("--multi-turn-output-len", type=_positive_int, default=32, help="max_tokens per answer")
    turns.add_argument("--multi-turn-think-time", type=_non_negative_float, default=0.0,
                       help="seconds a user waits between an answer and the next question")
    turns.add_argument("--multi-turn-ramp-up", type=_non_negative_float, default=0.0,
                       help="seconds over which the users join, one after another (0: all at once)")
    sampling = parser.add_argument_group("sampling")
    sampling.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0: greedy)")
    sampling.add_argument("--top-p", type=float, default=None, help="nucleus sampling top-p")
    sampling.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                          help="generate exactly the requested output length")
    sampling.add_argument("--stream-interval", type=_positive_int, default=None,
                          help="tokens per streamed chunk after the first (default: the worker's)")
    sampling.add_argument("--allow-cache", action="store_true",
                          help="let the mesh answer from its response cache (default: skip_cache=true)")
    sampling.add_argument("--cache", choices=["off", "exact", "semantic"], default=None,
                          help="the requests' cache mode (implies --allow-cache unless off)")
    reps = parser.add_argument_group("repeats dataset (questions asked again, some in other words)")
    reps.add_argument("--repeats-share", type=float, default=0.2, help="fraction of requests that repeat an earlier one")
    reps.add_argument("--repeats-paraphrase-share", type=float, default=0.5,
                      help="fraction of the repeats in other words (the rest word for word)")
    reps.add_argument("--repeats-pairs", type=Path, default=DEFAULT_PAIRS,
                      help="labelled pairs (JSON lines a, b, label) the questions and paraphrases come from")

    output = parser.add_argument_group("output")
    output.add_argument("--save-result", nargs="?", const=True, default=None, metavar="FILE",
                        help="save the JSON result (to FILE, or --result-filename, or a generated name)")
    output.add_argument("--save-detailed", action="store_true",
                        help="also save the per-request lists (input_lens, output_lens, ttfts, itls, ...)")
    output.add_argument("--plot", type=Path, default=None, metavar="FILE.png",
                        help="plot this run to FILE.png (TTFT and ITL CDFs, throughput and requests in "
                             "flight over time); a saved result keeps its timings, for `meshserve plot`")
    output.add_argument("--result-filename", default=None, help="file name of the saved result")
    output.add_argument("--result-dir", default=None, help="folder of the saved result")
    output.add_argument("--metadata", nargs="*", default=[], metavar="KEY=VALUE",
                        help="extra KEY=VALUE pairs recorded in the JSON result")
    output.add_argument("--label", default=None, help="name of this run, recorded and used in the file name")
    output.add_argument("--percentile-metrics", default="ttft,tpot,itl,e2el",
                        help="comma-separated metrics to report percentiles of (ttft, tpot, itl, e2el)")
    output.add_argument("--metric-percentiles", default="99",
                        help="comma-separated percentiles, e.g. 50,90,99")
    output.add_argument("--disable-tqdm", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(run(args))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def _parse_metadata(items: Sequence[str]) -> dict[str, str]:
    metadata = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--metadata expects KEY=VALUE, got {item!r}")
        metadata[key] = value
    return metadata


def _check_args(args: argparse.Namespace) -> tuple[list[str], list[float], dict[str, str]]:
    if not 0 <= args.random_range_ratio < 1:
        raise ValueError(f"--random-range-ratio must be in [0, 1), got {args.random_range_ratio}")
    if args.request_rate <= 0:
        raise ValueError(f"--request-rate must be positive, got {args.request_rate}")
    if args.burstiness <= 0:
        raise ValueError(f"--burstiness must be positive, got {args.burstiness}")
    metrics = [m.strip() for m in args.percentile_metrics.split(",") if m.strip()]
    unknown = set(metrics) - set(METRIC_HEADERS)
    if unknown:
        raise ValueError(f"--percentile-metrics: unknown {sorted(unknown)}; use {list(METRIC_HEADERS)}")
    if models_of(args) and args.dataset_name == "multi_turn":
        raise ValueError("--lora-modules and several --model names apply to the random, prefix_repetition and "
                         "repeats datasets, not to multi_turn")
    if args.zipf_exponent <= 0:
        raise ValueError(f"--zipf-exponent must be positive, got {args.zipf_exponent}")
    percentiles = [float(p) for p in args.metric_percentiles.split(",") if p.strip()]
    if any(not 0 <= p <= 100 for p in percentiles):
        raise ValueError(f"--metric-percentiles must be in [0, 100], got {args.metric_percentiles}")
    return metrics, percentiles, _parse_metadata(args.metadata)


def models_of(args: argparse.Namespace) -> list[str]:
    """The names requests choose among (--lora-modules, else several --model names); [] for one."""
    names = [n for item in args.lora_modules for n in item.split(",") if n] or [
        n for n in args.model.split(",") if n]
    return names if args.lora_modules or len(names) > 1 else []


def per_model(results: Sequence[Any], models: Sequence[str], duration: float,
              percentiles: Sequence[float]) -> dict[str, dict[str, Any]]:
    """Each model's (adapter's) share of the run: its requests, throughput and TTFT."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(models):
        mine = [r for r, m in zip(results, models) if m == name]
        summary = summarize(mine, duration, ("ttft",), percentiles)
        out[name] = {k: summary[k] for k in summary if k in ("completed", "failed", "output_throughput")
                     or k.endswith("_ttft_ms")}
    return out


def format_per_model(breakdown: dict[str, dict[str, Any]], percentiles: Sequence[float]) -> str:
    tail = [f"p{p:g}_ttft_ms" for p in percentiles]
    header = f"{'model':<24} {'done':>6} {'failed':>6} {'out tok/s':>10} {'median TTFT ms':>15}" + "".join(
        f" {t.split('_')[0] + ' TTFT ms':>13}" for t in tail)
    rows = [header] + [
        f"{name:<24} {r['completed']:>6} {r['failed']:>6} {r['output_throughput']:>10.1f} "
        f"{r['median_ttft_ms']:>15.1f}" + "".join(f" {r.get(t, 0.0):>13.1f}" for t in tail)
        for name, r in breakdown.items()]
    return "\n".join(rows)


def workload(args: argparse.Namespace, n: int) -> list[BenchRequest]:
    """The ``n`` requests of ``--dataset-name``, fixed by ``--seed``."""
    rng = random.Random(args.seed)
    if args.dataset_name == "repeats":
        return repeats_requests(n, args.repeats_share, args.repeats_paraphrase_share, args.repeats_pairs,
                                args.random_output_len, rng)
    if args.dataset_name == "prefix_repetition":
        return prefix_repetition_requests(
            n, args.prefix_repetition_num_prefixes, args.prefix_repetition_prefix_len,
            args.prefix_repetition_suffix_len, args.prefix_repetition_output_len, rng,
            args.prefix_repetition_hot_share,
        )
    return random_requests(n, args.random_input_len, args.random_output_len, args.random_range_ratio,
                           rng, args.random_prefix_len, args.random_distinct_prompts)


def _to_proto(req: BenchRequest, request_id: str, args: argparse.Namespace) -> pb.GenerateRequest:
    msg = pb.GenerateRequest(
        prompt=req.prompt,
        max_tokens=req.output_len,
        temperature=args.temperature,
        ignore_eos=args.ignore_eos,
        skip_cache=not (args.allow_cache or args.cache),
        cache=args.cache or "",
        request_id=request_id,
        model=args.model,
    )
    if args.top_p is not None:
        msg.top_p = args.top_p
    if args.stream_interval is not None:
        msg.stream_interval = args.stream_interval
    return msg


def turn_opener(stubs: Sequence[Any], args: argparse.Namespace) -> OpenTurn:
    """Opens conversation turns as chat requests, spread over the channels' stubs."""
    turns = 0

    def open_turn(messages: list[pb.ChatMessage], request_id: str, output_len: int) -> OpenStream:
        nonlocal turns
        msg = _to_proto(BenchRequest("", 0, output_len), request_id, args)
        msg.ClearField("prompt")
        msg.messages.extend(messages)
        msg.user = request_id.rsplit("-t", 1)[0]  # the conversation: session-affinity's key
        turns += 1
        return partial(stubs[turns % len(stubs)].Generate, msg, timeout=args.timeout)

    return open_turn


def _result_path(args: argparse.Namespace, date: str) -> Path:
    if isinstance(args.save_result, str):
        name = args.save_result
    elif args.result_filename:
        name = args.result_filename
    else:
        concurrency = f"-concurrency{args.max_concurrency}" if args.max_concurrency else ""
        name = f"{args.label or 'meshserve'}-{args.service}-{args.request_rate}qps{concurrency}-{date}.json"
    return Path(args.result_dir or ".") / name


def _run_info(args: argparse.Namespace, num_channels: int, date: str) -> dict[str, Any]:
    """What was run, recorded next to the measurements."""
    return {
        "date": date,
        "target": args.target,
        "service": args.service,
        "label": args.label,
        "num_prompts": args.num_prompts,
        # JSON has no infinity.
        "request_rate": args.request_rate if math.isfinite(args.request_rate) else "inf",
        "burstiness": args.burstiness,
        "honor_retry_after": args.honor_retry_after,
        "max_concurrency": args.max_concurrency,
        "num_channels": num_channels,
        "dataset_name": args.dataset_name,
        **{k: getattr(args, k) for k in vars(args)
           if k.startswith(("prefix_repetition_", "multi_turn_")) and k.startswith(args.dataset_name)},
        "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len,
        "random_range_ratio": args.random_range_ratio,
        "random_prefix_len": args.random_prefix_len,
        "temperature": args.temperature,
        "ignore_eos": args.ignore_eos,
        "stream_interval": args.stream_interval,
        "skip_cache": not (args.allow_cache or args.cache),
        "cache": args.cache or "",
        "num_warmups": args.num_warmups,
        "seed": args.seed,
    }


async def run(args: argparse.Namespace) -> int:
    """The body of ``main``: connect, warm up, run the benchmark, print and save the result."""
    try:
        metrics, percentiles, metadata = _check_args(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2

    # 1. The workload, fixed by the seed; arrivals draw from their own stream so changing the
    #    rate does not change the prompts.
    conversations: list[Conversation] = []
    if args.dataset_name == "multi_turn":
        conversations = multi_turn_conversations(
            args.multi_turn_num_users, args.multi_turn_num_turns, args.multi_turn_system_prompt_len,
            args.multi_turn_question_len, args.multi_turn_output_len, random.Random(args.seed),
            args.multi_turn_user_history_len,
        )
        requests: list[BenchRequest] = []
        warmups: list[BenchRequest] = []
    else:
        requests = workload(args, args.num_prompts + args.num_warmups)
        warmups, requests = requests[: args.num_warmups], requests[args.num_warmups :]
    names = models_of(args)
    # Their own stream too: the same prompts whichever models they go to.
    models = model_choices(len(requests), names, args.lora_popularity, random.Random(f"models-{args.seed}"),
                           args.zipf_exponent) if names else []
    arrivals_rng = random.Random(f"arrivals-{args.seed}")
    offsets = arrival_offsets(len(requests), args.request_rate, arrivals_rng, args.burstiness)
    run_id = uuid.uuid4().hex[:8]

    # 2. Channels: separate connections, so no HTTP/2 connection carries more streams than a
    #    proxy allows on one.
    concurrency = len(conversations) or args.max_concurrency or args.num_prompts
    num_channels = args.num_channels or max(1, math.ceil(concurrency / STREAMS_PER_CHANNEL))
    channels = open_channels(args.target, num_channels)
    stub_cls = pb_grpc.InferenceStub if args.service == "inference" else pb_grpc.WorkerStub
    stubs = [stub_cls(ch) for ch in channels]

    def streams(requests: Sequence[BenchRequest], id_prefix: str,
                models: Sequence[str] = ()) -> list[tuple[OpenStream, int]]:
        out: list[tuple[OpenStream, int]] = []
        for i, r in enumerate(requests):
            msg, stub = _to_proto(r, f"{id_prefix}-{i}", args), stubs[i % num_channels]
            if models:
                msg.model = models[i]
            out.append((partial(stub.Generate, msg, timeout=args.timeout), r.prompt_len))
        return out

    try:
        try:
            connected = asyncio.gather(*(connect(ch) for ch in channels))
            await asyncio.wait_for(connected, timeout=min(args.timeout, 10))
        except (TimeoutError, ConnectionError):
            print(f"error: cannot connect to {args.target}", file=sys.stderr)
            return 1

        # 3. Warm-up, untimed.
        if warmups:
            print(f"Warming up with {len(warmups)} requests...", file=sys.stderr)
            warm, _ = await run_requests(
                streams(warmups, f"bench-{run_id}-warmup", names[:1] * len(warmups)), [0.0] * len(warmups),
                args.max_concurrency
            )
            failed = [r for r in warm if not r.success]
            if failed:
                print(f"warning: {len(failed)} warm-up requests failed, e.g. {failed[0].error_code}: "
                      f"{failed[0].error}", file=sys.stderr)  # fmt: skip

        # 4. The benchmark.
        print(f"Target: {args.target} ({args.service}), request rate: {args.request_rate}, "
              f"burstiness: {args.burstiness}, max concurrency: {args.max_concurrency}, "
              f"channels: {num_channels}", file=sys.stderr)  # fmt: skip
        from tqdm import tqdm

        total = sum(len(c.questions) for c in conversations) or len(requests)
        with tqdm(total=total, disable=args.disable_tqdm) as pbar:
            if conversations:
                results, duration = await run_conversations(
                    conversations, turn_opener(stubs, args), args.multi_turn_think_time,
                    lambda: pbar.update(1), f"bench-{run_id}", args.multi_turn_ramp_up,
                )
            else:
                results, duration = await run_requests(
                    streams(requests, f"bench-{run_id}", models), offsets, args.max_concurrency, lambda: pbar.update(1),
                    args.honor_retry_after,
                )
    finally:
        await asyncio.gather(*(ch.close() for ch in channels))

    # 5. Report.
    date = datetime.now().strftime("%Y%m%d-%H%M%S")
    result = summarize(results, duration, metrics, percentiles) | _run_info(args, num_channels, date)
    for key, value in metadata.items():
        if key in result:
            log.warning("--metadata %s would overwrite a recorded field; ignored", key)
        else:
            result[key] = value
    if models:
        result["per_model"] = per_model(results, models, duration, percentiles)
        result["lora_popularity"] = args.lora_popularity
    print(format_summary({**result, "request_rate": args.request_rate}, metrics, percentiles))
    if models:
        print(format_per_model(result["per_model"], percentiles))
    if result["completed"] == 0:
        print("error: every request failed", file=sys.stderr)
    if args.save_result or args.result_filename:
        path = _result_path(args, date)
        # With --plot the timings are kept, so that `meshserve plot` can draw this run again.
        save_result(result, path, detailed=args.save_detailed, timings=args.plot is not None)
        print(f"Result saved to {path}", file=sys.stderr)
    if args.plot:
        plot_runs([(args.label or args.plot.stem, result)], args.plot)
        print(f"Plot saved to {args.plot}", file=sys.stderr)
    return 0 if result["completed"] else 1
