"""Mutual TLS inside the mesh, on real processes (`meshserve up --mesh-tls`): every service refuses
a caller without a certificate of the mesh CA; the mesh serves through Envoy end to end (gRPC and
the gateway's HTTP edge); a gateway believes a tenant only from the edge's certificate and the
cache service only from a gateway's, so another mesh certificate cannot read a tenant's entries."""

from __future__ import annotations

import ssl
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import pytest
import trustme
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshserve.commands.launcher import Mesh
from meshserve.services import config
from meshserve.services.config import HTTP_EDGE_PATHS, CacheConfig, EnvoyConfig, GatewayConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.mesh_tls import MeshTls, operator_dir
from meshserve.services.server import insecure_channel, mesh_channel
from tests.conftest import free_port
from tests.integration.helpers import mesh_spec, until

KEY, TENANT = "sk-mtls-alice", "alice"
PROMPT = "the tenant's own question"
CHAT_SSE = HTTP_EDGE_PATHS["/v1/chat/completions"]  # the gateway's HTTP edge's own path


@pytest.fixture(scope="module", params=["service", "embedded"], ids=["router-service", "router-embedded"])
def mesh(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    """Twice: with the router's own process, and with each gateway watching the workers itself."""
    keys = tmp_path_factory.mktemp("keys") / "api-keys.txt"
    keys.write_text(f"{KEY} {TENANT}\n")
    spec = mesh_spec(tmp_path_factory.mktemp("mtls-mesh"), "sim", grace_seconds=1, mesh_tls=True,
                     router_mode=request.param,
                     gateway=GatewayConfig(http_port=free_port()), cache=CacheConfig(semantic=False),
                     envoy=EnvoyConfig(api_keys_file=str(keys)))
    with Mesh(spec) as m:
        yield m


def tls_of(mesh: Mesh, identity: str) -> MeshTls:
    return MeshTls.load(mesh.mesh_tls[identity])


def services(mesh: Mesh) -> dict[str, str]:
    return {"gateway": mesh.gateway_address, "router": mesh.router_address, "cache": mesh.cache_address,
            "worker": mesh.worker_addresses[0]}


async def health(channel: grpc.aio.Channel) -> int:
    reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    return reply.status


@pytest.fixture(scope="module")
async def answered(mesh: Mesh) -> AsyncIterator[str]:
    """The tenant's answer to PROMPT, through Envoy: generated, then stored in the cache (found
    there by a gateway's certificate)."""
    request = pb.GenerateRequest(prompt=PROMPT, max_tokens=8, temperature=0)
    async with insecure_channel(mesh.envoy_address) as channel:
        stub = pb_grpc.InferenceStub(channel)
        chunks = [c async for c in stub.Generate(request, metadata=(("authorization", f"Bearer {KEY}"),))]
    gateway = tls_of(mesh, config.SERVICE_IDENTITIES["gateway"])
    async with mesh_channel(mesh.cache_address, gateway, config.SERVICE_IDENTITIES["cache"]) as channel:
        # The key the gateway stored it under names the served model.
        lookup = pb.LookupRequest(request=pb.GenerateRequest(prompt=PROMPT, max_tokens=8, temperature=0,
                                                             model=config.DEFAULT_MODEL), tenant=TENANT, mode="exact")

        async def stored() -> bool:
            return (await pb_grpc.CacheStub(channel).Lookup(lookup, timeout=10)).hit

        await until(stored, "the tenant's answer stored in the cache", timeout=30)
    yield "".join(c.text for c in chunks)


async def test_the_mesh_serves_through_envoy_over_grpc(mesh: Mesh, answered: str) -> None:
    assert answered
    async with insecure_channel(mesh.envoy_address) as channel:  # again: the cache's answer, the same
        call = pb_grpc.InferenceStub(channel).Complete(
            pb.GenerateRequest(prompt=PROMPT, max_tokens=8, temperature=0),
            metadata=(("authorization", f"Bearer {KEY}"),), timeout=30)
        assert (await call).text == answered


async def test_the_mesh_serves_an_openai_stream_through_the_gateways_http_edge(mesh: Mesh) -> None:
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}", timeout=30) as client:
        r = await client.post("/v1/chat/completions", headers={"authorization": f"Bearer {KEY}"}, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True})
    assert r.status_code == 200, r.text
    assert r.text.count("data: ") >= 4 and r.text.rstrip().endswith("data: [DONE]")


@pytest.mark.parametrize("service", ["gateway", "router", "cache", "worker"])
async def test_a_caller_without_a_mesh_certificate_is_refused(mesh: Mesh, service: str) -> None:
    address = services(mesh)[service]
    async with mesh_channel(address, tls_of(mesh, config.OPERATOR_IDENTITY)) as channel:  # the control
        assert await health(channel) == health_pb2.HealthCheckResponse.SERVING
    ca = Path(mesh.mesh_tls[config.OPERATOR_IDENTITY], "ca.crt").read_bytes()
    stranger = trustme.CA().issue_cert("127.0.0.1")
    refused = {
        "plaintext": grpc.aio.insecure_channel(address),
        "TLS, no client certificate": grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(ca)),
        "another CA's certificate": grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(
            ca, stranger.private_key_pem.bytes(), stranger.cert_chain_pems[0].bytes())),
    }
    for how, channel in refused.items():
        async with channel:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await health(channel)
            assert e.value.code() == grpc.StatusCode.UNAVAILABLE, how


