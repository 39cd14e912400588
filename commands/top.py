"""``meshserve top``: a live terminal view of a running mesh, built only from what its services
already expose (the router's ListWorkers, every service's Prometheus metrics, Envoy's admin stats)."""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
from prometheus_client.parser import text_string_to_metric_families

from meshserve.services import config
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.mesh_tls import blocking_channel, operator_dir

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

RATE_S = 5.0              # per-second rates: over the last 5 s, so the view follows a change of load
WINDOW_S = 60.0           # percentiles, hit rates and Envoy's refusals: over the last minute
TIMEOUT_S = 1.0           # a frozen service holds a frame back this long at most
WIDE = 120                # from this terminal width on, more columns
WEIGHTS_CHARS = 8         # of a worker's weights id (like a short commit hash)
LIST_WORKERS = "router ListWorkers"  # the key of the router's own answer in Snapshot.errors
SHOWN = ("worker", "gateway", "router", "envoy")  # the kinds of service the frame reads
# Gateway codes that are the client's doing, not errors (as the error-rate alert in deploy/prometheus/rules.yml).
NOT_ERRORS = frozenset({"OK", "CANCELLED", "INVALID_ARGUMENT", "NOT_FOUND"})
REFUSED = "RESOURCE_EXHAUSTED"  # past a bound: counted apart from the errors
# Envoy's stats for the edge: its listener's HTTP connection manager, the gateway cluster and
# the local rate limit (the only filter whose stats have "rate_limited" in the name).
ENVOY_FILTER = r"^http\.ingress\.downstream_rq_[1-5]xx$|^cluster\.gateway\.upstream_rq_pending_overflow$|rate_limited$"

Series = frozenset[tuple[str, str]]   # a sample's labels
Metrics = dict[str, dict[Series, float]]  # sample name (with _total, _bucket, ...) -> value per series


class NoMesh(Exception):
    """No mesh's files in the run dir: nothing to watch."""


# -- reading ---------------------------------------------------------------------------------


def parse_prometheus(text: str) -> Metrics:
    out: Metrics = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def parse_envoy_stats(text: str) -> Metrics:
    """Envoy's admin ``/stats`` text ("name: value" lines); histogram lines are skipped."""
    out: Metrics = {}
    for line in text.splitlines():
        name, sep, value = line.partition(": ")
        if sep and re.fullmatch(r"-?\d+", value.strip()):
            out[name] = {frozenset(): float(value)}
    return out


@dataclass(frozen=True)
class Service:
    name: str          # the launcher's process name: gateway, gateway-1, router, worker-0, envoy, ...
    kind: str          # gateway, router, worker, cache, traces or envoy
    url: str           # its metrics (Envoy: admin /stats)
    address: str = ""  # gRPC host:port (router and workers: to match ListWorkers)


@dataclass(frozen=True)
class MeshFiles:
    """Where a local mesh answers, from the files ``meshserve up`` keeps in its run dir."""

    run_dir: Path
    router: str
    services: tuple[Service, ...]


def discover(run_dir: Path) -> MeshFiles:
    """The mesh of ``run_dir``. prometheus-targets.json is rewritten whenever a service (re)starts,
    so it names the current processes; each one's ``NAME.ready`` holds its gRPC address. Only
    the services the frame reads are kept."""
    targets = run_dir / "prometheus-targets.json"
    try:
        groups = json.loads(targets.read_text())
    except FileNotFoundError:
        raise NoMesh(f"no mesh in {run_dir} (no {targets.name}): start one with `meshserve up`, "
                     "or give --run-dir the run dir it was started with") from None
    services = []
    for group in groups:
        labels, target = group["labels"], group["targets"][0]
        name, kind = labels["name"], labels["job"].removeprefix("meshserve-")
        if kind not in SHOWN:
            continue
        if kind == "envoy":
            url = f"http://{target}/stats?filter={urllib.parse.quote(ENVOY_FILTER)}"
        else:
            url = f"http://{target}/metrics"
        address = _ready_address(run_dir, name) if kind in ("router", "worker") else ""
        services.append(Service(name, kind, url, address))
    if not any(s.kind == "router" for s in services):
        # `meshserve up --router embedded`: the first gateway picks, and serves the router's view.
        gateway = next((s for s in services if s.name == "gateway"), None)
        if gateway is not None:
            services.append(Service("router", "router", gateway.url, _ready_address(run_dir, "gateway")))
    router = next((s.address for s in services if s.kind == "router" and s.address), "")
    if not router:
        raise NoMesh(f"no router in {run_dir} (no router.ready, nor a gateway.ready with the router embedded)")
    return MeshFiles(run_dir, router, tuple(services))


