"""The Worker gRPC service: one inference engine behind Generate (token stream), WatchLoad (live
load for the router) and Info."""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import itertools
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import grpc
from prometheus_client import REGISTRY, Counter, Gauge, Histogram

from meshserve.services import server as bootstrap
from meshserve.services import validation
from meshserve.services.config import WorkerConfig
from meshserve.services.offload import Offload
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.prompts import TemplateCall, chat_turns
from meshserve.services.request_record import RequestRecord, Timings
from meshserve.worker.engine import Chunker, Delta, Engine, LoraDisabled, LoraInfo, Request, UnknownModel
from meshserve.worker.kv_events import KvBatch, KvCacheView, KvWatcher
from meshserve.worker.session import Session

log = logging.getLogger(__name__)

# Engines by name, imported only when chosen (vLLM and torch are heavy imports).
ENGINES: dict[str, str] = {
    "vllm": "meshserve.worker.vllm_engine:VllmEngine",
    "sim": "meshserve.worker.sim_engine:SimEngine",
    "transformers": "meshserve.worker.hf_engine:TransformersEngine",
}

# Buckets of vLLM's own histograms of the same names.
TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0]
ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0]
E2E_BUCKETS = [0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0]


def make_engine(cfg: WorkerConfig) -> Engine:
    try:
        module, _, cls = ENGINES[cfg.engine].partition(":")
    except KeyError:
        raise ValueError(f"unknown engine {cfg.engine!r}; choose one of {sorted(ENGINES)}") from None
    for flag, kind, name in (("--tool-call-parser", "tool", cfg.tool_call_parser),
                             ("--reasoning-parser", "reasoning", cfg.reasoning_parser)):
        if name and cfg.engine != "vllm":
            raise ValueError(f"{flag} is vLLM's: the {cfg.engine!r} engine has no {kind} parsers")
    if cfg.enable_lora and cfg.engine == "transformers":
        raise ValueError("--enable-lora: the 'transformers' engine serves no LoRA adapters (the vllm and sim engines do)")
    return getattr(importlib.import_module(module), cls)(cfg)


def _metric(cls: type, name: str, doc: str, labels: list[str], **kw: Any) -> Any:
    """The collector ``name`` in the default registry, shared by every worker of this process.

    A ``vllm:`` collector of another shape (vLLM's own, left by an engine of a previous test)
    is replaced, as vLLM itself does when it starts.
    """
    existing = REGISTRY._names_to_collectors.get(name)  # noqa: SLF001 (no public lookup)
    if existing is not None:
        if type(existing) is cls and list(existing._labelnames) == labels:  # noqa: SLF001
            return existing
        REGISTRY.unregister(existing)
    return cls(name, doc, labels, **kw)


