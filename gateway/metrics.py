"""The gateway's Prometheus metrics (default registry). Latencies are as the client sees them;
the vllm:* histograms with the same meaning are the workers' own."""

from __future__ import annotations

import prometheus_client

REQUESTS = prometheus_client.Counter(
    "meshserve_gateway_requests_total", "Requests finished by the gateway, by gRPC status code", ["code"]
)
OUTPUT_TOKENS = prometheus_client.Counter(
    "meshserve_gateway_output_tokens", "Tokens the gateway streamed to clients, by source (engine or cache)",
    ["source"],
)
STREAM_MESSAGES = prometheus_client.Counter(
    "meshserve_gateway_stream_messages",
    "Chunks the gateway streamed to clients, by source; output_tokens / stream_messages is the "
    "tokens a chunk carried on average (tokens that queued while the client's side was slower "
    "than the worker's go as one chunk: under load, fewer chunks for the same tokens)",
    ["source"],
)
IN_FLIGHT = prometheus_client.Gauge("meshserve_gateway_in_flight", "Requests the gateway is serving now")
TIME_TO_FIRST_TOKEN = prometheus_client.Histogram(
    "meshserve_gateway_time_to_first_token_seconds",
    "From request arrival at the gateway to the first chunk sent to the client",
    buckets=[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
             20.0, 40.0, 80.0, 160.0, 640.0],
)
INTER_TOKEN_LATENCY = prometheus_client.Histogram(
    "meshserve_gateway_inter_token_latency_seconds",
    "Gap between two chunks forwarded from a worker",
    buckets=[0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
             10.0, 20.0, 40.0, 80.0],
)
TIME_PER_OUTPUT_TOKEN = prometheus_client.Histogram(
    "meshserve_gateway_time_per_output_token_seconds",
    "Per request: (end - first token) / (tokens - 1), as the client sees it (cache hits excluded)",
    buckets=[0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
             10.0, 20.0, 40.0, 80.0],
)
E2E_REQUEST_LATENCY = prometheus_client.Histogram(
    "meshserve_gateway_e2e_request_latency_seconds",
    "From request arrival at the gateway to its end, whatever the outcome",
    buckets=[0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
             60.0, 120.0, 240.0, 480.0, 960.0, 1920.0],
)
FAILOVERS = prometheus_client.Counter(
    "meshserve_gateway_failovers_total",
    "Requests retried on another worker after a failure before the first token",
)
PICK_SECONDS = prometheus_client.Histogram(
    "meshserve_gateway_pick_seconds",
    "From asking the router for a worker to its answer, as this gateway waits for it (answered "
    "picks; fallback picks while the router is away are not counted)",
    buckets=[0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0],
)
LATE_PICKS = prometheus_client.Counter(
    "meshserve_gateway_late_picks_total",
    "Requests sent without the router's pick because it did not come within --pick-timeout-s (counted "
    "in fallback_picks_total too): the router, or this gateway's way to it, is behind",
)
SOLE_WORKER_PICKS = prometheus_client.Counter(
    "meshserve_gateway_sole_worker_picks_total",
    "Requests sent to the fleet's only worker without waiting for the router's pick (nothing to "
    "choose; the router is still asked, off the request's path)",
)
FALLBACK_PICKS = prometheus_client.Counter(
    "meshserve_gateway_fallback_picks_total",
    "Picks the gateway made without the router (unreachable, or late): of the workers the fleet "
    "view shows serving, the one with the fewest of this gateway's requests",
)
MIGRATIONS = prometheus_client.Counter(
    "meshserve_gateway_migrations_total",
    "Streams moved to another worker after theirs was lost mid-stream, by outcome: ok (the "
    "continuation streamed) or failed (no worker could continue; the stream ended UNAVAILABLE)",
    ["outcome"],
)
MIGRATION_GAP = prometheus_client.Histogram(
    "meshserve_gateway_migration_gap_seconds",
    "From a worker lost mid-stream to the continuation's first chunk: the pause the client sees",
    buckets=[0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 40.0],
)
CACHE_HITS = prometheus_client.Counter(
    "meshserve_cache_hits_total", "Requests the gateway answered from the response cache", ["kind"]
)
COALESCED = prometheus_client.Counter(
    "meshserve_gateway_coalesced_total",
    "Requests that streamed the answer of an identical request in flight instead of generating their own",
)
FLIGHTS = prometheus_client.Gauge(
    "meshserve_gateway_flights",
    "Answers open to identical requests: being generated, or finished and being stored in the cache",
)
CACHE_SKIPPED = prometheus_client.Counter(
    "meshserve_gateway_cache_skipped_total", "Cache calls not made because the cache breaker was open"
)
WEIGHTS_UNKNOWN = prometheus_client.Counter(
    "meshserve_gateway_weights_unknown_total",
    "Cacheable requests generated on their own (not looked up, coalesced or stored) because the router "
    "had listed no healthy worker, so the weights the cache keys answers by were not known",
)
CACHE_BREAKER_OPEN = prometheus_client.Gauge(
    "meshserve_gateway_cache_breaker_open", "1 while the cache breaker is open (the cache is not called)"
)
SEMANTIC_BREAKER_OPEN = prometheus_client.Gauge(
    "meshserve_gateway_semantic_breaker_open",
    "1 while semantic lookups are not asked of the cache service (it failed or was too slow; a gateway "
    "with --redis-url still reads and writes exact entries)",
)
CACHE_ERRORS = prometheus_client.Counter(
    "meshserve_gateway_cache_errors_total", "Cache calls that failed or timed out (served uncached)", ["op"]
)
CACHE_READS = prometheus_client.Counter(
    "meshserve_gateway_cache_reads_total",
    "Exact cache entries the gateway read from Redis itself (--redis-url), by result: hit, miss, error",
    ["result"],
)
CACHE_WRITES = prometheus_client.Counter(
    "meshserve_gateway_cache_writes_total",
    "Exact cache entries the gateway wrote to Redis itself (--redis-url), by result: stored, refused, error",
    ["result"],
)
CACHE_READ_SECONDS = prometheus_client.Histogram(
    "meshserve_gateway_cache_read_seconds", "Time of the gateway's own read of an exact entry from Redis",
    buckets=[0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32],
)
CACHE_CORRUPT = prometheus_client.Counter(
    "meshserve_gateway_cache_corrupt_entries_total",
    "Entries the gateway read that did not parse: deleted and treated as a miss",
)