def _ready_address(run_dir: Path, name: str) -> str:
    """The gRPC address in service ``name``'s ready file; '' while it restarts (the file comes back
    once it serves)."""
    try:
        return (run_dir / f"{name}.ready").read_text().split()[0]
    except (OSError, IndexError):
        return ""


# -- windows over scrapes ---------------------------------------------------------------------


def increase(old: float, new: float) -> float:
    """A counter's increase; a smaller value means the service restarted and counted from 0."""
    return new - old if new >= old else new


@dataclass(frozen=True)
class Span:
    """Two scrapes of one endpoint, ``seconds`` apart."""

    seconds: float
    old: Metrics
    new: Metrics

    def increase(self, name: str, **labels: str) -> float:
        """Summed over the series of ``name`` that carry ``labels``."""
        want = labels.items()
        old = self.old.get(name, {})
        return sum(increase(old.get(series, 0.0), value)
                   for series, value in self.new.get(name, {}).items() if want <= dict(series).items())

    def rate(self, name: str, **labels: str) -> float:
        return self.increase(name, **labels) / self.seconds

    def by_label(self, name: str, label: str) -> dict[str, float]:
        """Increase of ``name`` per value of ``label``."""
        values = {dict(series).get(label, "") for series in self.new.get(name, {})}
        return {value: self.increase(name, **{label: value}) for value in sorted(values)}

    def buckets(self, histogram: str, **labels: str) -> list[tuple[float, float]]:
        """Cumulative (upper bound, count) of the observations made in the span, the series that
        carry ``labels`` summed."""
        by_bound: dict[float, float] = {}
        want = labels.items()
        old = self.old.get(f"{histogram}_bucket", {})
        for series, value in self.new.get(f"{histogram}_bucket", {}).items():
            if not want <= dict(series).items():
                continue
            bound = float(dict(series)["le"])
            by_bound[bound] = by_bound.get(bound, 0.0) + increase(old.get(series, 0.0), value)
        return sorted(by_bound.items())


def quantile(q: float, buckets: Sequence[tuple[float, float]]) -> float | None:
    """Prometheus's histogram_quantile: linear within the bucket holding the rank; in the +Inf
    bucket, the highest finite bound. None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        count = max(count, below)  # after a restart bucket increases may disagree a little
        if count >= rank and count > below:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def merged_buckets(spans: Iterable[Span], histogram: str, **labels: str) -> list[tuple[float, float]]:
    """One histogram's buckets over several endpoints (every gateway)."""
    total: dict[float, float] = {}
    for span in spans:
        for bound, count in span.buckets(histogram, **labels):
            total[bound] = total.get(bound, 0.0) + count
    return sorted(total.items())


@dataclass
class History:
    """One endpoint's recent scrapes, oldest first: enough for a window of ``keep_s``."""

    keep_s: float = WINDOW_S
    scrapes: deque[tuple[float, Metrics]] = field(default_factory=deque)

    def add(self, at: float, metrics: Metrics) -> None:
        self.scrapes.append((at, metrics))
        # Keep one scrape at or before the window's start, so a full window spans keep_s.
        while len(self.scrapes) > 2 and self.scrapes[1][0] <= at - self.keep_s:
            self.scrapes.popleft()

    def span(self, seconds: float) -> Span | None:
        """From the oldest scrape at most ``seconds`` before the newest (or the one just before
        that, when none is that recent) to the newest; None before a second scrape."""
        if len(self.scrapes) < 2:
            return None
        newest_at, newest = self.scrapes[-1]
        old_at, old = self.scrapes[-2]
        for at, metrics in self.scrapes:
            if at >= newest_at - seconds - 1e-9:
                if at < newest_at:
                    old_at, old = at, metrics
                break
        return Span(newest_at - old_at, old, newest)


