"""A local trace receiver for looking at traces without a tracing backend.

``meshserve serve traces`` accepts OTLP/gRPC (the standard TraceService/Export, what every
service's exporter and Envoy's tracer send), keeps the most recent traces in memory (bounded)
and answers two queries on the same port: one trace by id, the N slowest. ``meshserve trace ID``
prints a trace as a waterfall and ``meshserve traces --slowest N`` lists the slowest ones.
In production, point the exporters at an OpenTelemetry Collector instead (deploy/otel/).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from meshserve.services.config import TracesConfig
from meshserve.services.gen import traces_pb2, traces_pb2_grpc

DEFAULT_ADDRESS = "127.0.0.1:4317"


# -- the store --------------------------------------------------------------------------------


@dataclass
class _Trace:
    spans: list[tuple[str, trace_pb2.Span]] = field(default_factory=list)  # (service, span)
    start_ns: int = 2**63
    end_ns: int = 0

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


class TraceStore:
    """The most recent traces, by the time their first span arrived. Bounded: past
    ``max_traces`` the oldest trace goes; past ``max_spans`` a trace's new spans are dropped."""

    def __init__(self, max_traces: int, max_spans: int) -> None:
        self._traces: OrderedDict[bytes, _Trace] = OrderedDict()
        self._max_traces = max_traces
        self._max_spans = max_spans
        self.dropped_spans = 0

    def add(self, resource_spans: Iterable[trace_pb2.ResourceSpans]) -> None:
        for rs in resource_spans:
            service = _service_name(rs.resource)
            for scope in rs.scope_spans:
                for span in scope.spans:
                    self._add(service, span)

    def _add(self, service: str, span: trace_pb2.Span) -> None:
        t = self._traces.get(span.trace_id)
        if t is None:
            t = self._traces[span.trace_id] = _Trace()
            while len(self._traces) > self._max_traces:
                self._traces.popitem(last=False)
        if len(t.spans) >= self._max_spans:
            self.dropped_spans += 1
            return
        t.spans.append((service, span))
        t.start_ns = min(t.start_ns, span.start_time_unix_nano)
        t.end_ns = max(t.end_ns, span.end_time_unix_nano)

    def get(self, trace_id: bytes) -> trace_pb2.TracesData | None:
        t = self._traces.get(trace_id)
        return None if t is None else _traces_data(t.spans)

    def slowest(self, n: int) -> trace_pb2.TracesData:
        ranked = sorted(self._traces.values(), key=lambda t: t.duration_ns, reverse=True)[:n]
        return _traces_data(s for t in ranked for s in t.spans)

    def __len__(self) -> int:
        return len(self._traces)


def _service_name(resource: resource_pb2.Resource) -> str:
    for kv in resource.attributes:
        if kv.key == "service.name":
            return kv.value.string_value
    return "unknown"


def _traces_data(spans: Iterable[tuple[str, trace_pb2.Span]]) -> trace_pb2.TracesData:
    by_service: dict[str, list[trace_pb2.Span]] = {}
    for service, span in spans:
        by_service.setdefault(service, []).append(span)
    out = trace_pb2.TracesData()
    for service, service_spans in by_service.items():
        rs = out.resource_spans.add()
        rs.resource.attributes.add(key="service.name", value=common_pb2.AnyValue(string_value=service))
        rs.scope_spans.add().spans.extend(service_spans)
    return out


# -- the server -------------------------------------------------------------------------------


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """OTLP/gRPC TraceService: every exported batch goes into the store."""

    def __init__(self, store: TraceStore) -> None:
        self._store = store

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.aio.ServicerContext
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self._store.add(request.resource_spans)
        return trace_service_pb2.ExportTraceServiceResponse()


class Query(traces_pb2_grpc.TraceQueryServicer):
    """protos/traces.proto's TraceQuery over the store."""

    def __init__(self, store: TraceStore) -> None:
        self._store = store

    async def Get(self, request: traces_pb2.GetTraceRequest, context: grpc.aio.ServicerContext) -> traces_pb2.Traces:
        try:
            trace_id = bytes.fromhex(request.trace_id)
        except ValueError:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"'trace_id' is not hex: {request.trace_id!r}")
        found = self._store.get(trace_id)
        if found is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"trace {request.trace_id} not found (or already dropped)")
        return _as_traces(found)

    async def Slowest(self, request: traces_pb2.SlowestRequest, context: grpc.aio.ServicerContext) -> traces_pb2.Traces:
        return _as_traces(self._store.slowest(request.count or 10))