async def test_the_http_edge_refuses_a_caller_without_a_mesh_certificate(mesh: Mesh) -> None:
    ca = str(Path(mesh.mesh_tls[config.OPERATOR_IDENTITY], "ca.crt"))
    edge = mesh.gateway_http_addresses[0]
    async with httpx.AsyncClient(base_url=f"https://{edge}", verify=ssl.create_default_context(cafile=ca)) as c:
        with pytest.raises(httpx.TransportError):
            await c.get("/health")
    async with httpx.AsyncClient(base_url=f"http://{edge}") as c:
        with pytest.raises(httpx.TransportError):
            await c.get("/health")


def _http_client(mesh: Mesh, identity: str) -> httpx.AsyncClient:
    directory = mesh.mesh_tls[identity]
    context = ssl.create_default_context(cafile=str(directory / "ca.crt"))
    context.load_cert_chain(directory / "tls.crt", directory / "tls.key")
    return httpx.AsyncClient(base_url=f"https://{mesh.gateway_http_addresses[0]}", verify=context, timeout=30)


@pytest.mark.parametrize("identity", [config.OPERATOR_IDENTITY, config.SERVICE_IDENTITIES["worker"]])
async def test_another_mesh_certificate_naming_a_tenant_is_refused_by_the_gateway(
    mesh: Mesh, answered: str, identity: str
) -> None:
    request = pb.GenerateRequest(prompt=PROMPT, max_tokens=8, temperature=0)
    async with mesh_channel(mesh.gateway_address, tls_of(mesh, identity)) as channel:
        stub = pb_grpc.InferenceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.Complete(request, metadata=(("x-meshserve-tenant", TENANT),), timeout=30)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "only the edge (meshserve-edge) may name a tenant" in (e.value.details() or "")
        assert identity in (e.value.details() or "")
        # Naming none, it is served, as no tenant.
        reply = await stub.Complete(pb.GenerateRequest(prompt=f"{identity} asks", max_tokens=4), timeout=30)
        assert reply.text
    async with _http_client(mesh, identity) as client:
        r = await client.post(CHAT_SSE, headers={"x-meshserve-tenant": TENANT}, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True})
    assert r.status_code == 403 and "only the edge" in r.json()["error"]["message"]


async def test_the_edges_certificate_may_name_a_tenant(mesh: Mesh, answered: str) -> None:
    async with mesh_channel(mesh.gateway_address, tls_of(mesh, config.EDGE_IDENTITY)) as channel:
        reply = await pb_grpc.InferenceStub(channel).Complete(
            pb.GenerateRequest(prompt=PROMPT, max_tokens=8, temperature=0),
            metadata=(("x-meshserve-tenant", TENANT),), timeout=30)
    assert reply.text == answered and reply.cached  # the tenant's own entry
    async with _http_client(mesh, config.EDGE_IDENTITY) as client:
        r = await client.post(CHAT_SSE, headers={"x-meshserve-tenant": TENANT}, json={
            "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "stream": True})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("identity", [config.OPERATOR_IDENTITY, config.EDGE_IDENTITY,
                                      config.SERVICE_IDENTITIES["worker"]])
async def test_only_a_gateway_may_name_a_tenant_to_the_cache(mesh: Mesh, answered: str, identity: str) -> None:
    lookup = pb.LookupRequest(request=pb.GenerateRequest(prompt=PROMPT, max_tokens=8, temperature=0,
                                                         model=config.DEFAULT_MODEL), tenant=TENANT, mode="exact")
    async with mesh_channel(mesh.cache_address, tls_of(mesh, identity), config.SERVICE_IDENTITIES["cache"]) as ch:
        stub = pb_grpc.CacheStub(ch)
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.Lookup(lookup, timeout=10)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "only a gateway (meshserve-gateway) may name a tenant" in (e.value.details() or "")
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await stub.Store(pb.StoreRequest(request=lookup.request, tenant=TENANT), timeout=10)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        lookup.tenant = ""  # as no tenant: the tenant's entry is not there
        assert not (await stub.Lookup(lookup, timeout=10)).hit
    gateway = tls_of(mesh, config.SERVICE_IDENTITIES["gateway"])
    async with mesh_channel(mesh.cache_address, gateway, config.SERVICE_IDENTITIES["cache"]) as channel:
        lookup.tenant = TENANT  # the control: a gateway's certificate finds it
        assert (await pb_grpc.CacheStub(channel).Lookup(lookup, timeout=10)).hit


def _meshserve(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshserve.commands.cli", *argv], capture_output=True, text=True,
                          timeout=60, check=False)


def test_the_local_tools_present_the_operators_certificate(mesh: Mesh) -> None:
    operator = str(mesh.mesh_tls[config.OPERATOR_IDENTITY])
    plain = _meshserve("health", mesh.worker_addresses[0], "--mesh-tls-dir", "")
    assert plain.returncode == 1 and "UNAVAILABLE" in plain.stderr
    served = _meshserve("health", mesh.worker_addresses[0], "--mesh-tls-dir", operator)
    assert served.returncode == 0 and "SERVING" in served.stdout, served.stderr
    usage = _meshserve("usage", "--target", mesh.gateway_address, "--json", "--mesh-tls-dir", operator)
    assert usage.returncode == 0, usage.stderr
    top = _meshserve("top", "--once", "--run-dir", str(mesh.run_dir), "--interval", "0.1")
    assert "ListWorkers" not in top.stdout + top.stderr and "worker-0" in top.stdout, top.stdout + top.stderr


def test_a_stopped_mesh_leaves_no_certificate_for_the_tools(tmp_path: Path) -> None:
    """The local tools take the run dir's operator certificate when there is one: once the mesh is
    stopped, there is none, and they speak plaintext to whatever serves next."""
    spec = mesh_spec(tmp_path, "sim", grace_seconds=1, mesh_tls=True, tracing=False,
                     cache=CacheConfig(semantic=False))
    with Mesh(spec) as m:
        assert operator_dir(m.run_dir).is_dir()
    assert not operator_dir(m.run_dir).exists()

