"""The ``meshserve`` command: run the whole mesh, one service, a request, or a benchmark."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sys
from collections.abc import Mapping

from meshserve.services import config

# `meshserve serve NAME` -> (config class, module whose async `main(cfg)` runs the service).
SERVICES: dict[str, tuple[type, str]] = {
    "gateway": (config.GatewayConfig, "meshserve.commands.gateway_service"),
    "router": (config.RouterConfig, "meshserve.router.server"),
    "cache": (config.CacheConfig, "meshserve.cache_service.server"),
    "worker": (config.WorkerConfig, "meshserve.worker.server"),
    "traces": (config.TracesConfig, "meshserve.trace_service.server"),
}

# Other subcommands live in their own modules, each with `add_arguments(parser)` and `main(args)`.
COMMANDS: dict[str, tuple[str, str]] = {
    "up": ("meshserve.commands.launcher", "start the whole mesh locally (Valkey, cache, router, workers, gateway, Envoy)"),
    "generate": ("meshserve.commands.client", "stream a completion through Envoy"),
    "bench": ("meshserve.commands.bench", "load-test the mesh or one worker (like `vllm bench serve`)"),
    "plot": ("meshserve.commands.plot", "plot saved bench results side by side (TTFT/ITL CDFs, throughput, in flight)"),
    "compare": ("meshserve.commands.compare", "tabulate saved bench results' headline figures and ratios to the first"),
    "make-model": ("meshserve.worker.tiny_model", "build the project's tiny LLaMA model and tokenizer"),
    "make-adapter": ("meshserve.worker.tiny_adapter", "build a small LoRA adapter for the tiny model (PEFT format)"),
    "envoy-config": ("meshserve.deploy.envoy_config", "print the generated Envoy config (or write it and run Envoy on it)"),
    "health": ("meshserve.commands.health_cmd", "ask a service's gRPC health service whether it serves (exit 0 if so)"),
    "trace": ("meshserve.commands.trace_cmd", "print one trace from the local trace receiver as a waterfall"),
    "traces": ("meshserve.commands.traces_cmd", "list the slowest recent traces in the local trace receiver"),
    "usage": ("meshserve.commands.usage_cmd", "the usage ledger per tenant, summed across the gateways (--json for scripts)"),
    "top": ("meshserve.commands.top", "a live terminal view of a running mesh (workers, gateway, router, cache, Envoy)"),
}


def build_parser(environ: Mapping[str, str] | None = None) -> argparse.ArgumentParser:
    """The whole CLI; ``environ`` fills the services' flags that may come from the environment
    (config.add_arguments: ``env``)."""
    parser = argparse.ArgumentParser(prog="meshserve", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run one service (what Kubernetes runs)")
    serve_sub = serve.add_subparsers(dest="service", required=True)
    for name, (cls, _) in SERVICES.items():
        config.add_arguments(serve_sub.add_parser(name, help=(cls.__doc__ or "").strip()), cls, environ=environ)
    for name, (module, help_text) in COMMANDS.items():
        importlib.import_module(module).add_arguments(sub.add_parser(name, help=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(os.environ)
    args = parser.parse_args(argv)
    if args.command == "serve":
        cls, module = SERVICES[args.service]
        try:
            cfg = config.from_args(cls, args)
        except ValueError as e:  # flags that contradict each other (a config's __post_init__)
            parser.error(str(e))
        from meshserve.services.server import configure_logging

        configure_logging(cfg.log_level)
        asyncio.run(importlib.import_module(module).main(cfg))
        return 0
    module, _ = COMMANDS[args.command]
    return int(importlib.import_module(module).main(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