class WorkerMetrics:
    """Prometheus metrics of one worker, labelled with its id.

    Under the vllm engine vLLM exports the ``vllm:*`` metrics itself (its Prometheus stat
    logger is always on), so only the mesh's own counter is added.
    """

    def __init__(self, worker_id: str, engine: Engine, export_load_metrics: bool) -> None:
        self.requests = _metric(Counter, "meshserve_worker_requests_total",
                                "Generate requests finished by a worker, by finish reason",
                                ["worker", "finish_reason"]).labels
        self.adapter_requests = _metric(Counter, "meshserve_worker_adapter_requests_total",
                                        "Generate requests a worker took on each of its LoRA adapters",
                                        ["worker", "adapter"]).labels
        # Adapters brought into a slot (the sim's; brought up to date as requests end).
        self.adapter_loads = _metric(Counter, "meshserve_worker_adapter_loads_total",
                                     "LoRA adapters a worker brought into an adapter slot (loaded or swapped in)",
                                     ["worker", "adapter"]).labels
        self._adapter_loads_seen: dict[str, int] = {}
        self.worker_id = worker_id
        self._engine = engine
        self.timings = Timings()  # the vllm:* latency histograms, when this worker exports them
        self.preemptions: Any = None
        self._preemptions_seen = 0
        self.prefix_queries: Any = None
        self.prefix_hits: Any = None
        self.generation_tokens: Any = None
        if not export_load_metrics:
            return
        # vLLM's prefix-cache counters (prompt tokens asked for, and found cached), per request.
        self.prefix_queries = _metric(Counter, "vllm:prefix_cache_queries", "Prefix cache queries, in tokens",
                                      ["worker"]).labels(worker_id)
        self.prefix_hits = _metric(Counter, "vllm:prefix_cache_hits", "Prefix cache hits, in tokens",
                                   ["worker"]).labels(worker_id)
        load_gauges = [
            ("vllm:num_requests_running", "Requests in the running batch", lambda: engine.load().num_running),
            ("vllm:num_requests_waiting", "Requests waiting to run", lambda: engine.load().num_waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage, 1 means 100 percent",
             lambda: engine.load().kv_cache_usage),
        ]
        for name, doc, read in load_gauges:
            _metric(Gauge, name, doc, ["worker"]).labels(worker_id).set_function(read)
        self.generation_tokens = _metric(Counter, "vllm:generation_tokens", "Generated tokens",
                                         ["worker"]).labels(worker_id)
        if hasattr(engine, "num_preemptions"):  # the sim's KV pool preempts as vLLM's does
            self.preemptions = _metric(Counter, "vllm:num_preemptions",
                                       "Requests preempted because the KV cache was full (recomputed later)",
                                       ["worker"]).labels(worker_id)
        ttft = _metric(Histogram, "vllm:time_to_first_token_seconds", "Time to first token", ["worker"],
                       buckets=TTFT_BUCKETS).labels(worker_id)
        itl = _metric(Histogram, "vllm:inter_token_latency_seconds", "Inter-token latency", ["worker"],
                      buckets=ITL_BUCKETS).labels(worker_id)
        e2e = _metric(Histogram, "vllm:e2e_request_latency_seconds", "End-to-end request latency", ["worker"],
                      buckets=E2E_BUCKETS).labels(worker_id)
        tpot = _metric(Histogram, "vllm:request_time_per_output_token_seconds",
                       "Per request: decode time / (output tokens - 1)", ["worker"], buckets=ITL_BUCKETS).labels(worker_id)
        self.timings = Timings(ttft, itl, e2e, tpot)

    def finished(self, reason: str, last: Delta | None = None) -> None:
        self.requests(self.worker_id, reason).inc()
        for adapter, count in self._engine.adapter_loads().items():
            seen = self._adapter_loads_seen.get(adapter, 0)
            if count > seen:
                self.adapter_loads(self.worker_id, adapter).inc(count - seen)
                self._adapter_loads_seen[adapter] = count
        if self.prefix_queries is not None and last is not None:
            self.prefix_queries.inc(last.prompt_tokens)
            self.prefix_hits.inc(last.cached_prompt_tokens)
        if self.preemptions is not None:  # the engine's count, brought up to date as requests end
            count = self._engine.num_preemptions
            self.preemptions.inc(count - self._preemptions_seen)
            self._preemptions_seen = count

    def generated(self, tokens: int) -> None:
        if self.generation_tokens is not None:
            self.generation_tokens.inc(tokens)


def to_engine_request(req: pb.GenerateRequest, min_stream_interval: int = 1, adapter: str | None = None) -> Request:
    """The engine's view of ``req``, on the LoRA ``adapter`` (None: the base model); its stream
    interval is at least the worker's (as vLLM's)."""
    return Request(
        request_id=req.request_id or uuid.uuid4().hex,
        prompt=req.prompt or None,
        messages=chat_turns(req.messages) or None,
        max_tokens=validation.max_tokens(req),
        temperature=validation.temperature(req),
        top_p=validation.top_p(req),
        seed=req.seed if req.HasField("seed") else None,
        stop=list(req.stop),
        ignore_eos=req.ignore_eos,
        stream_interval=max(req.stream_interval if req.HasField("stream_interval") else 1, min_stream_interval),
        continue_token_ids=list(req.continue_token_ids),
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        repetition_penalty=validation.repetition_penalty(req),
        top_k=max(req.top_k, 0),
        min_p=req.min_p,
        min_tokens=req.min_tokens,
        stop_token_ids=list(req.stop_token_ids),
        logit_bias=dict(req.logit_bias),
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=validation.skip_special_tokens(req),
        logprobs=req.logprobs if req.HasField("logprobs") else None,
        structured_outputs=structured_outputs(req),
        tools=json.loads(req.tools) if req.tools else None,
        chat_template_kwargs=validation.template_kwargs(req),
        include_reasoning=req.include_reasoning if req.HasField("include_reasoning") else True,
        template_call=TemplateCall(validation.add_generation_prompt(req), req.continue_final_message),
        parse_tool_calls=req.parse_tool_calls,
        priority=req.priority,
        adapter=adapter,
    )


