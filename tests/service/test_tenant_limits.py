"""Per-tenant limits in the gateway, on a real Valkey shared by the gateways: a tenant over its
budget is refused (RESOURCE_EXHAUSTED naming the limit, with retry-after) while another tenant is
served; two gateways share one budget; with Redis silent each gateway decides alone, with its
share, and no request waits on Redis."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format

from meshserve.gateway.limits import LIMIT_METADATA
from meshserve.gateway.server import TENANT_METADATA
from meshserve.services.gen import meshserve_pb2 as pb
from tests.service.test_gateway import WAIT_S, Mesh, MeshFactory, collect, greedy, mesh, sample  # noqa: F401

PROMPT = "Hello there, how are you today?"
USED = 4 + 3       # the fake workers' usage: 4 prompt tokens, 3 completion tokens
# What a request reserves: the prompt's estimate (its characters / 4: 7, not below the 4 it
# really is, so a burst of reservations bounds what is used) and max_tokens 3.
RESERVED = 7 + 3


def keys_file(tmp_path: Path, *lines: str) -> str:
    path = tmp_path / "keys"
    path.write_text("".join(f"sk-{tenant}-0123456789 {tenant} {settings}\n" for tenant, settings in
                            (line.split(" ", 1) if " " in line else (line, "") for line in lines)))
    return str(path)


def as_tenant(tenant: str) -> tuple[tuple[str, str], ...]:
    return ((TENANT_METADATA, tenant),)


async def outcome(m: Mesh, tenant: str, **kw: object) -> list[pb.GenerateResponse] | grpc.aio.AioRpcError:
    try:
        return await collect(m.stub.Generate(greedy(PROMPT, cache="off", **kw), metadata=as_tenant(tenant)))
    except grpc.aio.AioRpcError as e:
        return e


def refill(tpm: int, since: float) -> float:
    """Tokens a bucket of ``tpm`` got back since ``since`` (it refills continuously)."""
    return (time.monotonic() - since) * tpm / 60


# Redis answers in well under a millisecond; a busy test machine may hold a call much longer,
# which would make the gateway decide alone (tested on its own, below).
PATIENT = {"limits_timeout_s": 5.0}


@pytest.fixture
def prefix() -> str:
    return f"test:{uuid.uuid4().hex}:tenants:"


async def test_a_tenant_over_its_tpm_is_refused_at_its_next_request_and_another_is_not(
    mesh: MeshFactory, tmp_path: Path, prefix: str,
) -> None:
    tpm = 60
    m = await mesh(reads_redis=True, tenant_key_prefix=prefix,
                   api_keys_file=keys_file(tmp_path, f"heavy tpm={tpm}", "light"), **PATIENT)
    used, started = 0, time.monotonic()
    for _ in range(2 * tpm // USED):
        answer = await outcome(m, "heavy")
        if isinstance(answer, grpc.aio.AioRpcError):
            break
        used += answer[-1].usage.prompt_tokens + answer[-1].usage.completion_tokens
    else:
        pytest.fail(f"tenant heavy used {used} tokens of its {tpm} a minute and was never refused")
    # Refused no later than the request that would have taken it past its budget (what the bucket
    # got back meanwhile aside), and not before.
    assert used + RESERVED > tpm - refill(tpm, started)
    assert used <= tpm + refill(tpm, started)
    assert answer.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "tenant heavy is over its tpm limit" in answer.details()
    trailers = dict(answer.trailing_metadata() or ())
    assert trailers[LIMIT_METADATA] == "tpm" and int(trailers["retry-after"]) >= 1
    assert sample("meshserve_gateway_limits_refused_total", {"tenant": "heavy", "limit": "tpm"}) >= 1
    # The other tenant is served, again and again.
    for _ in range(3):
        answer = await outcome(m, "light")
        assert not isinstance(answer, grpc.aio.AioRpcError), answer
        assert answer[-1].finish_reason


async def test_two_gateways_share_one_budget(mesh: MeshFactory, tmp_path: Path, prefix: str) -> None:
    tpm = 60
    keys = keys_file(tmp_path, f"heavy tpm={tpm}")
    gateways = [await mesh(reads_redis=True, tenant_key_prefix=prefix, api_keys_file=keys, **PATIENT) for _ in range(2)]
    started = time.monotonic()
    answers = await asyncio.gather(*(outcome(gateways[i % 2], "heavy") for i in range(40)))
    served = [a for a in answers if not isinstance(a, grpc.aio.AioRpcError)]
    refused = [a for a in answers if isinstance(a, grpc.aio.AioRpcError)]
    used = sum(a[-1].usage.prompt_tokens + a[-1].usage.completion_tokens for a in served)
    assert served and refused and all(e.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for e in refused)
    assert used <= tpm + RESERVED + refill(tpm, started)
    assert all(m.a.calls + m.b.calls for m in gateways), "both gateways served some of the tenant's requests"


async def test_concurrency_counts_each_choice_and_frees_when_a_request_ends(
    mesh: MeshFactory, tmp_path: Path, prefix: str,
) -> None:
    m = await mesh(a="hold", reads_redis=True, tenant_key_prefix=prefix,
                   api_keys_file=keys_file(tmp_path, "t max_concurrency=2 max_n=4"), **PATIENT)
    held = [m.stub.Generate(greedy(cache="off"), metadata=as_tenant("t")) for _ in range(2)]
    async with asyncio.timeout(WAIT_S):
        for call in held:
            await call.read()
    refused = await outcome(m, "t")
    assert isinstance(refused, grpc.aio.AioRpcError)
    assert refused.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert dict(refused.trailing_metadata() or ())[LIMIT_METADATA] == "concurrency"
    m.a.release.set()
    async with asyncio.timeout(WAIT_S):
        for call in held:
            while (chunk := await call.read()) is not grpc.aio.EOF:
                last = chunk
            assert last.finish_reason
    m.a.mode = "ok"
    # n = 3 is three places: more than two; n = 2 fits.
    assert m.openai is not None

    def completions(n: int) -> pb.CompletionRequest:
        return json_format.ParseDict({"prompt": "Hello there", "max_tokens": 3, "temperature": 1.0, "n": n},
                                     pb.CompletionRequest())

    with pytest.raises(grpc.aio.AioRpcError) as err:
        await m.openai.Completions(completions(3), metadata=as_tenant("t"), timeout=WAIT_S)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "concurrency" in err.value.details()
    two = await m.openai.Completions(completions(2), metadata=as_tenant("t"), timeout=WAIT_S)
    assert len(two.choices) == 2
    # n above the tenant's cap is the request's fault, as max_tokens above its cap: a 400 naming it.
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await m.openai.Completions(completions(5), metadata=as_tenant("t"), timeout=WAIT_S)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "'n' is 5" in err.value.details()


@pytest.fixture
async def silent_redis() -> AsyncIterator[str]:
    """A Redis URL whose server accepts connections and never answers."""
    connections: list[asyncio.StreamWriter] = []

    async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"redis://127.0.0.1:{port}/0"
    for writer in connections:
        writer.close()
    server.close()
    await server.wait_closed()


async def test_with_redis_silent_a_gateway_keeps_its_share_of_the_limits_and_never_waits_on_it(
    mesh: MeshFactory, tmp_path: Path, prefix: str, silent_redis: str,
) -> None:
    tpm, share = 120, 0.5
    # The gateway's own Redis client (its limits, its exact entries) goes to the silent server.
    m = await mesh(cache="dead-service", reads_redis=False, tenant_key_prefix=prefix, flow_fleet_share=share,
                   api_keys_file=keys_file(tmp_path, f"heavy tpm={tpm}", "light"), limits_timeout_s=0.1,
                   redis_url=silent_redis, cache_key_prefix=prefix)
    local_before = sample("meshserve_gateway_limits_local_total", {"tenant": "heavy"})
    used, started = 0, time.monotonic()
    for _ in range(2 * tpm // USED):
        answer = await outcome(m, "heavy")  # collect() bounds each request: none may hang on Redis
        if isinstance(answer, grpc.aio.AioRpcError):
            break
        used += answer[-1].usage.prompt_tokens + answer[-1].usage.completion_tokens
    else:
        pytest.fail(f"with Redis away tenant heavy used {used} tokens and was never refused")
    assert answer.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "tpm" in answer.details()
    local = tpm * share
    assert local - refill(local, started) < used + RESERVED and used <= local + refill(local, started)
    assert sample("meshserve_gateway_limits_local_total", {"tenant": "heavy"}) > local_before
    assert not isinstance(await outcome(m, "light"), grpc.aio.AioRpcError)
