"""The Router gRPC service: answers Pick (one call) and Picks (a stream of them, the gateway's
path) from the live view of every worker (their WatchLoad streams plus the picks they have not
reported yet) with the configured policy."""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import grpc
import prometheus_client
from lightkube import KubeConfig
from opentelemetry import trace

from meshserve.router.discovery import EndpointSliceDiscovery, api_client, own_namespace
from meshserve.router.fleet_feed import FleetFeed, worker_state
from meshserve.router.kv_index import HeldBlocks, KvIndex
from meshserve.router.policies import Choice, NoWorker, PickContext, Policy, build_policy
from meshserve.router.prefix import PromptBlocks, PromptHasher
from meshserve.router.state import Fleet, WorkerTable, WorkerView
from meshserve.router.watcher import Watcher
from meshserve.services import server as bootstrap
from meshserve.services import telemetry
from meshserve.services.config import RouterConfig, RoutingConfig, ServerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.mesh_tls import MeshTls

log = logging.getLogger(__name__)

PICKS = prometheus_client.Counter(
    "meshserve_router_picks_total",
    "Workers picked, by worker and reason (the policy; 'retry' when the caller excluded workers; "
    "'late' when no worker had reported on time and a late one was picked)",
    ["worker", "reason"],
)


@functools.lru_cache(maxsize=4096)
def _picks_counter(worker_id: str, reason: str) -> Any:
    """PICKS' child for a worker and reason (a label lookup per pick costs ~8 us; this, a dict hit)."""
    return PICKS.labels(worker=worker_id, reason=reason)


NO_WORKER = prometheus_client.Counter(
    "meshserve_router_no_worker_total", "Picks refused because no worker was eligible"
)
PICK_SECONDS = prometheus_client.Histogram(
    "meshserve_router_pick_seconds", "Time to choose a worker (tokenizing and matching included)",
    buckets=[0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1],
)
PREDICTED_CACHED = prometheus_client.Counter(
    "meshserve_router_predicted_cached_tokens_total",
    "Prompt tokens the router expected the chosen workers to find in their prefix caches "
    "(compare with the workers' vllm:prefix_cache_hits_total)",
)
PREFIX_READY = prometheus_client.Gauge(
    "meshserve_router_prefix_view_ready",
    "1 once the router hashes prompts with the workers' tokenizers (every one a worker reported "
    "loaded, or found unloadable: that model's prefix policies use the prompt's text hash); 0 "
    "before (loading one, or no worker yet) or when it can load none",
)
INDEX_BLOCKS = prometheus_client.Gauge(
    "meshserve_router_kv_index_blocks", "Distinct KV blocks in the router's index, by view", ["view"]
)


SHED = prometheus_client.Counter(
    "meshserve_router_picks_shed_total",
    "Picks not worked out because their asker had stopped waiting (deadline_unix_ms) when the "
    "router read them: a router behind catches up instead of answering seconds late",
)


class _Late(Exception):
    def __str__(self) -> str:
        return "the pick's deadline had passed when the router read it; not worked out"


@dataclass(frozen=True)
class Pick:
    """A pick: the choice, its reason label and the prompt tokens it expects cached."""

    choice: Choice
    reason: str
    predicted_cached_tokens: int = 0


