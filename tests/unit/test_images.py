"""The Dockerfile and the compose file: compose validates (docker-compose's own check), runs
only the image the Dockerfile builds, every command line is one the CLI takes, and its Envoy
config — from the same generator as `meshserve up` — is one Envoy accepts."""

from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshserve.commands import cli
from meshserve.deploy import envoy_config as envoy
from meshserve.services import config
from tests import chart

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
DOCKERFILE = ROOT / "Dockerfile"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The file as docker-compose resolves it (anchors merged, variables at their defaults)."""
    binary = shutil.which("docker-compose")
    assert binary, "docker-compose validates the compose file (make install installs Debian's)"
    result = subprocess.run([binary, "-f", str(COMPOSE), "config"], capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 0, result.stderr
    return yaml.safe_load(result.stdout)


def test_compose_refuses_what_it_does_not_know(tmp_path: Path) -> None:
    broken = tmp_path / "compose.yaml"
    broken.write_text(COMPOSE.read_text().replace("    shm_size: 1gb", "    shm_sise: 1gb"))
    result = subprocess.run(["docker-compose", "-f", str(broken), "config", "-q"], capture_output=True, text=True)
    assert result.returncode != 0 and "shm_sise" in result.stderr


def test_one_version_everywhere() -> None:
    chart_meta = yaml.safe_load((chart.CHART / "Chart.yaml").read_text())
    assert chart_meta["appVersion"] == chart_meta["version"] == VERSION
    assert f'org.opencontainers.image.version="{VERSION}"' in DOCKERFILE.read_text()


def test_the_image_runs_as_a_user_and_checks_its_health() -> None:
    text = DOCKERFILE.read_text()
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1].split(":")[0] not in ("0", "root")
    assert re.search(r'^HEALTHCHECK .*CMD \["meshserve", "health"\]', text, re.M)
    assert re.findall(r"^ARG ENGINE=(\w+)", text, re.M) == ["cpu", "cpu"]  # cpu by default, gpu by build-arg


def test_compose_runs_only_the_image_the_dockerfile_builds(compose: dict[str, Any]) -> None:
    images = {s["image"] for s in compose["services"].values()}
    assert images == {f"meshserve:{VERSION}-cpu"}  # `docker build -t meshserve:VERSION-cpu .`
    assert f"-t meshserve:{VERSION}-cpu ." in DOCKERFILE.read_text()


def test_every_compose_command_is_one_the_cli_takes(compose: dict[str, Any]) -> None:
    parser = cli.build_parser()
    names = set(compose["services"])
    for name, service in compose["services"].items():
        if "entrypoint" in service:
            continue  # valkey-server
        args = parser.parse_args(service["command"])
        for field in ("router", "cache", "redis_url"):
            target = getattr(args, field, None)
            if target:  # another service, by its compose name
                assert re.sub(r"^redis://|:\d+(/\d+)?$", "", target) in names, f"{name}: {field}={target}"
        if args.command == "serve" and args.service == "router":
            assert all(w.rpartition(":")[0] in names for w in args.workers)
        if args.command == "serve":
            health = service["environment"]["MESHSERVE_HEALTH_ADDRESS"]
            assert health == f"127.0.0.1:{args.port}", name


def test_compose_envoy_config_is_valid_and_listens_where_published(compose: dict[str, Any], tmp_path: Path) -> None:
    service = compose["services"]["envoy"]
    args = cli.build_parser().parse_args(service["command"])
    cfg = config.from_args(config.EnvoyConfig, args)
    path = envoy.write_config(cfg, tmp_path / "envoy.yaml", api_keys={})
    envoy.validate(path)
    (published,) = service["ports"]
    assert (cfg.listen_host, cfg.listen_port) == ("0.0.0.0", int(published["target"]))
    gateway_args = cli.build_parser().parse_args(compose["services"]["gateway"]["command"])
    assert cfg.gateways == [f"gateway:{gateway_args.port}"]
    # Streaming OpenAI requests go to the gateway's HTTP edge, untranscoded (as `meshserve up`'s).
    assert cfg.http_gateways == [f"gateway:{gateway_args.http_port}"] and gateway_args.http_port