def _as_traces(data: trace_pb2.TracesData) -> traces_pb2.Traces:
    return traces_pb2.Traces(resource_spans=[rs.SerializeToString() for rs in data.resource_spans])


def _as_traces_data(traces: traces_pb2.Traces) -> trace_pb2.TracesData:
    return trace_pb2.TracesData(resource_spans=[trace_pb2.ResourceSpans.FromString(b) for b in traces.resource_spans])


def _register(store: TraceStore) -> Callable[[grpc.aio.Server], list[str]]:
    def register(server: grpc.aio.Server) -> list[str]:
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Receiver(store), server)
        traces_pb2_grpc.add_TraceQueryServicer_to_server(Query(store), server)
        return [trace_service_pb2.DESCRIPTOR.services_by_name["TraceService"].full_name,
                traces_pb2.DESCRIPTOR.services_by_name["TraceQuery"].full_name]

    return register


async def start_traces(cfg: TracesConfig):  # noqa: ANN201 - services.server.Running
    """Starts the receiver in this process (tests use port 0)."""
    from meshserve.services.server import start

    return await start("traces", cfg, _register(TraceStore(cfg.max_traces, cfg.max_spans_per_trace)))


async def main(cfg: TracesConfig) -> None:
    from meshserve.services.server import serve

    await serve("traces", cfg, _register(TraceStore(cfg.max_traces, cfg.max_spans_per_trace)))


# -- the client -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """One span as the CLI and tests look at it."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str          # '' for a root
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, object]
    events: dict[str, int]  # event name -> time (ns)
    error: bool

    @property
    def duration_ms(self) -> float:
        return (self.end_ns - self.start_ns) / 1e6


def _value(v: common_pb2.AnyValue) -> object:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else str(v)


def spans_of(data: trace_pb2.TracesData) -> list[Span]:
    out = []
    for rs in data.resource_spans:
        service = _service_name(rs.resource)
        for scope in rs.scope_spans:
            for s in scope.spans:
                out.append(Span(
                    service=service, name=s.name, trace_id=s.trace_id.hex(), span_id=s.span_id.hex(),
                    parent_id=s.parent_span_id.hex(), kind=s.kind,
                    start_ns=s.start_time_unix_nano, end_ns=s.end_time_unix_nano,
                    attributes={a.key: _value(a.value) for a in s.attributes},
                    events={e.name: e.time_unix_nano for e in s.events},
                    error=s.status.code == trace_pb2.Status.STATUS_CODE_ERROR,
                ))
    return sorted(out, key=lambda s: s.start_ns)


async def fetch_trace(address: str, trace_id: str) -> list[Span]:
    """The spans of one trace; raises grpc.aio.AioRpcError (NOT_FOUND) if the receiver has none."""
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await traces_pb2_grpc.TraceQueryStub(channel).Get(traces_pb2.GetTraceRequest(trace_id=trace_id), timeout=5)
        return spans_of(_as_traces_data(reply))


async def fetch_slowest(address: str, n: int) -> dict[str, list[Span]]:
    """The N slowest traces: trace id -> spans, slowest first."""
    async with grpc.aio.insecure_channel(address) as channel:
        reply = await traces_pb2_grpc.TraceQueryStub(channel).Slowest(traces_pb2.SlowestRequest(count=n), timeout=5)
        data = _as_traces_data(reply)
    traces: dict[str, list[Span]] = {}
    for span in spans_of(data):
        traces.setdefault(span.trace_id, []).append(span)
    return dict(sorted(traces.items(), key=lambda kv: -_extent_ms(kv[1])))


def _extent_ms(spans: list[Span]) -> float:
    return (max(s.end_ns for s in spans) - min(s.start_ns for s in spans)) / 1e6


# -- rendering --------------------------------------------------------------------------------

BAR_WIDTH = 40
SHOWN_ATTRIBUTES = ("meshserve.request_id", "meshserve.worker", "meshserve.cached", "meshserve.cache.result",
                    "meshserve.router.reason", "meshserve.router.candidates", "meshserve.ttft_s", "meshserve.tokens",
                    "meshserve.finish_reason", "meshserve.status", "rpc.grpc.status_code")


