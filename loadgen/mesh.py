"""A mesh for benchmark scripts: `meshserve up` from a source tree, ready, the addresses it
printed, and its services' Prometheus samples."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

def cli_module(tree: Path | None) -> str:
    """The command line's module in source tree ``tree`` (None: this one), whatever its layout:
    ``meshserve.commands.cli``; in a tree from before the ``meshserve`` package, ``commands.cli``;
    before ``commands/``, ``services.cli``."""
    if tree is None or (tree / "meshserve" / "__init__.py").exists():
        return "meshserve.commands.cli"
    return "commands.cli" if (tree / "commands" / "cli.py").exists() else "services.cli"


def cli(tree: Path | None = None) -> list[str]:
    """The command that runs ``meshserve`` from ``tree`` (with ``tree_env(tree)``)."""
    return [sys.executable, "-m", cli_module(tree)]


def policy_runs(policies: str, variants: list[str]) -> dict[str, list[str]]:
    """The `meshserve up` flags of each run a routing benchmark compares, by label: each of the
    comma-separated ``policies`` (``--routing`` it), and each ``--variant "LABEL=POLICY [FLAGS]"``
    (a policy with more flags, under its own label)."""
    runs = {p: ["--routing", p] for p in policies.split(",") if p}
    for variant in variants:
        label, _, rest = variant.partition("=")
        policy, *flags = shlex.split(rest)
        runs[label] = ["--routing", policy, *flags]
    return runs


def samples(url: str) -> dict[str, float]:
    """A service's Prometheus samples, by name and labels as exported (``name{a="b"}``)."""
    with urllib.request.urlopen(url, timeout=5) as r:
        lines = r.read().decode().splitlines()
    return {key: float(value) for key, _, value in (line.rpartition(" ") for line in lines)
            if key and not key.startswith("#")}


def by_name(url: str) -> dict[str, float]:
    """A service's Prometheus samples, summed by name over their labels."""
    out: dict[str, float] = {}
    for key, value in samples(url).items():
        name = key.partition("{")[0]
        out[name] = out.get(name, 0.0) + value
    return out


def prefix_sum(scrape: dict[str, float], prefix: str) -> float:
    """The sum of the samples of ``scrape`` (``samples``) whose name and labels begin with ``prefix``."""
    return sum(v for k, v in scrape.items() if k.startswith(prefix))


def summed(url: str, prefix: str) -> float:
    """The sum of the samples of ``url`` whose name and labels begin with ``prefix``."""
    return prefix_sum(samples(url), prefix)


def tree_env(tree: Path) -> dict[str, str]:
    """The environment that runs the code of ``tree`` (a worktree of the commit measured)."""
    return {**os.environ, "PYTHONPATH": str(tree)}


@dataclass
class UpMesh:
    lines: list[str]  # what `meshserve up` printed up to its table

    def metrics(self, name: str) -> str:
        """The metrics URL of service ``name`` ("gateway", "router", ...); the router's is the
        first gateway's when the router is embedded there (``--router embedded``)."""
        found = [ln.split()[-1] for ln in self.lines if ln.split()[:2] == [name, "metrics"]]
        if not found and name == "router":
            return self.metrics("gateway")
        return found[0]

    def worker_metrics(self) -> list[str]:
        return self.all_metrics("worker")

    def all_metrics(self, kind: str) -> list[str]:
        """The metrics URLs of every service of a kind, in order: "worker-0", "worker-1", ...;
        "gateway", "gateway-1", ... ("  worker-0 metrics   http://127.0.0.1:PORT/metrics")."""
        return [ln.split()[-1] for ln in self.lines
                if ln.split()[1:2] == ["metrics"] and ln.split()[0].partition("-")[0] == kind]


@contextmanager
def meshserve_up(flags: list[str], run_dir: str, tree: Path) -> Iterator[UpMesh]:
    """`meshserve up FLAGS` until it prints its table; Ctrl-C (SIGINT) on the way out."""
    up = subprocess.Popen([*cli(tree), "up", *flags, "--run-dir", run_dir], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, cwd=tree, env=tree_env(tree))
    assert up.stdout is not None
    lines: list[str] = []
    try:
        for line in up.stdout:  # `meshserve up` prints its table once everything is ready
            lines.append(line)
            if line.startswith("Try:"):
                break
        else:
            raise RuntimeError("meshserve up failed:\n" + "".join(lines[-30:]))
        yield UpMesh(lines)
    finally:
        up.send_signal(2)
        try:
            up.wait(60)
        except subprocess.TimeoutExpired:
            up.kill()