# -- one frame ---------------------------------------------------------------------------------


@dataclass
class Snapshot:
    """What one poll saw: the router's worker table and every endpoint's history."""

    at: float                                   # wall-clock time, for the header
    mesh: MeshFiles
    workers: list[pb.WorkerState] | None        # None: the router did not answer
    histories: dict[str, History]               # by service name
    errors: dict[str, str]                      # service name -> why it did not answer

    def spans(self, kind: str, seconds: float) -> dict[str, Span]:
        """The spans of every answering service of ``kind``, by name."""
        out = {}
        for service in self.mesh.services:
            history = self.histories.get(service.name)
            span = history.span(seconds) if history and service.name not in self.errors else None
            if service.kind == kind and span is not None:
                out[service.name] = span
        return out


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 9999.5:
        return f"{value / 1000:.0f}k"
    return f"{value:.1f}" if value < 99.95 else f"{value:.0f}"


def _share(fraction: float) -> str:
    """A fraction as a percentage; a tenth of a percent shows below 10% (a sim's KV usage)."""
    percent = 100 * fraction
    return f"{percent:.1f}%" if 0 < percent < 9.95 else f"{percent:.0f}%"


def _pct(part: float, whole: float) -> str:
    return _share(part / whole) if whole > 0 else "-"


def _secs(value: float | None) -> str:
    if value is None:
        return "-"
    if value < 0.01:
        return f"{value * 1000:.1f}ms"
    return f"{value * 1000:.0f}ms" if value < 1 else f"{value:.2f}s"


def _state(worker: pb.WorkerState) -> tuple[str, str]:
    """(what the router knows of the worker, its colour)."""
    if not worker.HasField("load"):
        return "down", "red"
    if worker.load.draining:
        return "draining", "yellow"
    return ("ok", "green") if worker.healthy else ("stale", "red")


def _tokens_per_s(span: Span) -> float:
    """Generated tokens per second: vllm:generation_tokens, counted by vLLM itself or, under the
    other engines, by the worker."""
    return span.rate("vllm:generation_tokens_total")


