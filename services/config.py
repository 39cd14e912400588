"""Typed configuration for every meshserve service: defaults live here and nowhere else.

Each service has a dataclass; every field carries its help text, from which the CLI flags are
derived (``add_arguments`` / ``from_args``). Environment variables are read once, by the CLI: a
field with an ``env`` name takes its default from that variable (for secrets, which a command line
would show to anyone who can list the processes).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def _f(default: Any, help: str, **kw: Any) -> Any:
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help, **kw})
    return field(default=default, metadata={"help": help, **kw})


# The name the project's own tiny model is served under (`meshserve make-model` builds it).
DEFAULT_MODEL = "meshserve-tiny"
SIM_MODEL = "meshserve-sim"  # the name the simulator serves under unless given one
CACHE_KEY_PREFIX = "meshserve:cache:"  # of every cache key: the cache service writes, the gateway reads
# A worker's Session response header: it reads batched actions (protos: SessionRequest.batch).
SESSION_BATCH_HEADER = "meshserve-session-batch"
# Inference engines (WorkerConfig.engine); worker/server.py defines them, under these names.
WORKER_ENGINES = ("vllm", "sim", "transformers")
# Where vLLM's engine-core process may run on CPU (WorkerConfig.engine_core_cpus).
ENGINE_CORE_PLACEMENTS = ("auto", "shared", "vllm")
# Routing policies (RouterConfig.routing); router/policies.py defines them, under these names.
ROUTING_POLICIES = (
    "round-robin", "random", "least-load", "power-of-two", "prefix-affinity", "kv-aware",
    "approx-prefix", "session-affinity",
)
# The CPU priority of vLLM's engine processes on CPU (WorkerConfig.engine_priority).
ENGINE_PRIORITIES = ("auto", "low", "normal")
# What runs the semantic cache's embedding model (CacheConfig.embed_runtime).
EMBED_RUNTIMES = ("onnx", "onnx-int8", "torch")
# Where the router finds its workers (RouterConfig.discovery).
DISCOVERY_MODES = ("static", "kubernetes")
# The Redis URL (CacheConfig/GatewayConfig.redis_url) when no --redis-url is given: it may carry a
# password, so Kubernetes passes it from a Secret in the environment, never on the command line.
REDIS_URL_ENV = "MESHSERVE_REDIS_URL"
# Mutual TLS inside the mesh (ServerConfig.mesh_tls_dir): each certificate's common name is who
# holds it. Only the edge may name a request's tenant to a gateway, and only a gateway may name it
# to the cache service; a service's own name is also the name its clients check its certificate for.
EDGE_IDENTITY = "meshserve-edge"
SERVICE_IDENTITIES = {name: f"meshserve-{name}" for name in ("gateway", "router", "cache", "worker", "traces")}
# The launcher's and the local tools' own (health checks, `meshserve top`, `meshserve usage`).
OPERATOR_IDENTITY = "meshserve-operator"
# The LoRA ranks vLLM sizes its adapter slots for (WorkerConfig.max_lora_rank; its MaxLoRARanks).
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def default_cache_dir() -> Path:
    return Path(os.environ.get("MESHSERVE_CACHE_DIR", Path.home() / ".cache" / "meshserve"))


@dataclass
class ServerConfig:
    """What every gRPC service shares: where it listens and how it stops."""

    host: str = _f("127.0.0.1", "address to bind the gRPC server to")
    port: int = _f(0, "gRPC port (0 picks a free port)")
    metrics_port: int = _f(0, "Prometheus metrics HTTP port (0 picks a free port, -1 disables)")
    grace_seconds: float = _f(10.0, "on SIGTERM, how long in-flight streams may finish")
    log_level: str = _f("INFO", "log level")
    ready_file: str = _f("", "write 'host:port metrics_port' here once serving (used by the launcher)")
    otlp_endpoint: str = _f(
        "", "OTLP/gRPC trace collector host:port; empty: no spans exported (trace context still propagated)"
    )
    trace_sampling_ratio: float = _f(
        1.0, "fraction of new traces sampled (none without --otlp-endpoint); a caller's decision (traceparent) "
        "is always followed"
    )
    mesh_tls_dir: str = _f(
        "", "mutual TLS inside the mesh: a directory with this service's certificate (tls.crt, tls.key) and the "
        "mesh CA's (ca.crt), a Kubernetes TLS Secret as mounted; it serves only clients with a certificate of "
        "that CA and presents its own to every service it calls; '': plaintext"
    )


@dataclass
class WorkerConfig(ServerConfig):
    """A worker: one inference engine behind the Worker gRPC service."""

    port: int = _f(50061, "gRPC port (0 picks a free port)")
    worker_id: str = _f("", "name reported to the router (default: host:port)")
    engine: str = _f(
        "vllm", "engine: vllm (real), sim (latency simulator) or transformers (baseline)", choices=WORKER_ENGINES,
    )
    model: str = _f("", "model path, or the name of one of the project's tiny models (meshserve-tiny, "
                        "meshserve-tiny-2: built on first use) (default: meshserve-tiny)")
    served_model_name: str = _f(
        "", "the name requests give for the model, reported to the router and gateways (vLLM's "
            "--served-model-name); default: --model as given (the tiny model's name when none is)")
    weights_id: str = _f(
        "", "what the response cache keys this worker's answers by beyond the model's name (a model "
        "version, say); default: a fingerprint of the model's files (vllm, transformers), none (sim)",
    )
    tensor_parallel_size: int = _f(1, "tensor-parallel degree of the vLLM engine")
    max_model_len: int = _f(2048, "context length (prompt + completion) in tokens")
    max_num_seqs: int = _f(256, "most requests in one running batch")
    block_size: int = _f(16, "KV-cache block size in tokens")
    kv_cache_memory_bytes: int = _f(256 * 2**20, "KV-cache memory for the vLLM engine on CPU, bytes (on a GPU "
                                    "--gpu-memory-utilization sizes it)")
    gpu_memory_utilization: float = _f(0.9, "fraction of GPU memory vLLM may use (GPU only)")
    enable_prefix_caching: bool = _f(True, "reuse KV blocks of shared prompt prefixes")
    compact_json: bool = _f(
        True, "structured JSON output has no whitespace between its tokens (vLLM's structured-outputs "
        "disable_any_whitespace; vLLM's default is off): otherwise a model, a small one most, can fill "
        "an answer with whitespace and never close it")
    kv_events: bool = _f(
        True, "stream the engine's KV-cache events (blocks cached / evicted) to the router, for "
        "kv-aware routing (vLLM: its KV-event publisher; sim: its block pool)",
    )
    tool_call_parser: str = _f(
        "", "vLLM's tool-call parser for tool_choice \"auto\", as `vllm serve --tool-call-parser` names them "
        "(hermes, llama3_json, pythonic, deepseek_v3, ...; the vllm engine only); '': none, \"auto\" is refused")
    reasoning_parser: str = _f(
        "", "vLLM's reasoning parser, as `vllm serve --reasoning-parser` names them (deepseek_r1, qwen3, "
        "deepseek_v3, ...; the vllm engine only): a chat answer's thinking comes back apart, as `reasoning`, "
        "and structured outputs constrain what follows it; '': none (the thinking is content)")
    swap_space_gib: float = _f(0.0, "CPU swap space for preempted sequences, GiB (GPU only)")
    dtype: str = _f("auto", "model dtype (auto, float32, bfloat16, float16)")
    enforce_eager: bool = _f(False, "vLLM without torch.compile/CUDA graphs: starts ~2x faster, decodes ~25% slower")
    scheduling_policy: str = _f(
        "priority", "the engine's waiting queue: priority (lower request priority first, then arrival; vLLM's "
                    "--scheduling-policy priority) or fcfs (arrival only; the gateway's queue still orders by priority)",
        choices=("priority", "fcfs"),
    )
    engine_core_cpus: str = _f(
        "auto", "CPU platform: where vLLM's engine-core process runs — 'shared' with its model workers' "
        "CPUs, 'vllm' as vLLM places it (on its own reserved CPU), 'auto': shared on machines with "
        "4 or fewer CPUs, where its busy-wait would otherwise starve the rest of the mesh",
        choices=ENGINE_CORE_PLACEMENTS,
    )
    engine_priority: str = _f(
        "auto", "CPU platform: scheduling priority of vLLM's engine processes (model workers, engine "
        "core) — 'low' (nice 10) lets the serving path on the same CPUs (this worker's API, the "
        "gateway, Envoy) run first, 'normal' leaves it, 'auto': low on machines with 4 or fewer CPUs",
        choices=ENGINE_PRIORITIES,
    )
    enable_lora: bool = _f(False, "serve LoRA adapters on top of the model (vLLM's --enable-lora)")
    max_loras: int = _f(
        1, "LoRA: adapter slots, the most adapters in one running batch (vLLM's --max-loras)", minimum=1)
    max_lora_rank: int = _f(
        16, "LoRA: the largest adapter rank the slots hold (vLLM's --max-lora-rank)", choices=LORA_RANKS)
    max_cpu_loras: int = _f(
        0, "LoRA: the most adapters kept loaded in CPU memory, at least --max-loras (vLLM's --max-cpu-loras; "
           "0: --max-loras)", minimum=0)
    lora_modules: list[str] = _f(
        [], "LoRA: the adapters served, each name=path (a PEFT folder; `meshserve make-adapter` makes small ones "
            "for the tiny model); a request whose model is a name gets its adapter (vLLM's --lora-modules)",
        nargs="*")
    max_queue: int = _f(1024, "most requests admitted to the worker at once; beyond: RESOURCE_EXHAUSTED")
    stream_interval: int = _f(
        1, "tokens per streamed chunk after the first (vLLM's stream_interval); a request may ask for "
        "more, never fewer. Larger: less CPU per token at every hop, burstier streams", minimum=1,
    )
    load_report_interval_s: float = _f(0.1, "longest gap between two load reports")
    load_report_min_interval_s: float = _f(
        0.05, "shortest gap between two load reports: the load and KV-cache changes of each gap go "
        "out as one report (a busy engine changes both every step)", minimum=0.0,
    )
    # Simulator parameters; defaults approximate an 8B model on one H100 (see docs/operations.md).
    sim_prefill_ms_per_token: float = _f(0.06, "sim: prefill cost per uncached prompt token, ms")
    sim_itl_base_ms: float = _f(7.0, "sim: inter-token latency of a batch of one, ms")
    sim_itl_per_seq_ms: float = _f(0.05, "sim: added inter-token latency per running sequence, ms")
    sim_num_kv_blocks: int = _f(30000, "sim: KV-cache blocks in the pool")
    sim_max_num_batched_tokens: int = _f(
        8192, "sim: most tokens one step computes (vLLM's max_num_batched_tokens, its default for an API "
        "server on an H100): a longer prefill goes in chunks over several steps while the running requests "
        "decode; 0: no budget, every prompt prefilled in one step", minimum=0,
    )
    sim_seed: int = _f(0, "sim: seed of the simulated token stream")
    # LoRA costs (docs/operations.md, "The simulator's LoRA adapters" says where they come from).
    sim_lora_load_ms: float = _f(
        5.0, "sim: bringing a LoRA adapter from CPU memory into a free or evicted adapter slot, ms (the "
        "step that first runs it lasts this much longer)", minimum=0.0,
    )
    sim_lora_disk_load_ms: float = _f(
        50.0, "sim: reading a LoRA adapter from disk into CPU memory first, when it is not among the "
        "--max-cpu-loras held there, ms", minimum=0.0,
    )
    sim_lora_step_overhead: float = _f(
        0.2, "sim: a step whose batch runs any LoRA adapter costs this fraction more (the LoRA kernels beside "
        "the base model's)", minimum=0.0,
    )
    sim_lora_adapter_ms: float = _f(
        0.05, "sim: added step time per distinct LoRA adapter in the batch, ms (each adapter's weights are "
        "read every step)", minimum=0.0,
    )
    sim_speed: float = _f(
        1.0, "sim: speed of the simulated accelerator (0.5: every step takes twice as long)", minimum=0.01,
    )

    def __post_init__(self) -> None:
        problems = []
        if self.lora_modules and not self.enable_lora:
            problems.append("--lora-modules needs --enable-lora")
        try:
            self.adapters()
        except ValueError as e:
            problems.append(str(e))
        if self.max_cpu_loras and self.max_cpu_loras < self.max_loras:
            problems.append(f"--max-cpu-loras ({self.max_cpu_loras}) must be at least --max-loras ({self.max_loras})")
        if problems:
            raise ValueError("; ".join(problems))

    def served_name(self) -> str:
        """The name requests give for the model: --served-model-name, else --model as given, else
        the engine's default model's (the simulator's own, the tiny model's)."""
        return self.served_model_name or self.model or (SIM_MODEL if self.engine == "sim" else DEFAULT_MODEL)

    def adapters(self) -> dict[str, str]:
        """The LoRA adapters of --lora-modules, name -> path, in their order; ValueError naming an
        entry that is not name=path, or a name given twice."""
        adapters: dict[str, str] = {}
        for entry in self.lora_modules:
            name, sep, path = entry.partition("=")
            if not sep or not name.strip() or not path.strip():
                raise ValueError(f"--lora-modules takes name=path entries, not {entry!r}")
            if name in adapters:
                raise ValueError(f"--lora-modules names the adapter {name!r} twice")
            adapters[name] = path
        return adapters

    @property
    def cpu_loras(self) -> int:
        """Adapters kept loaded in CPU memory (--max-cpu-loras, else --max-loras)."""
        return self.max_cpu_loras or self.max_loras


@dataclass
class RoutingConfig:
    """How workers are found and picked: the router's settings, and a gateway's with ``--router
    embedded`` (it picks in its own process, watching the workers itself)."""

    workers: list[str] = _f([], "worker addresses host:port (static discovery)", nargs="*")
    discovery: str = _f(
        "static", "how the router finds its workers: static (--workers) or kubernetes (the ready endpoints "
        "of --kubernetes-service, followed through the Kubernetes API)", choices=DISCOVERY_MODES,
    )
    kubernetes_service: str = _f("", "kubernetes discovery: the workers' headless Service (required)")
    kubernetes_namespace: str = _f(
        "", "kubernetes discovery: the Service's namespace ('': the router pod's own, else 'default')"
    )
    kubernetes_port: str = _f("grpc", "kubernetes discovery: the name of the Service's port for the workers' gRPC")
    routing: str = _f(
        "kv-aware", "routing policy (docs/operations.md, 'Routing policies')", choices=ROUTING_POLICIES,
    )
    load_bound: float = _f(
        1.25, "prefix and session policies: a worker may take a request while it would hold at most "
        "this many times the average outstanding requests", minimum=1.0,
    )
    kv_load_weight: float = _f(
        0.3, "kv-aware / approx-prefix: weight of relative load against the cached fraction of the "
        "prompt (1)", minimum=0.0,
    )
    kv_home_weight: float = _f(
        0.0, "kv-aware: weight of the prompt's text-hash home worker (prefix-affinity's choice), "
        "which decides where a prompt that no engine holds is computed", minimum=0.0,
    )
    kv_full_usage: float = _f(
        0.95, "kv-aware: a worker whose KV cache is at least this full while its engine queues requests gets "
        "credit for its cached blocks only in the share of its requests it runs (0: off)", minimum=0.0,
    )
    kv_adapter_weight: float = _f(
        1.5, "kv-aware: weight of a worker's LoRA adapter slots for a request on an adapter: 1 when they hold it, "
        "half when one is free, 0 when it must evict another adapter (0: off); above 1 + --kv-load-weight, "
        "a slot that holds the adapter outweighs a prompt's text-hash home and load", minimum=0.0,
    )
    kv_pending_s: float = _f(
        10.0, "kv-aware routing: how long the router counts a prompt it sent as cached on its worker "
        "before the worker's KV events confirm it (they follow the prefill)",
    )
    approx_blocks_per_worker: int = _f(
        30000, "approx-prefix routing: KV blocks the router assumes each worker keeps (its own record "
        "of the prompts it sent forgets the oldest beyond this)", minimum=1,
    )
    stale_after_s: float = _f(
        2.0, "a worker with no load report for this long is late: picked only when no worker is fresh"
    )
    lost_after_s: float = _f(
        10.0, "a worker whose load stream is silent this long is lost: not picked, its stream reopened"
    )
    fleet_reports_per_s: float = _f(
        1000.0, "most load reports a second asked of all the workers together: a worker of a larger fleet is "
        "asked for one every workers / this seconds at most (at most a quarter of --stale-after-s), so that "
        "reading them leaves the router's core to the picks; its picks between reports still count",
        minimum=1.0,
    )

    def check_routing(self) -> None:
        """Settings that contradict each other: refused together, as argparse refuses a bad value."""
        problems = []
        if self.discovery == "kubernetes" and not self.kubernetes_service:
            problems.append("--discovery kubernetes needs --kubernetes-service (the workers' headless Service)")
        if self.discovery == "kubernetes" and self.workers:
            problems.append("--workers are static discovery: with --discovery kubernetes the Service lists them")
        if problems:
            raise ValueError("; ".join(problems))


ROUTING_FIELDS = tuple(f.name for f in dataclasses.fields(RoutingConfig))
EMBEDDED_ROUTER = "embedded"  # GatewayConfig.router: the gateway picks in its own process


@dataclass
class RouterConfig(ServerConfig, RoutingConfig):
    """The router: picks a worker per request from live load and prefix affinity."""

    port: int = _f(50052, "gRPC port (0 picks a free port)")

    def __post_init__(self) -> None:
        self.check_routing()


@dataclass
class CacheConfig(ServerConfig):
    """The response cache: finished deterministic completions in Redis/Valkey."""

    port: int = _f(50053, "gRPC port (0 picks a free port)")
    redis_url: str = _f(
        "redis://127.0.0.1:6379/0", "Redis/Valkey URL (redis://:PASSWORD@HOST:PORT/DB)", env=REDIS_URL_ENV
    )
    ttl_seconds: int = _f(3600, "how long a cached completion lives")
    key_prefix: str = _f(CACHE_KEY_PREFIX, "prefix of every cache key")
    max_entry_bytes: int = _f(1 << 20, "largest entry stored; larger completions are not cached (counted)")
    semantic: bool = _f(True, "also answer the same question asked in other words (embeddings + guards)")
    semantic_judge: bool = _f(
        False, "decide semantic hits by the learned judge (cache_service/data/judge.json: the certain guards, "
        "then a logistic regression over the cosine and how the prompts' words differ) instead of the three "
        "cosine thresholds below and every guard"
    )
    semantic_threshold: float = _f(
        0.70, "cosine similarity a semantic hit needs when the two prompts have the same content words (another "
        "order, other function words, typos), besides the guards (see docs/operations.md)"
    )
    semantic_threshold_added: float = _f(
        0.90, "cosine similarity a semantic hit needs when one prompt has content words the other lacks"
    )
    semantic_threshold_swapped: float = _f(
        0.95, "cosine similarity a semantic hit needs when each prompt has content words the other lacks"
    )
    semantic_max_entries: int = _f(100_000, "most entries in each replica's semantic index (oldest dropped first)")
    embed_threads: int = _f(1, "CPU threads of the embedding model")
    embed_runtime: str = _f(
        "onnx", "what runs the embedding model: onnx (ONNX Runtime; exported once to the cache dir, the same "
        "vectors in less than half the time per text), onnx-int8 (the same network with int8 weights: about "
        "half the time again, vectors within cosine 0.98) or torch (sentence-transformers)", choices=EMBED_RUNTIMES,
    )
    semantic_budget_s: float = _f(
        0.05, "longest a lookup waits for its embedding; a busier embedder makes it a miss (counted)"
    )


@dataclass
class RequestLimits:
    """What one request may hold: checked by the gateway before any work is done on it (before the
    cache, the router or a worker sees it), and refused with INVALID_ARGUMENT (HTTP 400) naming
    the field past its bound."""

    max_message_bytes: int = _f(
        2**20, "largest request message the gateway's gRPC server reads; gRPC refuses a larger one "
        "(RESOURCE_EXHAUSTED) from its length prefix, before it is read. Envoy streams gRPC through "
        "unbuffered, so its --max-request-bytes bounds only HTTP bodies: this is the gRPC side's bound, "
        "Envoy's default body limit", minimum=64 * 2**10)
    max_prompt_bytes: int = _f(
        512 * 2**10, "a prompt's text, or a chat's messages' text together, in UTF-8 bytes: a 128k-token "
        "context (the longest most served models take) at ~4 bytes a token; a longer prompt would be "
        "tokenized by the router and a worker only to be refused. Below --max-message-bytes, so that a "
        "request at every bound here fits in a message", minimum=1)
    max_messages: int = _f(2048, "chat messages in one request (OpenAI's limit)", minimum=1)
    max_stop: int = _f(4, "stop strings in one request (OpenAI's limit: each is matched against the output "
                          "after every token)", minimum=0)
    max_logit_bias: int = _f(300, "logit_bias entries in one request (OpenAI's limit)", minimum=0)
    max_tools: int = _f(128, "tools (functions) in one request (OpenAI's limit)", minimum=0)
    max_schema_bytes: int = _f(
        64 * 2**10, "a structured-output constraint (JSON schema, regex, grammar or choices), the tools' JSON "
        "and chat_template_kwargs, each in bytes: checking a JSON schema costs ~5 ms per KiB and the "
        "worker's grammar backend compiles it again; 64 KiB holds a schema of ~1,000 properties with short "
        "descriptions", minimum=1)
    max_json_depth: int = _f(
        32, "deepest nesting of a JSON schema, the tools or chat_template_kwargs (objects and arrays): "
        "OpenAI's structured outputs allow 10 levels of schema nesting (~21 JSON levels); an OpenAI request "
        "carries them as protobuf Structs, which protobuf's parser reads only to ~32 levels of objects",
        minimum=1)
    max_request_id_chars: int = _f(
        256, "a client's request_id, in characters: it is echoed in every chunk of the answer and in the "
        "logs (a UUID has 36)", minimum=1)


REQUEST_LIMIT_FIELDS = tuple(f.name for f in dataclasses.fields(RequestLimits))


# The OpenAI paths whose streams a gateway's HTTP edge serves (GatewayConfig.http_port), each
# under the path Envoy's Lua filter sends a ``"stream": true`` body to when the edge is on: one
# the transcoder does not know, so it passes the request through untranscoded.
HTTP_EDGE_PATHS = {"/v1/chat/completions": "/v1/chat/completions:sse", "/v1/completions": "/v1/completions:sse"}


@dataclass
class GatewayConfig(ServerConfig, RoutingConfig, RequestLimits):
    """The gateway: cache lookup -> route -> stream from a worker -> store."""

    port: int = _f(50051, "gRPC port (0 picks a free port)")
    http_port: int = _f(
        -1, "also serve the streaming OpenAI paths over HTTP/1.1 on this port, for Envoy to proxy untranscoded "
            "(its envoy --http-gateways): a chunk written to HTTP costs the gateway about a third of a gRPC "
            "message (-1: off; 0 picks a free port)")
    router: str = _f(
        "127.0.0.1:50052", f"router address host:port, or '{EMBEDDED_ROUTER}': pick in this process from its own "
                           "watch of the workers (the routing flags: --workers, --routing, ...), no router service "
                           "and no hop per pick; each gateway then counts only its own picks")
    cache: str = _f("127.0.0.1:50053", "cache address host:port ('' disables the cache)")
    redis_url: str = _f(
        "", "the mesh's (and the cache's) Redis/Valkey URL: the gateway reads and writes exact entries there "
            "itself, a hop fewer per lookup and per store (the cache service indexes them by meaning and answers "
            "semantic lookups), and shares the tenants' limits and the usage ledger there with the other "
            "gateways; '': the cache service is asked for both, and the limits and usage are this gateway's own",
        env=REDIS_URL_ENV)
    tenant_key_prefix: str = _f("meshserve:tenants:", "prefix of the tenants' limit and usage keys in --redis-url")
    limits_timeout_s: float = _f(
        0.25, "a tenant's limits wait for Redis this long at most; then (and for a second) this gateway decides "
             "alone with its --flow-fleet-share of each limit (see docs/operations.md)")
    cache_key_prefix: str = _f(CACHE_KEY_PREFIX, "the cache service's key prefix (its --key-prefix), for --redis-url")
    cache_ttl_seconds: int = _f(3600, "how long an entry the gateway writes lives (the cache's --ttl-seconds)")
    cache_max_entry_bytes: int = _f(
        1 << 20, "largest entry the gateway writes; larger completions are not cached (the cache's --max-entry-bytes)"
    )
    model: str = _f(DEFAULT_MODEL, "model name clients may send (requests naming another model are refused)")
    max_in_flight: int = _f(2048, "most streams the gateway serves at once; beyond: RESOURCE_EXHAUSTED")
    cache_timeout_s: float = _f(0.3, "give up on a cache call after this long (serve uncached)")
    first_token_timeout_s: float = _f(60.0, "a worker that sends nothing for this long counts as failed")
    api_keys_file: str = _f(
        "", "the API keys file Envoy authenticates with: the gateway reads each tenant's settings from it "
            "(weight, priority, limits; services/tenants.py); empty: every tenant has the defaults"
    )
    allow_runtime_lora_updating: bool = _f(
        False, "serve /v1/load_lora_adapter and /v1/unload_lora_adapter: LoRA adapters loaded and unloaded across "
               "the fleet while it serves (vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING); with API keys, only for a "
               "tenant whose line of --api-keys-file says admin=1")
    lora_registry: str = _f(
        "", "LoRA adapters served on demand: a folder whose subfolders are adapters (named by their folder, as "
            "vLLM's filesystem resolver reads them) or a file of name=path lines; a request naming one no worker "
            "holds goes to a worker with LoRA enabled, which loads it first (paths as the workers see them)")
    adapter_change_timeout_s: float = _f(
        30.0, "a worker loading or unloading a LoRA adapter is waited for this long, and the fleet view showing "
              "the change after it (both within Envoy's --unary-timeout-s)", minimum=0.0)
    flow_control: str = _f(
        "on", "while the fleet is saturated, requests wait in the gateway in fair per-tenant queues within "
              "priority bands instead of in the engines' queues (off: first come, first served)",
        choices=("on", "off"),
    )
    flow_fleet_share: float = _f(
        1.0, "the share of the fleet's sequences this gateway may keep busy (1/N of N gateways)", minimum=0.0
    )
    flow_headroom: float = _f(
        0.1, "requests a worker may hold beyond its running batch, as a fraction of its max_num_seqs: its next "
             "request is there when one ends", minimum=0.0
    )
    flow_max_queued: int = _f(4096, "most requests waiting in the gateway for a place; beyond: RESOURCE_EXHAUSTED",
                              minimum=1)
    flow_max_wait_s: float = _f(
        60.0, "a request that would wait longer than this for a place is refused at once (RESOURCE_EXHAUSTED, "
              "retry-after); one that does wait this long is refused then"
    )
    pick_timeout_s: float = _f(
        1.0, "the router's pick is waited for this long; later, the request goes to the least busy worker of "
             "the fleet view at once (and the router drops the pick when it reads it late)"
    )
    coalesce: bool = _f(
        True, "identical deterministic requests in flight share one generation (followers stream the first's tokens)"
    )
    cache_mode: str = _f(
        "semantic", "response cache of requests that do not choose: semantic, exact or off",
        choices=("semantic", "exact", "off"),
    )
    cache_breaker_failures: int = _f(3, "consecutive failed cache calls that open the breaker (no cache calls)")
    cache_breaker_s: float = _f(2.0, "how long an open breaker skips the cache before trying it again")
    stall_timeout_s: float = _f(
        2.0, "a worker that answers no keepalive ping for this long is taken for frozen (SIGSTOP, a hung "
             "host): its connection is closed and its streams move to other workers (0: no pings)"
    )
    migrations: int = _f(
        3, "most times one stream moves to another worker when its worker is lost mid-stream (0: such a "
           "stream fails with UNAVAILABLE)"
    )
    migration_timeout_s: float = _f(
        60.0, "a migrated stream fails unless its continuation's first token comes within this long of the loss "
              "(a fleet that lost a worker queues its streams on the others: on a busy fleet that takes seconds)"
    )

    def __post_init__(self) -> None:
        if self.router == EMBEDDED_ROUTER:
            self.check_routing()
        if self.redis_url and not self.cache:
            raise ValueError("--redis-url is the cache's Redis: it needs the cache service (--cache), which "
                             "stores the entries the gateway reads there")


@dataclass
class TracesConfig(ServerConfig):
    """The local trace receiver: OTLP/gRPC in, recent traces kept in memory for `meshserve trace`."""

    port: int = _f(4317, "gRPC port of the OTLP receiver and the trace query service (0 picks a free port)")
    max_traces: int = _f(2000, "most traces kept; the oldest are dropped first")
    max_spans_per_trace: int = _f(1000, "most spans kept per trace")


@dataclass
class EnvoyConfig:
    """The Envoy front proxy generated by deploy/envoy_config.py."""

    listen_host: str = _f("127.0.0.1", "Envoy listener address")
    listen_port: int = _f(8080, "Envoy listener port (gRPC and HTTP/JSON)")
    admin_port: int = _f(9901, "Envoy admin port (loopback only)")
    stats_port: int = _f(
        0, "a listener on listen_host serving only Envoy's Prometheus stats (/stats/prometheus), for a "
           "Prometheus outside the host or pod, while the admin port stays on loopback (0: none)")
    gateways: list[str] = _f(["127.0.0.1:50051"], "gateway addresses host:port", nargs="*")
    http_gateways: list[str] = _f(
        [], "the gateways' HTTP edges host:port (their --http-port): streaming OpenAI requests are proxied there "
            "as HTTP instead of transcoded to gRPC (empty: every request is transcoded)", nargs="*")
    max_connections: int = _f(1024, "circuit breaker: most connections to the gateways")
    max_pending_requests: int = _f(1024, "circuit breaker: most requests waiting for a connection")
    max_requests: int = _f(4096, "circuit breaker: most concurrent requests to the gateways")
    gateway_max_in_flight: int = _f(
        0, "the gateways' total max_in_flight: caps max_requests, so Envoy itself refuses the excess "
           "(429 / RESOURCE_EXHAUSTED + retry-after) before it reaches a gateway (0: unknown, no cap)"
    )
    stream_idle_timeout_s: float = _f(300.0, "reset a stream with no data for this long")
    max_stream_duration_s: float = _f(600.0, "longest a stream may last")
    unary_timeout_s: float = _f(120.0, "timeout of unary calls")
    max_request_bytes: int = _f(1024 * 1024, "largest HTTP/JSON request body; beyond: 413")
    http2_max_concurrent_streams: int = _f(
        100, "most streams a client may have open on one HTTP/2 connection (Envoy's edge guide; "
             "`meshserve bench` opens a connection per 100 users)", minimum=1)
    request_headers_timeout_s: float = _f(10.0, "a client must have sent a request's headers within this long")
    max_heap_bytes: int = _f(
        2**30, "Envoy's heap bound: past 95% of it Envoy returns free memory to the system, past 98% it refuses "
               "new requests (503); keep it below the memory limit of Envoy's container", minimum=64 * 2**20)
    api_keys_file: str = _f(
        "", "bearer API keys, one 'KEY TENANT' per line ('#' comments); empty (and no MESHSERVE_API_KEYS): no auth"
    )
    tls_cert: str = _f("", "a PEM certificate chain: the listener serves TLS with it (HTTPS, gRPC over TLS; HTTP/2 "
                           "or HTTP/1.1 by ALPN), and plain connections are refused; empty: plain text")
    tls_key: str = _f("", "the PEM private key of --tls-cert")
    tls_client_ca: str = _f("", "PEM CA certificates: with TLS, every client must present a certificate one of "
                                "them signed (mutual TLS at the edge); empty: no client certificate asked")
    mesh_tls_dir: str = _f(
        "", "mutual TLS to the gateways: a directory with the edge's certificate (tls.crt, tls.key; its common name "
        f"is {EDGE_IDENTITY}, the only caller a gateway takes a tenant from) and the mesh CA's (ca.crt), which "
        "each gateway's certificate must chain to; '': plaintext to the gateways")
    rate_limit_requests: int = _f(0, "global rate limit: requests per window for all clients together (0: off)")
    rate_limit_per_key_requests: int = _f(0, "per-API-key (tenant) rate limit: requests per window (0: off)")
    rate_limit_window_s: float = _f(1.0, "the rate-limit window (token bucket refill interval), seconds")
    otlp_endpoint: str = _f("", "OTLP/gRPC trace collector host:port for Envoy's spans; empty: Envoy does not trace")
    trace_sampling_ratio: float = _f(1.0, "fraction of requests Envoy starts a sampled trace for")


def add_arguments(
    parser: argparse.ArgumentParser, cls: type, skip: tuple[str, ...] = (),
    only: Callable[[str], bool] = lambda name: True, environ: Mapping[str, str] | None = None,
) -> None:
    """Adds one ``--flag`` per dataclass field (those ``only`` accepts), with the field's help
    text and default; a field naming an ``env`` variable set in ``environ`` defaults to its value
    (the flag still wins)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or not only(f.name):
            continue
        flag = "--" + f.name.replace("_", "-")
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        typ = hints[f.name]
        # argparse expands %-formats in help texts: a literal '%' ("~25% slower") must be doubled.
        shown = f"${f.metadata['env']}, else {default!r}" if "env" in f.metadata else repr(default)
        help_text = f"{f.metadata['help']} (default: {shown})".replace("%", "%%")  # never the variable's value
        if "env" in f.metadata and environ and f.metadata["env"] in environ:
            default = environ[f.metadata["env"]]
        kw: dict[str, Any] = {"default": default, "help": help_text}
        if typ is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(typ) is list:
            kw["nargs"] = f.metadata.get("nargs", "*")
            kw["type"] = typing.get_args(typ)[0]
        elif isinstance(typ, types.UnionType):
            kw["type"] = str
        else:
            kw["type"] = typ
        if "minimum" in f.metadata:
            kw["type"] = at_least(typ, f.metadata["minimum"])
        if "choices" in f.metadata:
            kw["choices"] = f.metadata["choices"]
        parser.add_argument(flag, dest=f.name, **kw)


