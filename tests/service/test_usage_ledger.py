"""The usage ledger equals what the clients were sent: a generated answer, a stream cancelled
part-way, a coalesced request, exact and semantic hits and n = 3, per tenant and by how each
was answered, read through the gateway's admin service (summed in a real Valkey) and `meshserve
usage`."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections import defaultdict

import grpc
from google.protobuf import json_format

from meshserve.commands import usage_cmd
from meshserve.gateway.ledger import Tally
from meshserve.gateway.server import TENANT_METADATA
from meshserve.services.gen import meshserve_pb2 as pb
from tests.integration.helpers import until
from tests.service.test_gateway import (  # noqa: F401
    WAIT_S, Mesh, MeshFactory, collect, greedy, mesh, stored_and_landed,
)

Ledger = dict[str, dict[str, Tally]]


def sent(chunks: list[pb.GenerateResponse]) -> tuple[str, Tally]:
    """How a Generate stream was answered, and its usage as the client saw it: the last chunk's,
    or the tokens it received when the stream ended without one."""
    last = chunks[-1]
    if last.finish_reason and last.HasField("usage"):
        u = last.usage
        tally = Tally(1, u.prompt_tokens, u.completion_tokens, u.cached_prompt_tokens)
    else:
        tally = Tally(1, 0, sum(len(c.token_ids) for c in chunks), 0)
    return chunks[0].cache_kind or "generated", tally


async def read(m: Mesh) -> pb.UsageReport:
    assert m.admin is not None
    return await m.admin.Usage(pb.UsageRequest(), timeout=WAIT_S)


def as_ledger(report: pb.UsageReport) -> Ledger:
    return {tenant: {answered: Tally(*(counts[k] for k in usage_cmd.KINDS)) for answered, counts in rows.items()}
            for tenant, rows in usage_cmd.as_json(report)["tenants"].items()}  # type: ignore[union-attr]


async def test_the_ledger_is_the_usage_the_clients_were_sent(mesh: MeshFactory) -> None:
    m = await mesh(a="hold", reads_redis=True, tenant_key_prefix=f"test:{uuid.uuid4().hex}:tenants:")
    assert m.cache is not None and m.openai is not None
    expected: Ledger = defaultdict(lambda: defaultdict(Tally))

    def count(tenant: str, chunks: list[pb.GenerateResponse]) -> None:
        answered, tally = sent(chunks)
        expected[tenant][answered] += tally

    def as_tenant(tenant: str) -> tuple[tuple[str, str], ...]:
        return ((TENANT_METADATA, tenant),)

    # A stream cancelled part-way: the worker holds after the first token, the client leaves.
    call = m.stub.Generate(greedy("cancelled", cache="off"), metadata=as_tenant("a"))
    async with asyncio.timeout(WAIT_S):
        first = await call.read()
    call.cancel()
    async with asyncio.timeout(WAIT_S):
        await m.a.cancelled.wait()
    count("a", [first])

    # Two identical requests of a tenant while the first is generated: the second streams its tokens.
    leader = m.stub.Generate(greedy("shared", cache="exact"), metadata=as_tenant("a"))
    async with asyncio.timeout(WAIT_S):
        firsts = [await leader.read()]
        follower = m.stub.Generate(greedy("shared", cache="exact"), metadata=as_tenant("a"))
        firsts.append(await follower.read())
    m.a.release.set()
    assert firsts[1].cache_kind == "coalesced"
    for call, head in ((leader, firsts[0]), (follower, firsts[1])):
        chunks = [head]
        async with asyncio.timeout(WAIT_S):
            while (chunk := await call.read()) is not grpc.aio.EOF:
                chunks.append(chunk)
        count("a", chunks)
    await stored_and_landed(m)

    # Generated, an exact hit, a semantic hit.
    count("a", await collect(m.stub.Generate(greedy("fresh", cache="off"), metadata=as_tenant("a"))))
    exact = await collect(m.stub.Generate(greedy("shared", cache="exact"), metadata=as_tenant("a")))
    assert exact[0].cache_kind == "exact"
    count("a", exact)
    stored = pb.GenerateResponse(text="stored", token_ids=[7, 8], finish_reason="stop", cached=True,
                                 usage=pb.Usage(prompt_tokens=6, completion_tokens=2, cached_prompt_tokens=3))
    m.cache.semantic_answer = pb.LookupResponse(hit=True, kind="semantic", similarity=0.9, chunks=[stored])
    semantic = await collect(m.stub.Generate(greedy("a paraphrase", cache="semantic"), metadata=as_tenant("b")))
    assert semantic[0].cache_kind == "semantic"
    count("b", semantic)

    # n = 3: the prompt once, every choice's completion.
    three = await m.openai.Completions(json_format.ParseDict(
        {"prompt": "three ways", "max_tokens": 3, "temperature": 1.0, "n": 3}, pb.CompletionRequest()),
        metadata=as_tenant("b"), timeout=WAIT_S)
    assert len(three.choices) == 3
    expected["b"]["generated"] += Tally(1, three.usage.prompt_tokens, three.usage.completion_tokens,
                                        three.usage.prompt_tokens_details.cached_tokens)

    want = {tenant: dict(rows) for tenant, rows in expected.items()}
    assert want["a"]["generated"].completion_tokens == 1 + 3 + 3  # the cancelled stream's one token counted

    async def ledger_is_written() -> bool:
        return as_ledger(await read(m)) == want

    await until(ledger_is_written, "the ledger to hold every request", WAIT_S)
    report = await read(m)
    assert report.shared
    printed = usage_cmd.table(report)
    assert "coalesced" in printed and "semantic" in printed and "exact" in printed
    assert json.loads(json.dumps(usage_cmd.as_json(report)))["tenants"]["a"]["coalesced"]["requests"] == 1