def tree_order(spans: list[Span]) -> list[tuple[int, Span]]:
    """(depth, span) in depth-first order, children by start time; orphans are roots."""
    ids = {s.span_id for s in spans}
    children: dict[str, list[Span]] = {}
    for s in spans:
        children.setdefault(s.parent_id if s.parent_id in ids else "", []).append(s)
    out: list[tuple[int, Span]] = []

    def walk(parent: str, depth: int) -> None:
        for s in sorted(children.get(parent, []), key=lambda s: s.start_ns):
            out.append((depth, s))
            walk(s.span_id, depth + 1)

    walk("", 0)
    return out


def _bar(span: Span, t0: int, total: int, width: int = BAR_WIDTH) -> str:
    scale = width / max(total, 1)
    start = min(width - 1, int((span.start_ns - t0) * scale))
    length = max(1, round((span.end_ns - span.start_ns) * scale))
    cells = [" "] * width
    for i in range(start, min(width, start + length)):
        cells[i] = "█"
    if "first_token" in span.events:  # TTFT: where the first token left this span
        cells[min(width - 1, int((span.events["first_token"] - t0) * scale))] = "▌"
    return "".join(cells)


def _details(span: Span) -> str:
    shown = [f"{k.removeprefix('meshserve.')}={_short(span.attributes[k])}" for k in SHOWN_ATTRIBUTES
             if k in span.attributes and span.attributes[k] != ""]
    if "first_token" in span.events:
        shown.append(f"first_token=+{(span.events['first_token'] - span.start_ns) / 1e6:.1f}ms")
    return " ".join(shown)


def _short(value: object) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def render_waterfall(spans: list[Span], width: int = 200):  # noqa: ANN201 - rich.table.Table
    """The table for a terminal ``width`` columns wide: below 120 columns the details column is
    left out and the timeline takes what the other columns leave (names and times are never cut)."""
    from rich import box
    from rich.table import Table

    t0 = min(s.start_ns for s in spans)
    total = max(s.end_ns for s in spans) - t0
    services = sorted({s.service for s in spans})
    rows = [(s, "  " * depth + s.name) for depth, s in tree_order(spans)]
    wide = width >= 120
    if wide:
        bar_width = BAR_WIDTH
    else:  # service, span, start, ms: their widths and a space either side of each column
        fixed = max(map(len, services)) + max(len(name) for _, name in rows) + 8 + 7 + 5 * 2
        bar_width = max(10, width - fixed)
    table = Table(title=f"trace {spans[0].trace_id}: {len(spans)} spans, {len(services)} services "
                        f"({', '.join(services)}), {total / 1e6:.1f} ms", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False)
    for column, justify in (("service", "left"), ("span", "left"), ("start ms", "right"), ("ms", "right")):
        table.add_column(column, justify=justify, no_wrap=True)
    table.add_column("timeline (▌ first token)" if bar_width >= 24 else "timeline", no_wrap=True,
                     min_width=bar_width)
    if wide:
        table.add_column("details", no_wrap=False)
    for s, name in rows:
        details = [_details(s)] if wide else []
        table.add_row(s.service, name, f"{(s.start_ns - t0) / 1e6:.1f}", f"{s.duration_ms:.1f}",
                      _bar(s, t0, total, bar_width), *details, style="red" if s.error else None)
    return table


def render_slowest(traces: dict[str, list[Span]], width: int = 200):  # noqa: ANN201 - rich.table.Table
    """The table for a terminal ``width`` columns wide. Trace ids are never cut (a person copies
    them into ``meshserve trace``): below 120 columns the services column is left out and the
    root span is named by its method alone."""
    from rich import box
    from rich.table import Table

    wide = width >= 120
    table = Table(title=f"{len(traces)} slowest traces", title_justify="left", box=box.SIMPLE_HEAD,
                  pad_edge=False, collapse_padding=True)
    table.add_column("trace id", no_wrap=True, min_width=32)
    for column in ("started", "ms"):
        table.add_column(column, no_wrap=True)
    table.add_column("root", overflow="fold")
    table.add_column("spans", no_wrap=True)
    if wide:
        table.add_column("services")
    table.add_column("status", no_wrap=True)
    for trace_id, spans in traces.items():
        root = tree_order(spans)[0][1]
        started = time.strftime("%H:%M:%S", time.localtime(min(s.start_ns for s in spans) / 1e9))
        services = [",".join(sorted({s.service for s in spans}))] if wide else []
        status = "error" if any(s.error for s in spans) else "ok"
        name = root.name if wide else root.name.rsplit("/", 1)[-1]
        table.add_row(trace_id, started, f"{_extent_ms(spans):.1f}", f"{root.service}: {name}",
                      str(len(spans)), *services, status, style="red" if status == "error" else None)
    return table