def field_of(cls: type, name: str) -> dataclasses.Field[Any]:
    """The field ``name`` of dataclass ``cls``: for a flag declared by hand that takes its help
    text, default or bounds from it."""
    return next(f for f in dataclasses.fields(cls) if f.name == name)


def at_least(typ: Callable[[str], Any], minimum: Any) -> Callable[[str], Any]:
    """An argparse type: ``typ``, refused below ``minimum`` with a message naming the bound."""
    def parse(text: str) -> Any:
        value = typ(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


def from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Builds ``cls`` from the parsed flags that ``add_arguments`` added."""
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(cls) if hasattr(args, f.name)}
    return cls(**values)


def to_argv(cfg: Any, env: dict[str, str] | None = None) -> list[str]:
    """The flags that rebuild ``cfg`` in another process (the launcher uses it). With ``env``, a
    field that may come from the environment (a Redis URL and its password) goes there instead:
    a command line is visible to anyone who lists the processes."""
    argv: list[str] = []
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        flag = "--" + f.name.replace("_", "-")
        if env is not None and "env" in f.metadata:
            env[f.metadata["env"]] = str(value)
            continue
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + f.name.replace("_", "-"))
        elif isinstance(value, list):
            argv += [flag, *map(str, value)]
        else:
            argv += [flag, str(value)]
    return argv