def lora_to_pb(lora: LoraInfo | None) -> pb.LoraConfig | None:
    """The engine's LoRA settings as WorkerInfo.lora (None: LoRA off, the field unset)."""
    if lora is None:
        return None
    return pb.LoraConfig(adapters=[pb.LoraAdapter(name=name, path=path) for name, path in lora.adapters.items()],
                         max_loras=lora.max_loras, max_lora_rank=lora.max_lora_rank, max_cpu_loras=lora.max_cpu_loras)


def structured_outputs(req: pb.GenerateRequest) -> dict[str, Any] | None:
    """The request's constraint as vLLM's StructuredOutputsParams fields; None if it has none."""
    if not req.HasField("structured_outputs"):
        return None
    so = req.structured_outputs
    kind = so.WhichOneof("kind")
    return {"choice": list(so.choice.values)} if kind == "choice" else {kind: getattr(so, kind)}


class WorkerServicer(pb_grpc.WorkerServicer):
    """Thin: validates, converts proto <-> engine types, counts what is in flight."""

    def __init__(self, cfg: WorkerConfig, engine: Engine) -> None:
        self.cfg = cfg
        self.engine = engine
        self.worker_id = cfg.worker_id or f"{cfg.host}:{cfg.port}"
        self.metrics: WorkerMetrics | None = None
        self.in_flight = 0
        self.requests_received = 0
        self.draining = False
        self._sequence = itertools.count(1)
        self._sessions: set[Session] = set()
        self._kv_sequence = itertools.count(1)
        self._stopping = asyncio.Event()  # set at drain: the KV-event streams end
        self._offload = Offload("worker-checks")

    def bind(self, port: int) -> None:
        """Called once the server listens: fixes the worker id and the metric labels."""
        self.worker_id = self.cfg.worker_id or f"{self.cfg.host}:{port}"
        exports_own = self.cfg.engine == "vllm"  # vLLM exports the vllm:* metrics itself
        self.metrics = WorkerMetrics(self.worker_id, self.engine, export_load_metrics=not exports_own)

    async def drain(self) -> None:
        self.draining = True
        self._stopping.set()
        self.engine.load_signal.notify()
        for session in self._sessions:
            session.wake()  # an idle session ends now

    async def close(self) -> None:
        self._offload.close()

    def _in_flight_changed(self, delta: int) -> None:
        self.in_flight += delta
        self.engine.load_signal.notify()

    async def Generate(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[pb.GenerateResponse]:
        self.requests_received += 1  # refused ones too: the router's pick has arrived either way
        if request.lora_path and request.model:  # an adapter of the gateway's registry: loaded on first use
            await self._ensure_adapter(request.model, request.lora_path, context)
        try:  # a large request (a long prompt, a JSON schema) is checked off the event loop
            req = await self._offload.run(validation.check_cost(request), self._engine_request, request)
        except UnknownModel as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e), validation.param_metadata(e.param))
        except validation.InvalidRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e), validation.param_metadata(e.param))
        if self.draining:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"worker {self.worker_id} is draining")
        if self.in_flight >= self.cfg.max_queue:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"worker {self.worker_id} is full ({self.in_flight} requests, max_queue "
                f"{self.cfg.max_queue}); retry later or elsewhere",
            )
        if req.adapter is not None and self.metrics is not None:
            self.metrics.adapter_requests(self.worker_id, req.adapter).inc()
        self._in_flight_changed(+1)
        try:
            async for chunk in self._stream(req):
                yield chunk
        except UnknownModel as e:  # an adapter the engine lost (or never had)
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e), validation.param_metadata(e.param))
        except validation.InvalidRequest as e:  # found by the engine (prompt too long, token ids, ...)
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e), validation.param_metadata(e.param))
        except (asyncio.CancelledError, GeneratorExit, grpc.aio.AbortError):
            raise
        except Exception as e:
            await context.abort(grpc.StatusCode.INTERNAL, f"worker {self.worker_id}: engine failed: {e}")
        finally:
            self._in_flight_changed(-1)

    async def Session(self, request_iterator: AsyncIterator[pb.SessionRequest],
                      context: grpc.aio.ServicerContext) -> None:
        """Many Generate requests over one stream (the gateway's path; worker/session.py)."""
        task = asyncio.current_task()
        if task is not None:  # the call ended (the gateway went away): stop its requests too
            context.add_done_callback(lambda _: task.cancel())
        session = Session(self.Generate, ended=lambda: self.draining)
        self._sessions.add(session)
        try:
            await session.serve(request_iterator, context)
        finally:
            self._sessions.discard(session)

    def _engine_request(self, request: pb.GenerateRequest) -> Request:
        """The engine's view of ``request``, once checked; InvalidRequest if it is not one to serve
        (UnknownModel if it names a model or adapter this engine does not serve)."""
        validation.validate(request, max_model_len=self.engine.info.max_model_len)
        self._check_tool_parsing(request)
        adapter = self.engine.info.adapter(request.model)
        return to_engine_request(request, self.cfg.stream_interval, adapter)

    def _check_tool_parsing(self, request: pb.GenerateRequest) -> None:
        if not request.parse_tool_calls:
            return
        if not self.engine.info.tool_call_parser:
            raise validation.InvalidRequest(
                f"'tool_choice' \"auto\" needs a tool-call parser, and worker {self.worker_id} has none: start the "
                "workers with --tool-call-parser NAME (vLLM's parsers, e.g. hermes, llama3_json, pythonic; "
                "the vllm engine), or name the function to call, or use \"required\"", param="tool_choice")
        if request.continue_token_ids:
            raise validation.InvalidRequest("'parse_tool_calls' cannot continue a stream another worker began "
                                            "(its parser's state stayed there)", param="parse_tool_calls")

    async def _stream(self, req: Request) -> AsyncIterator[pb.GenerateResponse]:
        metrics = self.metrics
        assert metrics is not None, "bind() not called"
        record = RequestRecord(req.request_id, metrics.timings)  # on this call's span (services.server)
        record.worker = self.worker_id
        last_delta: Delta | None = None
        chunks = Chunker(req.stream_interval)
        status, level = "OK", logging.INFO
        try:
            async with contextlib.aclosing(self.engine.generate(req)) as stream:
                async for delta in stream:
                    if delta.token_ids:
                        metrics.generated(len(delta.token_ids))
                        record.output(len(delta.token_ids))
                    if (chunk := chunks.add(delta)) is not None:
                        yield self._to_pb(req.request_id, chunk)
                    last_delta = delta
            if (chunk := chunks.rest()) is not None:  # the engine stopped without a finish reason
                yield self._to_pb(req.request_id, chunk)
        except validation.InvalidRequest as e:
            metrics.finished("rejected")
            status, detail = "INVALID_ARGUMENT", str(e)
            raise
        except (asyncio.CancelledError, GeneratorExit):
            metrics.finished("abort")
            status, detail = "CANCELLED", "aborted by the client"
            raise
        except Exception as e:
            metrics.finished("error")
            log.exception("request %s failed", req.request_id)
            status, detail, level = "INTERNAL", f"{type(e).__name__}: {e}", logging.ERROR
            raise
        else:
            detail = (last_delta.finish_reason if last_delta else None) or "abort"
            metrics.finished(detail, last_delta)
        finally:
            if last_delta is not None:
                record.prompt_tokens = last_delta.prompt_tokens
            record.finish(log, status, detail, level, finish_reason=detail if status == "OK" else "",
                          prompt_tokens=record.prompt_tokens,
                          cached_prompt_tokens=last_delta.cached_prompt_tokens if last_delta else 0)

    def _to_pb(self, request_id: str, delta: Delta) -> pb.GenerateResponse:
        chunk = pb.GenerateResponse(request_id=request_id, text=delta.text, token_ids=delta.token_ids,
                                    worker=self.worker_id)
        if delta.reasoning:  # a reasoning parser's: most chunks have none
            chunk.reasoning = delta.reasoning
        for call in delta.tool_calls:
            chunk.tool_calls.add(index=call.index, id=call.id, name=call.name, arguments=call.arguments)
        for lp in delta.logprobs or ():
            chunk.logprobs.add(token_id=lp.token_id, token=lp.token, logprob=lp.logprob,
                               top=[pb.TopLogprob(token_id=t, token=text, logprob=v) for t, text, v in lp.top])
        if delta.finish_reason is not None:
            chunk.finish_reason = delta.finish_reason
            chunk.usage.CopyFrom(pb.Usage(prompt_tokens=delta.prompt_tokens,
                                          completion_tokens=delta.completion_tokens,
                                          cached_prompt_tokens=delta.cached_prompt_tokens,
                                          reasoning_tokens=delta.reasoning_tokens))
        return chunk

    def load_report(self) -> pb.LoadReport:
        load = self.engine.load()
        return pb.LoadReport(
            worker_id=self.worker_id,
            num_running=load.num_running,
            num_waiting=load.num_waiting,
            kv_cache_usage=load.kv_cache_usage,
            prefix_cache_hit_rate=load.prefix_cache_hit_rate,
            max_num_seqs=self.engine.info.max_num_seqs,
            draining=self.draining,
            sequence=next(self._sequence),
            num_in_flight=self.in_flight,
            requests_received=self.requests_received,
            active_adapters=load.active_adapters,
            running_adapters=load.running_adapters,
            waiting_adapters=load.waiting_adapters,
        )

    async def WatchLoad(self, request: pb.WatchLoadRequest, context: grpc.aio.ServicerContext
                        ) -> AsyncIterator[pb.LoadReport]:
        """Pushes a report when the load changes, at most one per minimum report interval (the
        changes of each interval go out together) and at least one per report interval (both at
        least the caller's ``min_interval_s``). With
        ``kv_events`` each report also carries the engine's prefix-cache changes since the one
        before (the first: the whole cache). While draining it keeps reporting until the last
        stream is done, then ends."""
        view = self.engine.kv_cache if request.kv_events else None
        # A caller may ask for fewer reports (a router of many workers), never for more.
        min_gap = max(min(self.cfg.load_report_min_interval_s, self.cfg.load_report_interval_s),
                      request.min_interval_s)
        longest_gap = max(self.cfg.load_report_interval_s, min_gap)
        adapters_sent = -1  # the engine's adapters_version this stream last sent (-1: none yet)
        with self.engine.load_signal.subscribe() as changed:
            kv = view.subscribe(changed) if view is not None else None
            try:
                while True:
                    changed.clear()
                    reports = self._load_reports(view, kv)
                    if adapters_sent != self.engine.adapters_version:  # first, or the adapters changed
                        adapters_sent = self.engine.adapters_version
                        if (lora := lora_to_pb(self.engine.info.lora)) is not None:
                            reports[0].lora.CopyFrom(lora)
                    for report in reports:
                        yield report
                    if self.draining and self.in_flight == 0:
                        return
                    await asyncio.sleep(min_gap)  # what changes meanwhile goes in the next report
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(longest_gap - min_gap):
                            await changed.wait()
            finally:
                if view is not None and kv is not None:
                    view.unsubscribe(kv)

    def _load_reports(self, view: KvCacheView | None, kv: KvWatcher | None) -> list[pb.LoadReport]:
        """The reports to send now: one, or one per message of KV events (a large snapshot)."""
        if view is None or kv is None:
            return [self.load_report()]
        reports = []
        for batch in view.take(kv) or [None]:
            report = self.load_report()
            if batch is not None:
                report.kv.CopyFrom(self._kv_message(batch, view.block_size))
            reports.append(report)
        return reports

    def _kv_message(self, batch: KvBatch, block_size: int) -> pb.KvEvents:
        return pb.KvEvents(reset=batch.reset, stored=batch.stored, removed=batch.removed,
                           block_size=block_size, sequence=next(self._kv_sequence))

    async def LoadLoraAdapter(self, request: pb.LoadLoraAdapterRequest, context: grpc.aio.ServicerContext
                              ) -> pb.LoraAdapterResponse:
        name = request.lora_name
        await self._change_adapters(self.engine.load_adapter(name, request.lora_path), context)
        return pb.LoraAdapterResponse(message=f"Success: LoRA adapter '{name}' added successfully.",
                                      workers=[self.worker_id])

    async def UnloadLoraAdapter(self, request: pb.UnloadLoraAdapterRequest, context: grpc.aio.ServicerContext
                                ) -> pb.LoraAdapterResponse:
        name = request.lora_name
        if not name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "'lora_name' needs to be provided to unload a LoRA adapter.")
        await self._change_adapters(self.engine.unload_adapter(name), context)
        return pb.LoraAdapterResponse(message=f"Success: LoRA adapter '{name}' removed successfully.",
                                      workers=[self.worker_id])

    async def _ensure_adapter(self, name: str, path: str, context: grpc.aio.ServicerContext) -> None:
        try:
            await self.engine.ensure_adapter(name, path)
        except validation.InvalidRequest as e:  # the request's model is at fault, not a field it set
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the LoRA adapter {name!r} cannot be loaded: {e}",
                                validation.param_metadata("model"))
        except LoraDisabled as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"worker {self.worker_id}: {e}")

    async def _change_adapters(self, change: Awaitable[None], context: grpc.aio.ServicerContext) -> None:
        """Runs an adapter change of the engine; its refusals as vLLM's statuses."""
        try:
            await change
        except UnknownModel as e:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(e), validation.param_metadata(e.param))
        except validation.InvalidRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e), validation.param_metadata(e.param))
        except LoraDisabled as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"worker {self.worker_id}: {e}")

    async def Info(self, request: pb.InfoRequest, context: grpc.aio.ServicerContext) -> pb.WorkerInfo:
        info = self.engine.info
        return pb.WorkerInfo(
            worker_id=self.worker_id, engine=info.engine, model=info.model,
            tensor_parallel_size=info.tensor_parallel_size, max_model_len=info.max_model_len,
            block_size=info.block_size, max_num_seqs=info.max_num_seqs,
            tokenizer=info.tokenizer, kv_events=self.engine.kv_cache is not None,
            tool_call_parser=info.tool_call_parser, weights_id=info.weights_id, reasoning_parser=info.reasoning_parser,
            lora=lora_to_pb(info.lora),
        )

    async def Tokenize(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> pb.TokenizeResponse:
        try:
            if not request.prompt and not request.messages:
                raise validation.InvalidRequest("'prompt' is empty: give a prompt or chat 'messages'", param="prompt")
            validation.check_template(request)  # what Generate's validation checks of the template's call
            tokens = await asyncio.to_thread(self.engine.tokenize, to_engine_request(request))
        except validation.InvalidRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e), validation.param_metadata(e.param))
        return pb.TokenizeResponse(count=len(tokens), max_model_len=self.engine.info.max_model_len, tokens=tokens)

    async def Detokenize(self, request: pb.DetokenizeRequest, context: grpc.aio.ServicerContext
                         ) -> pb.DetokenizeResponse:
        try:
            return pb.DetokenizeResponse(prompt=await asyncio.to_thread(self.engine.detokenize, list(request.tokens)))
        except validation.InvalidRequest as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e), validation.param_metadata(e.param))
            raise  # unreachable: abort raises

    async def WatchKvEvents(self, request: pb.WatchKvEventsRequest, context: grpc.aio.ServicerContext
                            ) -> AsyncIterator[pb.KvEvents]:
        """The engine's whole prefix cache (reset), then its changes; ends when the worker drains
        (a draining worker takes no new requests, so the router may forget what it holds)."""
        view = self.engine.kv_cache
        if view is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                f"the {self.engine.info.engine} engine reports no KV-cache events")
            return
        batches = view.watch()
        stopping = asyncio.ensure_future(self._stopping.wait())
        following: asyncio.Future[Any] | None = None
        try:
            while True:
                following = asyncio.ensure_future(anext(batches))
                await asyncio.wait((following, stopping), return_when=asyncio.FIRST_COMPLETED)
                if not following.done():
                    return  # draining
                yield self._kv_message(following.result(), view.block_size)
        finally:
            stopping.cancel()
            if following is not None and not following.done():
                following.cancel()  # the generator is inside anext: let it finish first
                await asyncio.gather(following, return_exceptions=True)
            await batches.aclose()


