"""Config dataclasses drive the CLI: flags parse back into the same config, and the launcher's
argv rebuilds it exactly in another process."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from meshserve.services import config


@pytest.mark.parametrize(
    "cls", [config.WorkerConfig, config.RouterConfig, config.CacheConfig, config.GatewayConfig, config.EnvoyConfig]
)
def test_defaults_round_trip_through_flags(cls: type) -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, cls)
    assert config.from_args(cls, parser.parse_args([])) == cls()


def test_to_argv_rebuilds_a_changed_config() -> None:
    cfg = config.WorkerConfig(port=1234, engine="sim", enable_prefix_caching=False, max_num_seqs=7, sim_itl_base_ms=3.5)
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, config.WorkerConfig)
    assert config.from_args(config.WorkerConfig, parser.parse_args(config.to_argv(cfg))) == cfg


def test_list_fields_round_trip() -> None:
    cfg = config.RouterConfig(workers=["127.0.0.1:1", "127.0.0.1:2"])
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, config.RouterConfig)
    assert config.from_args(config.RouterConfig, parser.parse_args(config.to_argv(cfg))).workers == cfg.workers


def test_every_field_documents_itself() -> None:
    for cls in (config.WorkerConfig, config.RouterConfig, config.CacheConfig, config.GatewayConfig, config.EnvoyConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help text"


def test_the_engine_choices_are_the_workers_engines() -> None:
    from meshserve.worker.server import ENGINES

    assert sorted(config.WORKER_ENGINES) == sorted(ENGINES)


def test_a_percent_sign_in_a_help_text_is_printed_as_it_is() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, config.WorkerConfig)
    text = " ".join(parser.format_help().split())
    # Unescaped, argparse read '% s' as a format and printed the flag's whole definition there.
    assert "decodes ~25% slower" in text and "option_strings" not in text


def test_bad_flag_value_is_refused() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, config.WorkerConfig)
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-num-seqs", "many"])


def test_a_value_below_a_fields_minimum_is_refused_naming_the_flag(capsys: pytest.CaptureFixture) -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, config.WorkerConfig)
    assert parser.parse_args(["--stream-interval", "4"]).stream_interval == 4
    with pytest.raises(SystemExit):
        parser.parse_args(["--stream-interval", "0"])
    assert "--stream-interval: must be at least 1, got 0" in capsys.readouterr().err


def test_up_passes_routing_and_sim_settings_to_the_services() -> None:
    from meshserve.commands.cli import build_parser
    from meshserve.commands.launcher import spec_from_args

    args = build_parser().parse_args(["up", "--engine", "sim", "--routing", "round-robin", "--kv-home-weight", "0.2",
                                      "--kv-full-usage", "0.9", "--sim-num-kv-blocks", "7", "--sim-speed", "1", "0.5"])
    spec = spec_from_args(args)
    assert (spec.router.routing, spec.router.kv_home_weight, spec.router.kv_full_usage) == ("round-robin", 0.2, 0.9)
    assert spec.worker.sim_num_kv_blocks == 7 and spec.sim_speeds == [1.0, 0.5]


def test_kubernetes_discovery_needs_its_service_and_no_static_workers(capsys: pytest.CaptureFixture) -> None:
    from meshserve.commands.cli import main

    assert config.RouterConfig(discovery="kubernetes", kubernetes_service="workers").workers == []
    with pytest.raises(ValueError, match="--kubernetes-service"):
        config.RouterConfig(discovery="kubernetes")
    with pytest.raises(SystemExit) as refused:  # refused as a bad flag value is, both problems at once
        main(["serve", "router", "--discovery", "kubernetes", "--workers", "127.0.0.1:50061"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "--discovery kubernetes needs --kubernetes-service" in err and "--workers are static discovery" in err


@pytest.mark.parametrize("service", ["cache", "gateway"])
def test_the_redis_url_may_come_from_the_environment_and_the_flag_wins(
    service: str, capsys: pytest.CaptureFixture
) -> None:
    """A URL with a password is passed in the environment (a Secret on Kubernetes): a command line
    is visible to anyone who lists the processes, and so is --help."""
    from meshserve.commands.cli import SERVICES, build_parser

    secret = "redis://:s3cret-password@redis:6379/0"
    parser = build_parser({config.REDIS_URL_ENV: secret})
    cls = SERVICES[service][0]
    assert config.from_args(cls, parser.parse_args(["serve", service])).redis_url == secret
    flagged = parser.parse_args(["serve", service, "--redis-url", "redis://other:6379/1"])
    assert config.from_args(cls, flagged).redis_url == "redis://other:6379/1"
    assert config.from_args(cls, build_parser().parse_args(["serve", service])).redis_url == cls().redis_url
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", service, "--help"])
    help_text = capsys.readouterr().out
    assert config.REDIS_URL_ENV in help_text and "s3cret" not in help_text


def test_lora_flags_are_vllms_and_round_trip() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, config.WorkerConfig)
    args = parser.parse_args(["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8", "--max-cpu-loras", "4",
                              "--lora-modules", "a=/adapters/a", "b=/adapters/b"])
    cfg = config.from_args(config.WorkerConfig, args)
    assert (cfg.enable_lora, cfg.max_loras, cfg.max_lora_rank, cfg.cpu_loras) == (True, 2, 8, 4)
    assert cfg.adapters() == {"a": "/adapters/a", "b": "/adapters/b"}
    assert config.from_args(config.WorkerConfig, parser.parse_args(config.to_argv(cfg))) == cfg
    assert config.WorkerConfig(enable_lora=True, max_loras=3).cpu_loras == 3  # vLLM's default: --max-loras


@pytest.mark.parametrize("argv, message", [
    (["--lora-modules", "a=/x"], "--lora-modules needs --enable-lora"),
    (["--enable-lora", "--lora-modules", "a"], "name=path entries, not 'a'"),
    (["--enable-lora", "--lora-modules", "=/x"], "name=path entries, not '=/x'"),
    (["--enable-lora", "--lora-modules", "a=/x", "a=/y"], "names the adapter 'a' twice"),
    (["--enable-lora", "--max-loras", "4", "--max-cpu-loras", "2"], "--max-cpu-loras (2) must be at least --max-loras (4)"),
])
def test_lora_settings_that_cannot_be_served_are_refused(argv: list[str], message: str,
                                                         capsys: pytest.CaptureFixture) -> None:
    from meshserve.commands.cli import main

    with pytest.raises(SystemExit) as refused:
        main(["serve", "worker", "--engine", "sim", *argv])
    assert refused.value.code == 2
    assert message in capsys.readouterr().err


def test_a_lora_rank_vllm_does_not_size_slots_for_is_refused(capsys: pytest.CaptureFixture) -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser, config.WorkerConfig)
    with pytest.raises(SystemExit):
        parser.parse_args(["--max-lora-rank", "12"])
    assert "invalid choice: 12" in capsys.readouterr().err


def test_up_passes_the_lora_settings_to_the_workers_on_the_default_engine(capsys: pytest.CaptureFixture) -> None:
    from meshserve.commands.cli import build_parser, main
    from meshserve.commands.launcher import spec_from_args

    args = build_parser().parse_args(["up", "--enable-lora", "--max-loras", "2", "--lora-modules", "a=/x", "b=/y"])
    spec = spec_from_args(args)
    assert spec.engine == "vllm"
    assert (spec.worker.enable_lora, spec.worker.max_loras, spec.worker.adapters()) == (True, 2, {"a": "/x", "b": "/y"})
    argv = config.to_argv(spec.worker)  # what each worker process is started with
    assert argv[argv.index("--lora-modules") + 1:][:2] == ["a=/x", "b=/y"] and "--enable-lora" in argv
    assert main(["up", "--lora-modules", "a=/x"]) == 2  # refused before anything starts
    assert "--lora-modules needs --enable-lora" in capsys.readouterr().err


def test_up_passes_run_time_adapter_settings_to_the_gateways(tmp_path: Path) -> None:
    from meshserve.commands.cli import build_parser
    from meshserve.commands.launcher import spec_from_args

    args = build_parser().parse_args(["up", "--enable-lora", "--allow-runtime-lora-updating",
                                      "--lora-registry", str(tmp_path)])
    gateway = spec_from_args(args).gateway
    assert (gateway.allow_runtime_lora_updating, gateway.lora_registry) == (True, str(tmp_path))
    argv = config.to_argv(gateway)  # what each gateway process is started with
    assert "--allow-runtime-lora-updating" in argv and argv[argv.index("--lora-registry") + 1] == str(tmp_path)
    assert not config.GatewayConfig().allow_runtime_lora_updating  # off unless asked for, as vLLM's