def _natural(name: str) -> list[int | str]:
    """Sort key: worker-2 before worker-10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _workers(snap: Snapshot, wide: bool) -> RenderableType:
    from rich.table import Table
    from rich.text import Text

    if snap.workers is None:
        return Text(f"workers: the router at {snap.mesh.router} did not answer ListWorkers "
                    f"({snap.errors.get(LIST_WORKERS, '?')})", style="red")
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("worker", no_wrap=True)  # never cut: it is what one greps, kills, restarts
    table.add_column("state", no_wrap=True)
    for column in ("run", "wait", *(("cap", "in-fl") if wide else ()), "kv", "prefix", "tok/s", "picks/s"):
        table.add_column(column, justify="right", no_wrap=True)
    if wide:
        table.add_column("weights", no_wrap=True)  # WorkerInfo.weights_id: two during a rollout
        table.add_column("address", no_wrap=True)
    names = {s.address: s.name for s in snap.mesh.services if s.kind == "worker"}
    recent, minute = snap.spans("worker", RATE_S), snap.spans("worker", WINDOW_S)
    router = snap.spans("router", RATE_S).get("router")
    for w in sorted(snap.workers, key=lambda w: _natural(w.worker_id or w.address)):
        state, colour = _state(w)
        name = names.get(w.address, "")
        prefix = tok = "-"
        if name in minute:
            prefix = _pct(minute[name].increase("vllm:prefix_cache_hits_total"),
                          minute[name].increase("vllm:prefix_cache_queries_total"))
        if name in recent:
            tok = _num(_tokens_per_s(recent[name]))
        picks = _num(router.rate("meshserve_router_picks_total", worker=w.worker_id)) if router else "-"
        load = w.load
        extra = (str(load.max_num_seqs), str(load.num_in_flight)) if wide else ()
        table.add_row(
            w.worker_id or w.address, Text(state, style=colour), str(load.num_running), str(load.num_waiting),
            *extra, _share(load.kv_cache_usage), prefix, tok, picks,
            *((w.weights_id[:WEIGHTS_CHARS] or "-", w.address) if wide else ()),
        )
    return table


def _errors_per_s(span: Span) -> float:
    codes = span.by_label("meshserve_gateway_requests_total", "code")
    return sum(n for code, n in codes.items() if code not in NOT_ERRORS and code != REFUSED) / span.seconds


def _refused_per_s(span: Span) -> float:
    """Requests refused past a bound (RESOURCE_EXHAUSTED, with a retry hint), a second."""
    return span.by_label("meshserve_gateway_requests_total", "code").get(REFUSED, 0.0) / span.seconds


def _gateways(snap: Snapshot, wide: bool) -> RenderableType:
    from rich.table import Table

    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("gateway", no_wrap=True)
    latencies = ["ttft", "itl", *(("tpot", "e2e") if wide else ())]
    for column in ("in-flight", "req/s", "err/s", "refused/s",
                   *(f"{n} {p}" for n in latencies for p in ("p50", "p99"))):
        table.add_column(column, justify="right", no_wrap=True)
    recent, minute = snap.spans("gateway", RATE_S), snap.spans("gateway", WINDOW_S)
    histograms = {"ttft": "time_to_first_token", "itl": "inter_token_latency",
                  "tpot": "time_per_output_token", "e2e": "e2e_request_latency"}

    def row(name: str, now: list[Span], last_minute: list[Span]) -> list[str]:
        in_flight = sum(s.new.get("meshserve_gateway_in_flight", {}).get(frozenset(), 0.0) for s in now)
        requests = sum(s.rate("meshserve_gateway_requests_total") for s in now)
        failed = sum(_errors_per_s(s) for s in now)
        refused = sum(_refused_per_s(s) for s in now)
        cells = [name, f"{in_flight:.0f}", _num(requests), _num(failed), _num(refused)]
        for n in latencies:
            buckets = merged_buckets(last_minute, f"meshserve_gateway_{histograms[n]}_seconds")
            cells += [_secs(quantile(0.5, buckets)), _secs(quantile(0.99, buckets))]
        return cells

    for name in sorted(recent):
        table.add_row(*row(name, [recent[name]], [minute[name]] if name in minute else []))
    if len(recent) > 1:
        table.add_row(*row("all", list(recent.values()), list(minute.values())), style="bold")
    if not recent:
        table.add_row("-", *("-" for _ in table.columns[1:]))
    return table


def _tenants(snap: Snapshot) -> RenderableType | None:
    """Per tenant, over every gateway: requests waiting for a place on the fleet now, their wait
    (p50/p99, last minute), refusals in the last minute (flow control's and the tenant's limits')
    and output tokens a second; None while no gateway has seen a tenant."""
    from rich.table import Table

    recent, minute = list(snap.spans("gateway", RATE_S).values()), list(snap.spans("gateway", WINDOW_S).values())
    names: set[str] = set()
    for span in recent:
        for name in ("meshserve_gateway_flow_queued", "meshserve_gateway_tenant_requests_total",
                     "meshserve_gateway_flow_refused_total", "meshserve_gateway_limits_refused_total"):
            names |= {dict(series).get("tenant", "") for series in span.new.get(name, {})}
    names.discard("")
    if not names - {"-"}:  # "-": requests with no tenant (no API keys): a mesh without tenants
        return None
    table = Table(box=None, pad_edge=False, header_style="bold")
    table.add_column("tenant", no_wrap=True)
    for column in ("queued", "wait p50", "wait p99", "refused/min", "out tok/s"):
        table.add_column(column, justify="right", no_wrap=True)
    for tenant in sorted(names, key=_natural):
        queued = sum(value for s in recent for series, value in s.new.get("meshserve_gateway_flow_queued", {}).items()
                     if dict(series).get("tenant") == tenant)
        waits = merged_buckets(minute, "meshserve_gateway_flow_wait_seconds", tenant=tenant)
        refused = sum(s.increase(name, tenant=tenant) for s in minute for name in (
            "meshserve_gateway_flow_refused_total", "meshserve_gateway_limits_refused_total"))
        tokens = sum(s.rate("meshserve_gateway_tenant_tokens_total", tenant=tenant, kind="completion") for s in recent)
        table.add_row(tenant, f"{queued:.0f}", _secs(quantile(0.5, waits)), _secs(quantile(0.99, waits)),
                      f"{refused:.0f}", _num(tokens))
    return table


def _line(label: str, items: Sequence[str]) -> RenderableType:
    from rich.text import Text

    text = Text(f"{label:<8}", style="bold")
    text.append(" · ".join(items) if items else "-")
    return text


def _router(snap: Snapshot) -> RenderableType:
    span = snap.spans("router", RATE_S).get("router")
    if span is None:
        return _line("router", [])
    picks = span.by_label("meshserve_router_picks_total", "reason")
    items = [f"{reason} {_num(n / span.seconds)}/s" for reason, n in sorted(picks.items(), key=lambda kv: -kv[1])]
    items.append(f"no worker {_num(span.rate('meshserve_router_no_worker_total'))}/s")
    return _line("router", ["picks: " + items[0], *items[1:]])


def _cache(snap: Snapshot) -> RenderableType:
    minute = list(snap.spans("gateway", WINDOW_S).values())
    if not minute:
        return _line("cache", [])
    answered = sum(s.increase("meshserve_gateway_requests_total") for s in minute)
    hits = {"exact": 0.0, "semantic": 0.0}  # a kind's counter appears with its first hit
    for span in minute:
        for kind, n in span.by_label("meshserve_cache_hits_total", "kind").items():
            hits[kind] = hits.get(kind, 0.0) + n
    hits["coalesced"] = sum(s.increase("meshserve_gateway_coalesced_total") for s in minute)
    items = [f"{kind} {_pct(n, answered)}" for kind, n in hits.items()]
    if any(s.new.get("meshserve_gateway_cache_breaker_open", {}).get(frozenset()) for s in minute):
        items.append("breaker OPEN")
    return _line("cache", ["hits: " + items[0], *items[1:]])


def _envoy(snap: Snapshot) -> RenderableType:
    recent, minute = snap.spans("envoy", RATE_S).get("envoy"), snap.spans("envoy", WINDOW_S).get("envoy")
    if recent is None or minute is None:
        return _line("envoy", [])
    answered = sum(recent.rate(f"http.ingress.downstream_rq_{c}xx") for c in range(1, 6))
    refused = {
        "overflow": minute.increase("cluster.gateway.upstream_rq_pending_overflow"),
        "rate-limited": sum(minute.increase(name) for name in minute.new if name.endswith("rate_limited")),
        "4xx": minute.increase("http.ingress.downstream_rq_4xx"),
        "5xx": minute.increase("http.ingress.downstream_rq_5xx"),
    }
    return _line("envoy", [f"{_num(answered)} req/s", "last min: " + ", ".join(
        f"{kind} {n:.0f}" for kind, n in refused.items())])


def render(snap: Snapshot, width: int) -> RenderableType:
    """One frame for a terminal ``width`` columns wide (from 80); worker ids are never cut."""
    from rich.console import Group
    from rich.text import Text

    wide = width >= WIDE
    clock = time.strftime("%H:%M:%S", time.localtime(snap.at))
    header = Text("meshserve top", style="bold")
    header.append(f"  {clock}  /s: last {RATE_S:.0f} s · p50/p99, hit %: last {WINDOW_S:.0f} s")
    if wide:
        header.append(f" · {snap.mesh.run_dir}")
    parts: list[RenderableType] = [header, Text(), _workers(snap, wide), Text(), _gateways(snap, wide), Text()]
    if (tenants := _tenants(snap)) is not None:
        parts += [tenants, Text()]
    parts += [_router(snap), _cache(snap), _envoy(snap)]
    if snap.errors:
        parts.append(Text("unreachable: " + ", ".join(f"{n} ({why})" for n, why in sorted(snap.errors.items())),
                          style="red"))
    return Group(*parts)


# -- polling -----------------------------------------------------------------------------------


def _scrape(service: Service) -> Metrics:
    with urllib.request.urlopen(service.url, timeout=TIMEOUT_S) as r:
        text = r.read().decode()
    return parse_envoy_stats(text) if service.kind == "envoy" else parse_prometheus(text)


def _why(e: Exception) -> str:
    if isinstance(e, grpc.RpcError):
        return e.code().name  # type: ignore[attr-defined]
    if isinstance(e, urllib.error.URLError):
        e = e.reason if isinstance(e.reason, Exception) else e
    if isinstance(e, OSError) and e.strerror:
        return e.strerror  # "Connection refused", not "[Errno 111] Connection refused"
    return str(e) or type(e).__name__


class Poller:
    """Polls one mesh: every endpoint at once, keeping each one's recent scrapes."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.histories: dict[str, History] = {}
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix="top")
        self._channel: tuple[str, grpc.Channel] | None = None

    def _list_workers(self, address: str) -> list[pb.WorkerState]:
        if self._channel is None or self._channel[0] != address:  # the router may come back elsewhere
            if self._channel is not None:
                self._channel[1].close()
            tls = operator_dir(self.run_dir)  # the mesh's own certificate for its tools, if it runs mTLS
            self._channel = (address, blocking_channel(address, tls if tls.is_dir() else None))
        stub = pb_grpc.RouterStub(self._channel[1])
        return list(stub.ListWorkers(pb.ListWorkersRequest(), timeout=TIMEOUT_S).workers)

    def poll(self) -> Snapshot:
        """Raises NoMesh when the run dir holds no mesh; a service that does not answer is in
        ``errors``. The run dir is read each time: a restarted service may listen elsewhere."""
        mesh = discover(self.run_dir)
        at = time.monotonic()
        scrapes = {s.name: self._pool.submit(_scrape, s) for s in mesh.services}
        listing = self._pool.submit(self._list_workers, mesh.router)
        errors: dict[str, str] = {}
        for name, future in scrapes.items():
            try:
                self.histories.setdefault(name, History()).add(at, future.result())
            except Exception as e:  # noqa: BLE001 - shown in the frame; the next poll tries again
                errors[name] = _why(e)
        workers = None
        try:
            workers = listing.result()
        except Exception as e:  # noqa: BLE001 - as above
            errors[LIST_WORKERS] = _why(e)
        return Snapshot(time.time(), mesh, workers, self.histories, errors)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._channel is not None:
            self._channel[1].close()