class Router:
    """Picks workers: a policy over snapshots of the worker table, counting each pick against
    the worker until its load reports show the request arrived (or the pick expires). Prefix
    policies also read a KV index: ``kv`` (the workers' KV events) or ``approx`` (the router's
    own record of the prompts it sent)."""

    def __init__(
        self,
        table: WorkerTable,
        policy: Policy,
        stale_after_s: float,
        rng: random.Random | None = None,
        approx_blocks_per_worker: int = 30000,
        kv_pending_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.table = table
        self.policy = policy
        self.stale_after_s = stale_after_s
        self.prefix = PromptBlocks()
        self.kv = KvIndex()
        self.approx = KvIndex()
        # kv-aware: the prompts it sent in the last kv_pending_s, whose blocks the engines have
        # not reported yet (events follow the prefill), so a burst sharing a prefix meets too.
        self.pending = KvIndex()
        self._approx_keep = approx_blocks_per_worker
        self._pending_s = kv_pending_s
        self._clock = clock
        self._next_expiry = 0.0
        self._rng = rng or random.Random()
        PREFIX_READY.set_function(lambda: float(self.prefix.ready))
        INDEX_BLOCKS.labels(view="kv").set_function(lambda: len(self.kv))
        INDEX_BLOCKS.labels(view="approx").set_function(lambda: len(self.approx))
        INDEX_BLOCKS.labels(view="pending").set_function(lambda: len(self.pending))

    def pick(self, ctx: PickContext, messages: Sequence[Mapping[str, str]] | None = None,
             hashes: tuple[int, ...] | None = None) -> Pick:
        """Chooses a worker for ``ctx`` (``messages``: a chat request's turns; ``hashes``: its
        prompt's blocks, when they were hashed before, off the loop); raises NoWorker."""
        started = time.perf_counter()
        view = self.policy.prefix_view
        now = self._clock()
        known: dict[str, Any] = {"now": self.table.now()}  # the time the workers' reports are on
        fleet = self.table.fleet()
        block_size = 0  # of the prompt's blocks, once hashed
        if view and not _choices(fleet, ctx.exclude):
            # One worker to choose from: the prompt's blocks would change nothing. Not worked out
            # (no tokenizing, not even the text hash), no cached tokens predicted.
            known.update(block_hashes=(), cached_blocks={})
        elif view and (hasher := self.prefix.hasher(ctx.model)) is not None:
            # Hashed as the engines of the request's base model hash it; an adapter's blocks on
            # its own chain (vLLM hashes the adapter into them).
            if hashes is None:
                hashes = hasher.chain(ctx.prompt if not messages else "", messages, ctx.adapter)
            block_size = hasher.block_size
            known.update(block_hashes=hashes, cached_blocks=self._cached(view, hashes, now, fleet.rows))
        ctx = replace(ctx, **known)
        try:
            choice = self.policy.pick(ctx, fleet, self._rng)
        except NoWorker:
            NO_WORKER.inc()
            raise
        address = choice.worker.address
        self.table.on_assigned(address, ctx.adapter)
        if view == "approx" and ctx.block_hashes:
            self.approx.stored(address, ctx.block_hashes)
            self.approx.evict_oldest(address, self._approx_keep)
        elif view == "kv" and ctx.block_hashes:
            self.pending.stored(address, ctx.block_hashes, at=now)
        reason = "retry" if ctx.exclude else self.policy.name
        if not choice.worker.is_healthy(self.stale_after_s, ctx.now):
            reason = "late"  # no worker was fresh: the last resort (HealthyFilter)
        _picks_counter(choice.worker.worker_id, reason).inc()
        predicted = 0
        if ctx.cached_blocks:
            predicted = ctx.cached_blocks.get(address, 0) * block_size
            PREDICTED_CACHED.inc(predicted)
        PICK_SECONDS.observe(time.perf_counter() - started)
        return Pick(choice, reason, predicted)

    def _cached(self, view: str, hashes: Sequence[int], now: float, rows: Mapping[str, int]) -> HeldBlocks:
        """Leading blocks of ``hashes`` each worker (of ``rows``) holds, in the policy's view."""
        if view == "approx":
            return self.approx.held(hashes, rows)
        if now >= self._next_expiry:
            self.pending.expire(now - self._pending_s)
            self._next_expiry = now + min(1.0, self._pending_s / 4)
        return self.kv.held(hashes, rows).most(self.pending.held(hashes, rows))

    def workers(self) -> list[tuple[WorkerView, bool]]:
        """Every worker's view, and whether it is healthy now."""
        now = self.table.now()
        return [(w, w.is_healthy(self.stale_after_s, now)) for w in self.table.snapshot()]

    def forget(self, address: str) -> None:
        """Forgets a worker that left: its view, its unsettled picks and the router's own record of
        the prompts it sent there (its blocks in ``kv`` went when its watcher stopped)."""
        self.table.remove(address)
        self.approx.drop(address)
        self.pending.drop(address)


def _choices(fleet: Fleet, exclude: frozenset[str]) -> bool:
    """Whether more than one of ``fleet``'s workers is not excluded."""
    if len(fleet.views) > 1 + len(exclude):
        return True
    return sum(view.worker_id not in exclude for view in fleet.views) > 1


async def set_workers(router: Router, watcher: Watcher, addresses: Iterable[str]) -> None:
    """Makes ``addresses`` the router's workers, all of them (discovery calls it on every change;
    the same set again changes nothing): new ones are watched, gone ones forgotten."""
    wanted = dict.fromkeys(addresses)
    for address in router.table.addresses():
        if address not in wanted:
            await watcher.remove(address)  # first: its streams stop writing to the table
            router.forget(address)
            log.info("worker %s removed", address)
    known = set(router.table.addresses())
    for address in wanted:
        if address not in known:
            router.table.add(address)
            watcher.add(address)
            log.info("worker %s added", address)


SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Router"].full_name
PICKS_SPAN_ATTRIBUTES = {"rpc.system": "grpc", "rpc.method": "/meshserve.v1.Router/Picks"}


class RouterServicer(pb_grpc.RouterServicer):
    """Converts protobuf to and from the Router's plain types."""

    def __init__(self, router: Router, feed: FleetFeed) -> None:
        self._router = router
        self._feed = feed

    async def Pick(self, request: pb.PickRequest, context: grpc.aio.ServicerContext) -> pb.PickResponse:
        try:
            return self._answer(request, await self.hashes(request))
        except NoWorker as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))
            raise  # not reached: abort raises

    async def Picks(self, request_iterator: AsyncIterator[pb.PickRequest],
                    context: grpc.aio.ServicerContext) -> None:
        """Pick for each request of the stream, answering in order; each pick has its own
        "Router/Pick" span in the request's trace, as a Pick call would."""
        async for request in request_iterator:
            await context.write(self.answer(request))

    async def PickBatches(self, request_iterator: AsyncIterator[pb.PickBatch],
                          context: grpc.aio.ServicerContext) -> None:
        """The gateway's path: each batch of picks answered with one message, in order; a pick
        whose large prompt is hashed off the loop, once hashed, in a message of its own (the
        gateway finds each answer by its pick_id)."""
        writing = asyncio.Lock()  # grpc.aio: one write at a time
        later: set[asyncio.Task[None]] = set()

        async def answer_later(request: pb.PickRequest) -> None:
            answer = await self.answer_off_loop(request)
            async with writing:
                await context.write(pb.PickBatchResponse(answers=[answer]))

        try:
            async for batch in request_iterator:
                now = []
                for request in batch.picks:
                    if self._off_loop(request) is not None:
                        task = asyncio.create_task(answer_later(request))
                        later.add(task)
                        task.add_done_callback(later.discard)
                    else:
                        now.append(self.answer(request))
                if now:
                    async with writing:
                        await context.write(pb.PickBatchResponse(answers=now))
            await asyncio.gather(*later)
        finally:
            for task in later:
                task.cancel()

    def _off_loop(self, request: pb.PickRequest) -> PromptHasher | None:
        """The hasher of ``request``'s model when its prompt is hashed off the loop before its pick."""
        prefix = self._router.prefix
        if not self._router.policy.prefix_view or not prefix.large(
                len(request.prompt) + sum(len(m.content) for m in request.messages)):
            return None
        return prefix.hasher(request.model)

    async def hashes(self, request: pb.PickRequest) -> tuple[int, ...] | None:
        """The blocks of ``request``'s prompt hashed off the loop when it is large (None: the pick
        hashes a small one itself, or needs none)."""
        hasher = self._off_loop(request)
        if hasher is None:
            return None
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        prompt = request.prompt if not messages else ""
        return await hasher.chain_off_loop(prompt, messages or None, request.adapter)

    async def answer_off_loop(self, request: pb.PickRequest, embedded: bool = False) -> pb.PickResponse:
        """``answer``, with a large prompt hashed off the event loop first."""
        return self.answer(request, embedded, await self.hashes(request))

    def answer(self, request: pb.PickRequest, embedded: bool = False,
               hashes: tuple[int, ...] | None = None) -> pb.PickResponse:
        """The answer to one pick of a stream (a refusal as an answer, not a status), in a SERVER
        span of its own when the router exports spans; with ``embedded`` (a gateway picking in its
        own process) on the span that is current, the gateway's own "router pick"."""
        if embedded:
            return self._answer_or_refusal(request, trace.get_current_span(), hashes)
        if not telemetry.exporting():  # a span nobody would see
            return self._answer_or_refusal(request, trace.INVALID_SPAN, hashes)
        parent = telemetry.incoming_context(request.trace_context.items())
        with telemetry.server_span("Router/Pick", parent, PICKS_SPAN_ATTRIBUTES) as span:
            return self._answer_or_refusal(request, span, hashes)

    def _answer_or_refusal(self, request: pb.PickRequest, span: trace.Span,
                           hashes: tuple[int, ...] | None = None) -> pb.PickResponse:
        try:
            if request.deadline_unix_ms and time.time() * 1000 > request.deadline_unix_ms:
                raise _Late()
            answer = self._answer(request, hashes)
        except (NoWorker, _Late) as e:
            code = grpc.StatusCode.DEADLINE_EXCEEDED if isinstance(e, _Late) else grpc.StatusCode.UNAVAILABLE
            if isinstance(e, _Late):
                SHED.inc()
            span.set_status(trace.Status(trace.StatusCode.ERROR, f"{code.name}: {e}"))
            answer = pb.PickResponse(error_code=code.value[0], error_message=str(e))
        answer.pick_id = request.pick_id
        return answer

    def _answer(self, request: pb.PickRequest, hashes: tuple[int, ...] | None = None) -> pb.PickResponse:
        """The pick for ``request``, logged and on the current span; raises NoWorker."""
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        ctx = PickContext(
            request_id=request.request_id,
            prompt=request.prompt or "\n".join(f"{m['role']}: {m['content']}" for m in messages),
            first_user=next((m["content"] for m in messages if m["role"] == "user"), ""),
            exclude=frozenset(request.exclude),
            session_key=request.session_key,
            adapter=request.adapter,
            adapter_loadable=request.adapter_loadable,
            model=request.model,
        )
        try:
            pick = self._router.pick(ctx, messages or None, hashes)
        except NoWorker as e:
            log.warning("request %s: %s (excluded: %s)", request.request_id, e, sorted(ctx.exclude) or "none")
            raise
        choice, reason = pick.choice, pick.reason
        worker = choice.worker
        log.debug(  # the same on the pick's span; a line per pick costs ~30 us at INFO
            "request %s -> %s (%s, score %.2f of %d candidates, outstanding %d, cached %d tokens)",
            request.request_id, worker.worker_id, reason, choice.score, choice.num_candidates,
            worker.outstanding, pick.predicted_cached_tokens,
        )
        detail = (
            f"{reason}: score {choice.score:.2f} of {choice.num_candidates} candidates, "
            f"outstanding {worker.outstanding}, cached {pick.predicted_cached_tokens} tokens"
        )
        # The span of this call (tracing interceptor in services.server): the choice and why.
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attributes({
                "meshserve.request_id": request.request_id,
                "meshserve.worker": worker.worker_id,
                "meshserve.router.policy": self._router.policy.name,
                "meshserve.router.reason": reason,
                "meshserve.router.score": choice.score,
                "meshserve.router.candidates": choice.num_candidates,
                "meshserve.router.outstanding": worker.outstanding,
                "meshserve.router.excluded": len(ctx.exclude),
                "meshserve.router.predicted_cached_tokens": pick.predicted_cached_tokens,
                **{f"meshserve.router.score.{name}": score for name, score in choice.scores.items()},
            })
        return pb.PickResponse(worker_id=worker.worker_id, address=worker.address, reason=detail,
                               predicted_cached_tokens=pick.predicted_cached_tokens)

    async def ListWorkers(
        self, request: pb.ListWorkersRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListWorkersResponse:
        return self.listing()

    def listing(self) -> pb.ListWorkersResponse:
        return pb.ListWorkersResponse(workers=[worker_state(w, healthy) for w, healthy in self._router.workers()])

    async def WatchFleet(self, request: pb.WatchFleetRequest, context: grpc.aio.ServicerContext
                         ) -> AsyncIterator[pb.FleetUpdate]:
        async for update in self.fleet_updates():
            yield update

    def fleet_updates(self) -> AsyncIterator[pb.FleetUpdate]:
        """The fleet's views, pushed (WatchFleet's; a gateway with the router embedded reads them
        in its own process)."""
        return self._feed.updates()


class RouterCore:
    """The router's parts, wired: the policy over the worker table, the watcher of every worker's
    load and KV events, and discovery when the workers come from Kubernetes. The router service
    serves it over gRPC; a gateway with ``--router embedded`` calls ``servicer`` in its own
    process. ``start`` inside the event loop; ``close`` stops the watching."""

    def __init__(
        self, cfg: RoutingConfig, rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic,
        kube_config: KubeConfig | None = None,
    ) -> None:
        self.cfg = cfg
        policy = build_policy(cfg.routing, cfg.stale_after_s, load_bound=cfg.load_bound,
                              kv_load_weight=cfg.kv_load_weight, kv_home_weight=cfg.kv_home_weight,
                              kv_full_usage=cfg.kv_full_usage, kv_adapter_weight=cfg.kv_adapter_weight)
        table = WorkerTable(list(dict.fromkeys(cfg.workers)), clock=clock, pick_ttl_s=cfg.stale_after_s)
        self.router = Router(table, policy, cfg.stale_after_s, rng, cfg.approx_blocks_per_worker,
                             cfg.kv_pending_s, clock)
        self.servicer = RouterServicer(self.router, FleetFeed(table, self.router.workers, clock=clock))
        self.watcher = Watcher(table, cfg.stale_after_s, max(cfg.lost_after_s, cfg.stale_after_s),
                               kv=self.router.kv if policy.prefix_view == "kv" else None, prefix=self.router.prefix,
                               fleet_reports_per_s=cfg.fleet_reports_per_s, tls=MeshTls.of(cfg) if isinstance(cfg, ServerConfig) else None)
        self.discovery = None
        if cfg.discovery == "kubernetes":
            self.namespace = cfg.kubernetes_namespace or own_namespace()
            self.discovery = EndpointSliceDiscovery(
                api_client(kube_config), self.namespace, cfg.kubernetes_service, cfg.kubernetes_port,
                on_change=functools.partial(set_workers, self.router, self.watcher),
            )

    def start(self, name: str = "router") -> None:
        cfg, policy = self.cfg, self.router.policy
        self.watcher.start()
        if self.discovery is None:
            log.info("%s: policy %s over %d workers: %s", name, policy.name, len(cfg.workers),
                     " ".join(cfg.workers) or "none")
        else:
            self.discovery.start()
            log.info("%s: policy %s, discovery kubernetes: service %s in namespace %s (port %s)",
                     name, policy.name, cfg.kubernetes_service, self.namespace, cfg.kubernetes_port)

    async def close(self) -> None:
        if self.discovery is not None:  # first: nothing adds a worker to a watcher that is closing
            await self.discovery.close()
        await self.watcher.close()
        self.router.prefix.close()


def _service(
    cfg: RouterConfig, rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic,
    kube_config: KubeConfig | None = None,
) -> tuple[Callable[[grpc.aio.Server], list[str]], bootstrap.Lifecycle]:
    """The router's servicer registration and lifecycle; watching the workers starts with it."""
    core = RouterCore(cfg, rng, clock, kube_config)

    def register(server: grpc.aio.Server) -> list[str]:
        pb_grpc.add_RouterServicer_to_server(core.servicer, server)
        core.start()
        return [SERVICE_NAME]

    return register, bootstrap.Lifecycle(on_close=[core.close])


async def start_router(
    cfg: RouterConfig, rng: random.Random | None = None, clock: Callable[[], float] = time.monotonic,
    kube_config: KubeConfig | None = None,
) -> bootstrap.Running:
    """Starts the router in this process (tests run it on port 0, and give kubernetes discovery the
    ``kube_config`` of a fake API server); stop it with ``shutdown()``."""
    register, lifecycle = _service(cfg, rng, clock, kube_config)
    return await bootstrap.start("router", cfg, register, lifecycle)


async def main(cfg: RouterConfig) -> None:
    register, lifecycle = _service(cfg)
    await bootstrap.serve("router", cfg, register, lifecycle)
