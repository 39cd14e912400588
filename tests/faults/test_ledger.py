"""The usage ledger after a mixed run equals, token for token, the usage the clients received.

A sim mesh with two gateways behind Envoy (their counts summed in the mesh's Redis) and two
tenants: streams cancelled part-way, a worker killed under streams that then migrate, n = 3,
exact and semantic hits and a coalesced burst. Each client's share is computed from what it
received (a stream's last usage, or the tokens it got before it left); `meshserve usage --json`
must then print the same, per tenant and by how each request was answered."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from meshserve.commands.launcher import Mesh
from meshserve.gateway.ledger import Tally
from meshserve.services.config import CacheConfig, EnvoyConfig, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import insecure_channel
from tests.integration.helpers import exact_entries, indexed_texts, mesh_spec, wait_until
from tests.service.test_usage_ledger import sent

pytestmark = pytest.mark.integration

KEYS = {"sk-alpha-0123456789": "alpha", "sk-beta-0123456789": "beta"}
ALPHA, BETA = KEYS
TIMEOUT_S = 60.0
Ledger = dict[str, dict[str, Tally]]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    keys = tmp_path_factory.mktemp("keys") / "api-keys.txt"
    keys.write_text("".join(f"{k} {t}\n" for k, t in KEYS.items()))
    # ~8 ms a token: a 150-token stream lasts over a second, long enough to kill its worker under it.
    spec = mesh_spec(tmp_path_factory.mktemp("faults-ledger"), "sim", workers=3, gateways=2,
                     worker=WorkerConfig(sim_itl_base_ms=8.0), cache=CacheConfig(semantic_budget_s=10.0),
                     envoy=EnvoyConfig(api_keys_file=str(keys)))
    with Mesh(spec) as m:
        yield m


class Run:
    """Requests through Envoy, and the usage each tenant's clients received."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.inference = pb_grpc.InferenceStub(channel)
        self.openai = pb_grpc.OpenAIStub(channel)
        self.expected: Ledger = defaultdict(lambda: defaultdict(Tally))

    @staticmethod
    def auth(key: str) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {key}"),)

    def count(self, key: str, chunks: list[pb.GenerateResponse]) -> str:
        """Adds what a Generate stream's client received; returns how it was answered."""
        answered, tally = sent(chunks)
        self.expected[KEYS[key]][answered] += tally
        return answered

    async def ask(self, key: str, prompt: str, **fields: object) -> list[pb.GenerateResponse]:
        request = pb.GenerateRequest(prompt=prompt, **{"max_tokens": 8, "temperature": 0, **fields})
        chunks = [c async for c in self.inference.Generate(request, metadata=self.auth(key), timeout=TIMEOUT_S)]
        self.count(key, chunks)
        return chunks


async def cancelled(run: Run, key: str, prompt: str) -> None:
    """A long stream the client leaves after its first chunk: that chunk comes alone and the next
    only with the whole rest of the stream (stream_interval), seconds later, so the gateway has
    sent exactly what the client has when the cancel reaches it."""
    request = pb.GenerateRequest(prompt=prompt, max_tokens=400, temperature=0, cache="off", stream_interval=1000)
    call = run.inference.Generate(request, metadata=run.auth(key), timeout=TIMEOUT_S)
    first = await call.read()
    assert isinstance(first, pb.GenerateResponse) and not first.finish_reason
    call.cancel()
    run.count(key, [first])


async def killed_under_streams(run: Run, mesh: Mesh, key: str) -> None:
    """Streams whose worker is killed once each has its first token: they migrate, and each
    client gets one usage, its last chunk's."""
    seen: asyncio.Queue[str] = asyncio.Queue()

    async def stream(i: int) -> list[pb.GenerateResponse]:
        request = pb.GenerateRequest(prompt=f"a long story number {i}", max_tokens=150, temperature=0, cache="off")
        chunks = []
        async for chunk in run.inference.Generate(request, metadata=run.auth(key), timeout=TIMEOUT_S):
            if not chunks:
                seen.put_nowait(chunk.worker)
            chunks.append(chunk)
        return chunks

    tasks = [asyncio.create_task(stream(i)) for i in range(9)]
    firsts = [await asyncio.wait_for(seen.get(), TIMEOUT_S) for _ in tasks]
    victim = max(set(firsts), key=firsts.count)
    proc = next(p for p in mesh.procs if p.name == victim)
    os.killpg(proc.popen.pid, signal.SIGKILL)
    answers = await asyncio.gather(*tasks)
    moved = [a for a in answers if a[0].worker == victim and a[-1].worker != victim]
    assert moved, "no stream moved off the killed worker"
    for chunks in answers:
        assert chunks[-1].usage.completion_tokens == 150 == sum(len(c.token_ids) for c in chunks)
        run.count(key, chunks)


