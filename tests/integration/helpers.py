"""Helpers for tests that run the mesh as real processes."""

from __future__ import annotations

import asyncio
import dataclasses
import re
import subprocess
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import grpc
import httpx
import openai
import prometheus_client
import pytest
import yaml

from meshserve.commands.launcher import MeshSpec, WorkerGroup
from meshserve.deploy import envoy_config as envoy
from meshserve.services.config import CacheConfig, EnvoyConfig, GatewayConfig, RouterConfig, TracesConfig, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.mesh_tls import MeshTls
from meshserve.services.server import insecure_channel, mesh_channel
from tests.conftest import free_port, free_port_block


def mesh_spec(run_dir: Path, engine: str, *, workers: int = 1, grace_seconds: float = 2,
              worker: WorkerConfig | None = None, gateway: GatewayConfig | None = None,
              envoy: EnvoyConfig | None = None, cache: CacheConfig | None = None,
              router: RouterConfig | None = None, groups: Sequence[WorkerGroup] = (), **spec: object) -> MeshSpec:
    """A mesh for one test module: every service on free ports (workers on a block of them),
    short grace periods; ``worker``/``gateway``/``envoy``/``cache``/``router`` give other settings (their ports are
    replaced), ``groups`` worker groups instead of ``workers`` workers, ``spec`` other MeshSpec fields."""
    grace = {"grace_seconds": grace_seconds}
    return MeshSpec(
        engine=engine,
        workers=workers,
        groups=[WorkerGroup(g.workers, dataclasses.replace(g.worker, **grace)) for g in groups],
        redis_port=free_port(),
        run_dir=run_dir,
        worker=dataclasses.replace(worker or WorkerConfig(), port=free_port_block(
            sum(g.workers for g in groups) or workers), **grace),
        router=dataclasses.replace(router or RouterConfig(), port=free_port(), **grace),
        cache=dataclasses.replace(cache or CacheConfig(), port=free_port(), **grace),
        gateway=dataclasses.replace(gateway or GatewayConfig(), port=free_port(), **grace),
        envoy=dataclasses.replace(envoy or EnvoyConfig(), listen_port=free_port(), admin_port=free_port()),
        traces=TracesConfig(port=free_port(), grace_seconds=1),
        **{"ready_timeout_s": 120, **spec},
    )


def index_blocks(view: str = "kv") -> float | None:
    """The gauge of the blocks in the KV index of a router running in this process (its metrics
    are this process's registry's); ``pending``: the blocks of the prompts it sent that the
    workers have not reported yet."""
    return prometheus_client.REGISTRY.get_sample_value("meshserve_router_kv_index_blocks", {"view": view})


def prefix_view_ready() -> float | None:
    """1 once a router running in this process hashes prompts with its workers' tokenizer."""
    return prometheus_client.REGISTRY.get_sample_value("meshserve_router_prefix_view_ready")


def scrape(url: str) -> dict[str, float]:
    """Prometheus text -> {'name{labels}': value} (labels exactly as exported)."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def metric_sum(metrics: dict[str, float], name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include ``labels``."""
    total = 0.0
    for key, value in metrics.items():
        m = re.fullmatch(rf"{re.escape(name)}(\{{(.*)\}})?", key)
        if m and all(f'{k}="{v}"' in (m.group(2) or "") for k, v in labels.items()):
            total += value
    return total


def exact_entries(redis_url: str, prefix: str = CacheConfig.key_prefix) -> int:
    """Exact cache entries in Redis now (the gateway writes them there itself): the cache's own
    state, not a counter of the mesh's."""
    import redis  # noqa: PLC0415

    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        return sum(1 for _ in client.scan_iter(match=f"{prefix}exact:*", count=1000))
    finally:
        client.close()


def indexed_texts(redis_url: str, prefix: str = CacheConfig.key_prefix) -> set[str]:
    """The texts Redis holds records of by meaning (the cache service's ``semvec`` hashes, which
    every replica's index loads): the cache's own state."""
    import redis  # noqa: PLC0415

    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    try:
        keys = list(client.scan_iter(match=f"{prefix}semvec:*", count=1000))
        return {text.decode() for key in keys if (text := client.hget(key, "text")) is not None}
    finally:
        client.close()


