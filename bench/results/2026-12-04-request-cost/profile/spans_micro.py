# In-process cost of the gateway's three spans of a request: created with the SDK, encoded by
# OpenTelemetry's OTLP encoder and by services.otlp (PYTHONPATH=. .venv/bin/python spans_micro.py)
import time
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.trace import SpanKind
spans=[]
class Keep(SpanExporter):
    def export(self, s): spans.extend(s); return SpanExportResult.SUCCESS
p = TracerProvider(resource=Resource.create({"service.name": "gateway"}), sampler=ParentBased(TraceIdRatioBased(1.0)))
p.add_span_processor(SimpleSpanProcessor(Keep()))
tr = p.get_tracer("meshserve")
def one():
    with tr.start_as_current_span("OpenAI/StreamChatCompletions", kind=SpanKind.SERVER, attributes={"rpc.system": "grpc", "rpc.method": "/meshserve.v1.OpenAI/StreamChatCompletions", "http.route": "/v1/chat/completions:sse"}) as s:
        with tr.start_as_current_span("router pick") as c:
            c.set_attribute("meshserve.router.excluded", 0)
            c.set_attributes({"meshserve.worker": "worker-0", "meshserve.router.reason": "kv-aware", "meshserve.router.predicted_cached_tokens": 0})
        w = tr.start_span("worker stream", attributes={"meshserve.worker": "worker-0", "meshserve.worker.address": "127.0.0.1:50061", "meshserve.attempt": 1, "meshserve.continued_tokens": 0})
        w.add_event("first_token"); s.add_event("first_token")
        w.set_attribute("meshserve.finish_reason", "length"); w.set_attribute("meshserve.tokens", 2); w.end()
        s.set_attributes({"meshserve.request_id": "abc"*10, "meshserve.worker": "worker-0", "meshserve.cached": False, "meshserve.tokens": 2, "meshserve.e2e_s": 0.1, "meshserve.status": "OK", "meshserve.ttft_s": 0.05})
import gc; gc.disable()
N=3000
t=time.perf_counter()
for _ in range(N): one()
t1=time.perf_counter()
print(f"create 3 spans: {(t1-t)/N*1e6:.0f} us/request")
batch=spans[:]
t=time.perf_counter()
for i in range(0, len(batch), 512): encode_spans(batch[i:i+512]).SerializeToString()
t1=time.perf_counter()
print(f"encode+serialize: {(t1-t)/N*1e6:.0f} us/request ({len(batch)} spans)")
from services.otlp import encode_spans as e2
t=time.perf_counter()
for i in range(0, len(batch), 512): a = e2(batch[i:i+512]).SerializeToString()
t1=time.perf_counter()
print(f"services.otlp encode+serialize: {(t1-t)/N*1e6:.0f} us/request")
