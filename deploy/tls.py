"""Local certificate authorities: one and a server certificate signed by it, for TLS at the edge on
a machine that has none (`meshserve up --tls-self-signed`: clients trust ``ca.pem``); and the
mesh's own, for mutual TLS between its services (`meshserve up --mesh-tls`)."""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# One identity's directory holds a Kubernetes TLS Secret's files (cert-manager writes the issuing
# CA's certificate as ca.crt), so a mounted Secret is such a directory as it is.
from meshserve.services.mesh_tls import CA_FILE, CERT_FILE, KEY_FILE

VALID_DAYS = 30


@dataclass(frozen=True)
class ServerPair:
    ca: Path     # the authority's certificate: what clients trust
    cert: Path   # the server's certificate chain
    key: Path    # the server's private key (owner-readable only)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "meshserve (local)"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))


def _authority(common_name: str, now: datetime.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(_name(common_name))
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                         crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, common_name: str, hosts: list[str],
          usages: list[x509.ObjectIdentifier], now: datetime.datetime,
          ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(common_name)).issuer_name(ca.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


def make_mesh(directory: Path, identities: list[str], hosts: list[str]) -> dict[str, Path]:
    """Writes a new mesh CA and, for each of ``identities``, a certificate whose common name and
    first DNS name are that identity, also valid for ``hosts``, usable as a server's and as a
    client's, in ``directory/IDENTITY/`` (ca.crt, tls.crt, tls.key). Returns those directories."""
    now = datetime.datetime.now(datetime.UTC)
    ca, ca_key = _authority("meshserve mesh CA", now)
    made: dict[str, Path] = {}
    for identity in identities:
        cert, key = _leaf(ca, ca_key, identity, [identity, *hosts],
                          [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH], now)
        out = made[identity] = directory / identity
        out.mkdir(parents=True, exist_ok=True)
        (out / CA_FILE).write_bytes(_pem(ca))
        (out / CERT_FILE).write_bytes(_pem(cert))
        _write_key(out / KEY_FILE, key)
    return made


def make_server_pair(directory: Path, hosts: list[str]) -> ServerPair:
    """Writes a new CA and a certificate for ``hosts`` (names or IP addresses) under ``directory``."""
    now = datetime.datetime.now(datetime.UTC)
    ca, ca_key = _authority("meshserve local CA", now)
    cert, key = _leaf(ca, ca_key, hosts[0], hosts, [ExtendedKeyUsageOID.SERVER_AUTH], now)
    directory.mkdir(parents=True, exist_ok=True)
    pair = ServerPair(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    pair.ca.write_bytes(_pem(ca))
    pair.cert.write_bytes(_pem(cert))
    _write_key(pair.key, key)
    return pair
