"""`meshserve up`'s flags come from the config fields: a setting `up` takes as it is has one flag,
with the name, help and default `meshserve serve NAME` gives it; the rest are `up`'s own."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from meshserve.commands import launcher
from meshserve.commands.cli import SERVICES, build_parser
from meshserve.services import config


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next(a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction))


def _parsers() -> tuple[argparse.ArgumentParser, dict[type, argparse.ArgumentParser]]:
    """`meshserve up`'s parser, and by config class the parser of the command that serves it."""
    commands = _subparsers(build_parser())
    services = _subparsers(commands["serve"])
    by_config = {cls: services[name] for name, (cls, _) in SERVICES.items()}
    by_config[config.EnvoyConfig] = commands["envoy-config"]  # Envoy is not served: its config is printed
    by_config[config.ServerConfig] = services["worker"]  # what every service shares
    return commands["up"], by_config


def _actions(parser: argparse.ArgumentParser, flag: str) -> list[argparse.Action]:
    return [a for a in parser._actions if flag in a.option_strings]


def _signature(action: argparse.Action) -> tuple[object, ...]:
    kind = getattr(action.type, "__qualname__", action.type)  # at_least's parsers are new each time
    return (action.option_strings, action.dest, action.help, action.default, action.choices, action.nargs,
            type(action), kind)


UP, SERVED = _parsers()
TAKEN = [(cls, name) for cls, names in launcher.UP_FIELDS.items() for name in names]
TAKEN += [(config.ServerConfig, name) for name in launcher.SHARED_FLAGS]

# `up` flags named like a field of a service they configure that mean something else on `up`.
UP_OWN = {
    "port": "Envoy's listener port (EnvoyConfig.listen_port); the services' are --NAME-port",
    "workers": "how many workers; RouterConfig.workers are their addresses",
    "gateways": "how many gateways; EnvoyConfig.gateways are their addresses",
    "redis_url": "the cache's, but empty starts an embedded valkey-server",
    "otlp_endpoint": "every service's, but empty means the local trace receiver",
    "sim_speed": "one per worker (the last repeats)",
    "gateway_max_in_flight": "each gateway's max_in_flight; EnvoyConfig.gateway_max_in_flight is their total",
    "router": "service or embedded; GatewayConfig.router is the router's address or 'embedded'",
}


@pytest.mark.parametrize(("cls", "name"), TAKEN, ids=[f"{cls.__name__}.{name}" for cls, name in TAKEN])
def test_each_field_up_takes_is_one_flag_named_helped_and_defaulted_as_where_it_is_served(
    cls: type, name: str
) -> None:
    flag = "--" + name.replace("_", "-")
    [up] = _actions(UP, flag)
    [served] = _actions(SERVED[cls], flag)
    assert _signature(up) == _signature(served)
    assert up.help.startswith(config.field_of(cls, name).metadata["help"].replace("%", "%%"))


def test_no_field_is_taken_for_two_services() -> None:
    names = [name for _, name in TAKEN]
    assert len(names) == len(set(names))


def test_an_up_flag_named_like_a_field_is_that_field_or_up_s_own() -> None:
    taken = {name for _, name in TAKEN}
    fields = {f.name for cls in launcher.UP_FIELDS for f in dataclasses.fields(cls)}
    named_like_a_field = {a.dest for a in UP._actions if a.dest in fields}
    assert named_like_a_field - taken - UP_OWN.keys() == set()
    assert UP_OWN.keys() <= named_like_a_field  # no stale entry
    assert not UP_OWN.keys() & taken


@pytest.mark.parametrize(("flag", "cls", "name"), [
    ("--sim-speed", config.WorkerConfig, "sim_speed"),
    ("--gateway-max-in-flight", config.GatewayConfig, "max_in_flight"),
    ("--port", config.EnvoyConfig, "listen_port"),
    ("--redis-url", config.CacheConfig, "redis_url"),
])
def test_a_flag_up_declares_itself_takes_the_help_of_the_field_it_sets(
    flag: str, cls: type, name: str
) -> None:
    [up] = _actions(UP, flag)
    assert config.field_of(cls, name).metadata["help"] in up.help


def test_up_without_flags_starts_every_service_with_its_configs_defaults() -> None:
    spec = launcher.spec_from_args(build_parser().parse_args(["up"]))
    assert spec.worker == config.WorkerConfig()
    assert spec.router == config.RouterConfig()
    assert spec.cache == config.CacheConfig()
    # `up` starts the gateways' HTTP edge for its Envoy (a lone `serve gateway` has none);
    # `--openai-edge grpc` leaves every stream transcoded.
    assert spec.gateway == config.GatewayConfig(http_port=launcher.DEFAULT_HTTP_EDGE_PORT)
    transcoded = launcher.spec_from_args(build_parser().parse_args(["up", "--openai-edge", "grpc"]))
    assert transcoded.gateway == config.GatewayConfig()
    assert spec.envoy == config.EnvoyConfig()
    assert spec.traces == config.TracesConfig()
    assert spec.sim_speeds == [config.WorkerConfig().sim_speed]
    own = ("engine", "workers", "gateways", "redis_url", "redis_port", "redis_maxmemory", "otlp_endpoint",
           "trace_sampling_ratio")
    assert {k: getattr(spec, k) for k in own} == {k: getattr(launcher.MeshSpec(), k) for k in own}


# Other values a field takes only in a form of its own, or only beside the others' other values.
OTHER_VALUES: dict[str, object] = {
    "lora_modules": ["a=/adapters/a", "b=/adapters/b"],  # name=path entries
    "max_cpu_loras": 8,  # at least max_loras' other value
}


def _other_value(cls: type, name: str) -> tuple[list[str], object]:
    """Flags that set field ``name`` to a value other than its default, and that value."""
    f = config.field_of(cls, name)
    flag = "--" + name.replace("_", "-")
    if name in OTHER_VALUES:
        value = OTHER_VALUES[name]
        return [flag, *map(str, value if isinstance(value, list) else [value])], value
    if isinstance(f.default, bool):
        return [flag if not f.default else "--no-" + flag[2:]], not f.default
    if "choices" in f.metadata:
        value = next(c for c in f.metadata["choices"] if c != f.default)
    elif isinstance(f.default, str):
        value = f.default + "x"
    else:
        value = f.default * 2 + 1
    return [flag, str(value)], value


def test_up_passes_each_field_it_takes_to_its_service() -> None:
    argv, wanted = ["up"], {}
    for cls, name in TAKEN:
        flags, wanted[cls, name] = _other_value(cls, name)
        argv += flags
    spec = launcher.spec_from_args(build_parser().parse_args(argv))
    service = {config.WorkerConfig: spec.worker, config.RouterConfig: spec.router,
               config.CacheConfig: spec.cache, config.GatewayConfig: spec.gateway,
               config.EnvoyConfig: spec.envoy, config.ServerConfig: spec}  # the shared ones: MeshSpec's
    assert {key: getattr(service[key[0]], key[1]) for key in wanted} == wanted