async def start_worker(cfg: WorkerConfig, engine: Engine | None = None
                       ) -> tuple[bootstrap.Running, WorkerServicer]:
    """Starts the engine (or uses ``engine``, already started), then serves it. Shutting the
    returned server down drains it and closes the engine."""
    if engine is None:
        engine = make_engine(cfg)
        await engine.start()
    servicer = WorkerServicer(cfg, engine)

    def register(server: grpc.aio.Server) -> list[str]:
        pb_grpc.add_WorkerServicer_to_server(servicer, server)
        return [pb.DESCRIPTOR.services_by_name["Worker"].full_name]

    lifecycle = bootstrap.Lifecycle(on_drain=[servicer.drain], on_close=[engine.close, servicer.close])
    if cfg.port:
        servicer.bind(cfg.port)
    try:
        running = await bootstrap.start(f"worker[{cfg.engine}]", cfg, register, lifecycle)
    except BaseException:
        await engine.close()
        raise
    if not cfg.port:
        servicer.bind(running.port)  # no client can know the port before this
    return running, servicer


async def main(cfg: WorkerConfig) -> None:
    """Runs a worker until SIGTERM or SIGINT, then drains it and stops the engine. It starts with
    ``start_worker``, not ``bootstrap.serve``: the default worker id is host:port, known only
    once the server listens (port 0)."""
    running, servicer = await start_worker(cfg)
    await bootstrap.run_until_signal(f"worker {servicer.worker_id}", running)