async def wait_until(predicate, timeout: float, what: str, interval: float = 0.05) -> None:  # noqa: ANN001
    """Polls an observable condition (a metric, a load report) until it holds or time runs out."""
    deadline = time.monotonic() + timeout
    while True:
        if await asyncio.to_thread(predicate):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


async def until(condition: Callable[[], Awaitable[bool]], what: str, timeout: float = 5.0) -> None:
    """Awaits an observable condition (a listing, a metric) until it holds; fails after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await condition():
        if loop.time() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def unknown_model_messages(envoy_address: str, model: str) -> list[str]:
    """Asks Envoy's OpenAI edge for ``model``, which the mesh does not serve, as a chat (whole and
    streamed) and by GET /v1/models/<model>: each must be a 404 in OpenAI's shape naming the
    'model' parameter; their messages, for the caller to check."""
    client = openai.AsyncOpenAI(base_url=f"http://{envoy_address}/v1", api_key="unused", max_retries=0)
    messages = []
    for stream in (False, True):
        with pytest.raises(openai.NotFoundError) as missing:
            await client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=2, stream=stream)
        assert missing.value.status_code == 404 and missing.value.body["param"] == "model"
        messages.append(missing.value.message)
    async with httpx.AsyncClient(base_url=f"http://{envoy_address}", timeout=30) as http:
        retrieved = await http.get(f"/v1/models/{model}")
    assert retrieved.status_code == 404
    return [*messages, retrieved.json()["error"]["message"]]


async def until_router_hears(channel: grpc.aio.Channel, workers: int, timeout: float = 5.0) -> None:
    """Awaits the router behind ``channel`` (a gateway's, embedded, or its own) listing ``workers``
    healthy workers."""
    router = pb_grpc.RouterStub(channel)

    async def all_heard() -> bool:
        listed = (await router.ListWorkers(pb.ListWorkersRequest(), timeout=timeout)).workers
        return len(listed) == workers and all(w.healthy for w in listed)

    await until(all_heard, f"the router to hear from {workers} workers", timeout)


async def generate(target: str, **fields: object) -> list[pb.GenerateResponse]:
    async with insecure_channel(target) as channel:
        return [c async for c in pb_grpc.InferenceStub(channel).Generate(pb.GenerateRequest(**fields))]


async def worker_generate(target: str, tls: MeshTls | None = None, **fields: object) -> list[pb.GenerateResponse]:
    """A worker's stream, called directly (over mutual TLS with ``tls``)."""
    async with mesh_channel(target, tls) as channel:
        return [c async for c in pb_grpc.WorkerStub(channel).Generate(pb.GenerateRequest(**fields))]


def token_ids(chunks: list[pb.GenerateResponse]) -> list[int]:
    return [t for c in chunks for t in c.token_ids]


def text(chunks: list[pb.GenerateResponse]) -> str:
    return "".join(c.text for c in chunks)


async def invalid_argument(target: str, **fields: object) -> str:
    """Sends a request that must fail with INVALID_ARGUMENT; returns the message."""
    try:
        await generate(target, **fields)
    except grpc.aio.AioRpcError as e:
        assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, (e.code(), e.details())
        return e.details() or ""
    raise AssertionError(f"request {fields} was accepted")


@contextmanager
def run_envoy(cfg: EnvoyConfig, path: Path, bootstrap: dict | None = None) -> Iterator[str]:
    """The real Envoy on a config generated from ``cfg`` (or on ``bootstrap``, a config built from
    it and changed); yields its listener's host:port."""
    if bootstrap is None:
        envoy.write_config(cfg, path)
    else:
        path.write_text(yaml.safe_dump(bootstrap, sort_keys=False))
    proc = subprocess.Popen(envoy.command(path), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:  # readiness probe of Envoy's admin endpoint (startup takes ~0.1 s)
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else "Envoy exited"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{cfg.admin_port}/ready", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                assert time.monotonic() < deadline, "Envoy never became ready"
                time.sleep(0.05)
        yield f"{cfg.listen_host}:{cfg.listen_port}"
    finally:
        proc.terminate()
        proc.wait(10)