async def hits(run: Run, mesh: Mesh, key: str) -> None:
    """A question stored, asked again until Redis answers it (coalesced meanwhile), then in other
    words until one is answered by meaning."""
    question = "What is the capital of France?"
    before = exact_entries(mesh.redis_url)
    assert not (await run.ask(key, question))[-1].cached
    await wait_until(lambda: exact_entries(mesh.redis_url) > before, 10, "the answer to be stored")
    async with asyncio.timeout(10):
        while (kind := run.count(key, await _generate(run, key, question))) != "exact":
            assert kind == "coalesced", kind
    await wait_until(lambda: question in indexed_texts(mesh.redis_url), 10, "the answer indexed by meaning")
    for paraphrase in ("what's the capital of france?", "What is the capital of France, please?",
                       "what is the capital of france"):
        if (await run.ask(key, paraphrase))[0].cache_kind == "semantic":
            return
    raise AssertionError("no paraphrase was answered by meaning")


async def _generate(run: Run, key: str, prompt: str) -> list[pb.GenerateResponse]:
    request = pb.GenerateRequest(prompt=prompt, max_tokens=8, temperature=0)
    return [c async for c in run.inference.Generate(request, metadata=run.auth(key), timeout=TIMEOUT_S)]


async def burst(run: Run, key: str) -> None:
    """Identical requests at once: one generation, the others coalesced on it (or, arriving after
    it was stored, exact hits)."""
    prompt = "a question many ask at once"
    answers = await asyncio.gather(*(_generate(run, key, prompt) for _ in range(8)))
    kinds = [run.count(key, chunks) for chunks in answers]
    assert "coalesced" in kinds, kinds


async def three_choices(run: Run, key: str) -> None:
    request = json_format.ParseDict({"prompt": "three ways to say hello", "max_tokens": 12, "temperature": 1.0,
                                     "n": 3}, pb.CompletionRequest())
    answer = await run.openai.Completions(request, metadata=run.auth(key), timeout=TIMEOUT_S)
    assert len(answer.choices) == 3
    u = answer.usage
    run.expected[KEYS[key]]["generated"] += Tally(1, u.prompt_tokens, u.completion_tokens,
                                                   u.prompt_tokens_details.cached_tokens)


def usage(mesh: Mesh) -> dict[str, object]:
    """`meshserve usage --json`, asking the first gateway (plaintext, as the mesh serves)."""
    out = subprocess.run([sys.executable, "-m", "meshserve.commands.cli", "usage", "--json", "--mesh-tls-dir", "",
                          "--target", mesh.gateway_addresses[0]], capture_output=True, text=True, timeout=60,
                         check=True, cwd=Path(__file__).parents[2])
    return json.loads(out.stdout)


def as_dicts(ledger: Ledger) -> dict[str, dict[str, dict[str, int]]]:
    return {tenant: {answered: vars(t) for answered, t in rows.items()} for tenant, rows in ledger.items()}


async def test_the_ledger_equals_the_usage_the_clients_received(mesh: Mesh) -> None:
    async with insecure_channel(mesh.envoy_address) as channel:
        run = Run(channel)
        await asyncio.gather(cancelled(run, ALPHA, "leave me early"), cancelled(run, BETA, "leave me too"))
        await killed_under_streams(run, mesh, ALPHA)
        await three_choices(run, BETA)
        await hits(run, mesh, BETA)
        await burst(run, ALPHA)
        await run.ask(BETA, "one more, generated", cache="off")

    want = {"shared": True, "tenants": as_dicts(run.expected)}
    # The gateways write their counts to Redis in batches, off the requests' path.
    try:
        await wait_until(lambda: usage(mesh) == want, 30, "the ledger to hold every request")
    except AssertionError:
        assert usage(mesh) == want  # shows where they differ