# -- the command -------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--run-dir", type=Path, default=config.default_cache_dir() / "run",
                        help="the run dir of the `meshserve up` to watch (its --run-dir)")
    parser.add_argument("--interval", type=config.at_least(float, 0.1), default=0.5,
                        help="seconds between frames; with --once, between its two scrapes (rates need two)")
    parser.add_argument("--once", action="store_true", help="print one frame to stdout and exit (for scripts)")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    poller = Poller(args.run_dir)
    console = Console()  # the terminal's width; 80 when stdout is not a terminal
    try:
        if args.once:
            return _once(poller, console, args.interval)
        return _live(poller, console, args.interval)
    except NoMesh as e:
        print(f"meshserve top: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        poller.close()


def _once(poller: Poller, console: Console, interval: float) -> int:
    """One frame; exit code 1 when some part of the mesh did not answer (the frame says which)."""
    poller.poll()
    time.sleep(interval)  # rates and percentiles are differences between two scrapes
    snap = poller.poll()
    if snap.workers is None and all(s.name in snap.errors for s in snap.mesh.services):
        why = ", ".join(f"{n}: {e}" for n, e in sorted(snap.errors.items()))
        print(f"meshserve top: cannot reach the mesh of {snap.mesh.run_dir} ({why})", file=sys.stderr)
        return 1
    console.print(render(snap, console.width))
    return 1 if snap.errors else 0


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def _live(poller: Poller, console: Console, interval: float) -> int:
    from rich.live import Live

    signal.signal(signal.SIGTERM, _interrupt)  # so `kill` too leaves the alternate screen
    # The alternate screen, redrawn whole once per frame: no flicker, no scrollback garbage.
    with Live(console=console, screen=True, auto_refresh=False) as live:
        while True:
            started = time.monotonic()
            live.update(render(poller.poll(), console.width), refresh=True)
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
