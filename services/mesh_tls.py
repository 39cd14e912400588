"""Mutual TLS inside the mesh: the one place that builds a service's server credentials and the
credentials of its channels to other services, and reads who called (the peer certificate's
common name). Off (plaintext) when a service has no ``mesh_tls_dir``."""

from __future__ import annotations

import argparse
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from meshserve.services.config import OPERATOR_IDENTITY, ServerConfig, default_cache_dir

CA_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"  # a Kubernetes TLS Secret's keys
RUN_DIR_PART = "mesh-tls"  # `meshserve up`: RUN_DIR/mesh-tls/IDENTITY/ holds each identity's files


@dataclass(frozen=True)
class MeshTls:
    """One service's certificate and key, and the mesh CA every peer's certificate must chain to."""

    directory: Path
    ca: bytes
    cert: bytes
    key: bytes

    @classmethod
    def load(cls, directory: str | Path) -> MeshTls:
        """Reads ``directory``'s ca.crt, tls.crt and tls.key; a missing one is a clear error."""
        path = Path(directory)
        files = {}
        for name in (CA_FILE, CERT_FILE, KEY_FILE):
            try:
                files[name] = (path / name).read_bytes()
            except OSError as e:
                raise SystemExit(f"mesh TLS: cannot read {path / name} ({e.strerror}); --mesh-tls-dir names a "
                                 f"directory with {CA_FILE}, {CERT_FILE} and {KEY_FILE}") from None
        return cls(path, files[CA_FILE], files[CERT_FILE], files[KEY_FILE])

    @classmethod
    def of(cls, cfg: ServerConfig) -> MeshTls | None:
        return cls.load(cfg.mesh_tls_dir) if cfg.mesh_tls_dir else None

    def server_credentials(self) -> grpc.ServerCredentials:
        """Serves only clients whose certificate the mesh CA signed."""
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca,
                                           require_client_auth=True)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Presents this service's certificate; trusts only servers the mesh CA signed."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)

    def server_ssl_context(self) -> ssl.SSLContext:
        """The same for an HTTP server (the gateway's HTTP edge): a client certificate is required."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cadata=self.ca.decode())
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_cert_chain(self.directory / CERT_FILE, self.directory / KEY_FILE)
        return context


def channel(address: str, tls: MeshTls | None, peer: str = "",
            options: list[tuple[str, int | str]] | None = None) -> grpc.aio.Channel:
    """An aio channel to another service of the mesh: over mutual TLS when ``tls`` is given, where
    the server's certificate must name ``peer`` (its identity, config.SERVICE_IDENTITIES: the same
    check whatever address it has, a Kubernetes pod's IP included; '': the address's host itself).
    The handshake is the connection's, once; every call after rides on it."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=options)
    return grpc.aio.secure_channel(address, *_secure(tls, peer, options))


def _secure(tls: MeshTls, peer: str, options: list[tuple[str, int | str]] | None = None
            ) -> tuple[grpc.ChannelCredentials, list[tuple[str, int | str]]]:
    """The credentials and options of a channel over mutual TLS (``channel``'s, aio or not):
    ``options`` and, when ``peer`` is given, the name the server's certificate must have."""
    override: list[tuple[str, int | str]] = [("grpc.ssl_target_name_override", peer)] if peer else []
    return tls.channel_credentials(), [*(options or []), *override]


def peer_identity(context: grpc.aio.ServicerContext) -> str:
    """The common name of the caller's certificate ('' for a plaintext or anonymous caller)."""
    names = context.auth_context().get("x509_common_name") or [b""]
    return names[0].decode()


def operator_dir(run_dir: Path | None = None) -> Path:
    """Where `meshserve up` (its ``--run-dir``, default: the default one) put the certificate the
    local tools present."""
    return (run_dir or default_cache_dir() / "run") / RUN_DIR_PART / OPERATOR_IDENTITY


def default_tools_dir() -> str:
    """The local tools' ``--mesh-tls-dir`` default: the operator's certificate of the default run
    dir's mesh, if it has one ('': plaintext)."""
    return str(operator_dir()) if operator_dir().is_dir() else ""


def blocking_channel(address: str, directory: str | Path | None, peer: str = "") -> grpc.Channel:
    """A synchronous channel for the local tools, presenting the certificate in ``directory``
    ('' or None: plaintext); ``peer`` as ``channel``'s."""
    if not directory:
        return grpc.insecure_channel(address)
    return grpc.secure_channel(address, *_secure(MeshTls.load(directory), peer))


def add_mesh_tls_argument(parser: argparse.ArgumentParser) -> None:
    """A local tool's ``--mesh-tls-dir``."""
    parser.add_argument("--mesh-tls-dir", default=default_tools_dir(),
                        help="call the service over mutual TLS with the certificate in this directory (ca.crt, "
                             "tls.crt, tls.key) (default: the operator's certificate of `meshserve up`'s default "
                             "run dir, if it made one; else plaintext)")
