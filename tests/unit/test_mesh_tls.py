"""The mesh's certificates (deploy/tls.make_mesh), their loading (services/mesh_tls), Envoy's
upstream TLS to the gateways, and what `meshserve up` leaves in its run dir."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from meshserve.commands.launcher import Mesh, MeshSpec
from meshserve.deploy import envoy_config as envoy
from meshserve.deploy import tls
from meshserve.services import config
from meshserve.services.config import EnvoyConfig
from meshserve.services.mesh_tls import MeshTls, operator_dir


def test_each_identity_gets_a_certificate_naming_it_signed_by_the_mesh_ca(tmp_path: Path) -> None:
    made = tls.make_mesh(tmp_path, ["meshserve-gateway", "meshserve-edge"], ["127.0.0.1", "localhost"])
    for identity, directory in made.items():
        ca = x509.load_pem_x509_certificate((directory / "ca.crt").read_bytes())
        cert = x509.load_pem_x509_certificate((directory / "tls.crt").read_bytes())
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == identity
        names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert names.get_values_for_type(x509.DNSName) == [identity, "localhost"]
        usages = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        assert set(usages) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
        assert isinstance(ca.public_key(), ec.EllipticCurvePublicKey)
        cert.verify_directly_issued_by(ca)  # raises if another key signed it
        assert (directory / "ca.crt").read_bytes() == (made["meshserve-edge"] / "ca.crt").read_bytes()  # one CA
        assert stat.S_IMODE((directory / "tls.key").stat().st_mode) == 0o600
        assert MeshTls.load(directory).cert == (directory / "tls.crt").read_bytes()


def test_a_directory_without_the_files_is_refused_naming_them(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="cannot read .*ca.crt .*--mesh-tls-dir names a directory with ca.crt"):
        MeshTls.load(tmp_path)


def test_envoy_reaches_the_gateways_with_the_edges_certificate(tmp_path: Path) -> None:
    edge = tls.make_mesh(tmp_path, [config.EDGE_IDENTITY], ["127.0.0.1"])[config.EDGE_IDENTITY]
    cfg = EnvoyConfig(gateways=["127.0.0.1:50051"], http_gateways=["127.0.0.1:50050"], mesh_tls_dir=str(edge))
    clusters = {c["name"]: c for c in envoy.build_config(cfg, api_keys={})["static_resources"]["clusters"]}
    for name, alpn in ((envoy.GATEWAY_CLUSTER, "h2"), (envoy.HTTP_GATEWAY_CLUSTER, "http/1.1")):
        context = clusters[name]["transport_socket"]["typed_config"]
        assert context["sni"] == "meshserve-gateway"
        common = context["common_tls_context"]
        assert common["alpn_protocols"] == [alpn]
        assert common["tls_certificates"][0]["certificate_chain"]["filename"] == str(edge / "tls.crt")
        assert common["validation_context"]["trusted_ca"]["filename"] == str(edge / "ca.crt")
        assert common["validation_context"]["match_typed_subject_alt_names"] == [
            {"san_type": "DNS", "matcher": {"exact": "meshserve-gateway"}}]
    plain = envoy.build_config(EnvoyConfig(gateways=["127.0.0.1:50051"]), api_keys={})
    assert all("transport_socket" not in c for c in plain["static_resources"]["clusters"])
    with pytest.raises(ValueError, match="--mesh-tls-dir: no ca.crt"):
        envoy.build_config(EnvoyConfig(mesh_tls_dir=str(tmp_path / "nowhere")), api_keys={})


def test_up_makes_the_certificates_and_leaves_no_earlier_ones(tmp_path: Path) -> None:
    stale = operator_dir(tmp_path)
    stale.mkdir(parents=True)
    (stale / "tls.crt").write_text("an earlier mesh's")
    mesh = Mesh(MeshSpec(run_dir=tmp_path, mesh_tls=False))
    assert not mesh.mesh_tls and not stale.exists() and not mesh.envoy_tls.mesh_tls_dir
    mesh = Mesh(MeshSpec(run_dir=tmp_path, mesh_tls=True))
    assert set(mesh.mesh_tls) == {*config.SERVICE_IDENTITIES.values(), config.EDGE_IDENTITY, config.OPERATOR_IDENTITY}
    assert mesh.mesh_tls[config.OPERATOR_IDENTITY] == operator_dir(tmp_path)
    assert mesh.envoy_tls.mesh_tls_dir == str(mesh.mesh_tls[config.EDGE_IDENTITY])
