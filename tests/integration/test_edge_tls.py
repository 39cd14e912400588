"""TLS at the edge: the real Envoy serves HTTPS and gRPC over TLS with a certificate from files (a
CA the test makes), HTTP/2 and HTTP/1.1 by ALPN, and refuses plain connections; with a client CA,
only clients with a certificate it signed. And `meshserve up --tls-self-signed` end to end: the
OpenAI SDK over https, trusting the CA the mesh made."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import httpx
import openai
import pytest
import trustme

from meshserve.commands.launcher import Mesh
from meshserve.services.config import EnvoyConfig, ServerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import start
from tests.conftest import free_port
from tests.integration.helpers import mesh_spec, run_envoy
from tests.integration.test_envoy_edge import EchoInference


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
async def backend() -> AsyncIterator[int]:
    def register(server: grpc.aio.Server) -> list[str]:
        pb_grpc.add_InferenceServicer_to_server(EchoInference(), server)
        return ["meshserve.v1.Inference"]

    running = await start("echo", ServerConfig(port=0, metrics_port=-1, grace_seconds=1), register)
    yield running.port
    await running.shutdown()


def _edge(ca: trustme.CA, backend: int, tmp: Path, client_ca: bool) -> Iterator[str]:
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(tmp / "cert.pem"))
    for pem in server.cert_chain_pems[1:]:
        pem.write_to_path(str(tmp / "cert.pem"), append=True)
    server.private_key_pem.write_to_path(str(tmp / "key.pem"))
    ca.cert_pem.write_to_path(str(tmp / "ca.pem"))
    cfg = EnvoyConfig(listen_port=free_port(), admin_port=free_port(), gateways=[f"127.0.0.1:{backend}"],
                      tls_cert=str(tmp / "cert.pem"), tls_key=str(tmp / "key.pem"),
                      tls_client_ca=str(tmp / "ca.pem") if client_ca else "")
    with run_envoy(cfg, tmp / "envoy.yaml") as address:
        yield address


@pytest.fixture(scope="module")
def edge(ca: trustme.CA, backend: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _edge(ca, backend, tmp_path_factory.mktemp("tls"), client_ca=False)


@pytest.fixture(scope="module")
def mutual_edge(ca: trustme.CA, backend: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from _edge(ca, backend, tmp_path_factory.mktemp("mtls"), client_ca=True)


def _trusting(ca: trustme.CA) -> ssl.SSLContext:
    context = ssl.create_default_context()
    ca.configure_trust(context)
    return context


async def _generate(channel: grpc.aio.Channel) -> str:
    chunks = [c async for c in pb_grpc.InferenceStub(channel).Generate(pb.GenerateRequest(prompt="a b c"))]
    return "".join(c.text for c in chunks)


async def test_grpc_over_tls_is_served(edge: str, ca: trustme.CA) -> None:
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.cert_pem.bytes())
    async with grpc.aio.secure_channel(edge, credentials) as channel:
        assert await _generate(channel) == "a b c "


@pytest.mark.parametrize("http2", [True, False], ids=["h2", "http1.1"])
async def test_https_is_served_over_either_protocol_by_alpn(edge: str, ca: trustme.CA, http2: bool) -> None:
    async with httpx.AsyncClient(base_url=f"https://{edge}", verify=_trusting(ca), http2=http2,
                                 http1=not http2) as client:
        r = await client.post("/v1/generate", json={"prompt": "hi there", "temperature": 0})
    assert (r.status_code, r.json()["text"]) == (200, "HI THERE")
    assert r.http_version == ("HTTP/2" if http2 else "HTTP/1.1")


async def test_curl_over_https_is_served(edge: str, ca: trustme.CA, tmp_path: Path) -> None:
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    curl = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--max-time", "30", "--cacert", str(tmp_path / "ca.pem"), f"https://{edge}/v1/generate",
        "-d", '{"prompt": "x y", "temperature": 0}', stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await curl.communicate()
    assert curl.returncode == 0, err.decode()
    assert json.loads(out)["text"] == "X Y"


async def test_plain_http_to_the_tls_port_is_refused(edge: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://{edge}") as client:
        with pytest.raises(httpx.TransportError):
            await client.post("/v1/generate", json={"prompt": "hi"})


async def test_a_client_it_does_not_trust_is_refused(edge: str) -> None:
    other = trustme.CA()  # the client trusts another CA: the edge's certificate does not verify
    async with httpx.AsyncClient(base_url=f"https://{edge}", verify=_trusting(other)) as client:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            await client.post("/v1/generate", json={"prompt": "hi"})


async def test_with_a_client_ca_only_clients_with_its_certificates_are_served(mutual_edge: str, ca: trustme.CA) -> None:
    async with httpx.AsyncClient(base_url=f"https://{mutual_edge}", verify=_trusting(ca)) as anonymous:
        with pytest.raises(httpx.TransportError):
            await anonymous.post("/v1/generate", json={"prompt": "hi"})
    context = _trusting(ca)
    ca.issue_cert("client@example.com").configure_cert(context)
    async with httpx.AsyncClient(base_url=f"https://{mutual_edge}", verify=context) as client:
        r = await client.post("/v1/generate", json={"prompt": "hi there", "temperature": 0})
    assert (r.status_code, r.json()["text"]) == (200, "HI THERE")


def test_a_certificate_without_its_key_is_refused_naming_the_flag(tmp_path: Path) -> None:
    from meshserve.deploy import envoy_config as envoy

    (tmp_path / "cert.pem").write_text("x")
    with pytest.raises(ValueError, match="--tls-key"):
        envoy.build_config(EnvoyConfig(tls_cert=str(tmp_path / "cert.pem")), api_keys={})
    with pytest.raises(ValueError, match="--tls-key: no such file"):
        envoy.build_config(EnvoyConfig(tls_cert=str(tmp_path / "cert.pem"), tls_key=str(tmp_path / "nope")),
                           api_keys={})


async def test_a_self_signed_mesh_serves_the_openai_sdk_over_https(tmp_path: Path) -> None:
    spec = mesh_spec(tmp_path, "sim", grace_seconds=1, tls_self_signed=True)
    with Mesh(spec) as mesh:
        assert mesh.tls_ca and Path(mesh.tls_ca).is_file()
        async with httpx.AsyncClient(verify=ssl.create_default_context(cafile=mesh.tls_ca)) as http:
            client = openai.AsyncOpenAI(base_url=f"https://{mesh.envoy_address}/v1", api_key="none",
                                        max_retries=0, http_client=http)
            answer = await client.chat.completions.create(
                model=(await client.models.list()).data[0].id, max_tokens=4,
                messages=[{"role": "user", "content": "Hello there"}])
        assert answer.choices[0].message.content
        assert answer.usage is not None and answer.usage.completion_tokens == 4
