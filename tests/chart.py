"""The Helm chart rendered by Helm's own template engine (the helm-python-sdk wheel binds Helm's
Go SDK), for the chart tests and for the check of its KEDA query against a running worker."""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART = ROOT / "deploy" / "helm" / "meshserve"
PROFILES: dict[str, Path | dict[str, Any] | None] = {
    "default": None,
    "gpu-tp4": ROOT / "deploy" / "helm" / "profiles" / "gpu-tp4.yaml",
    "router-embedded": {"router": {"mode": "embedded"}},  # the gateways pick; no router pod
}
RELEASE, NAMESPACE = "mesh", "llm"

helm.enable_logging(logging.WARNING)  # Helm's INFO notes (the chart's symlinked files) stay quiet


def values_of(profile: dict[str, Any] | Path | None) -> dict[str, Any] | None:
    """A profile's values: its file's, or the overrides themselves."""
    return yaml.safe_load(profile.read_text()) if isinstance(profile, Path) else profile


def render(values: dict[str, Any] | Path | None = None) -> list[dict[str, Any]]:
    """Every object the chart renders for ``values`` (a profile's file, or overrides)."""
    out = helm.Chart.load(CHART).render(values_of(values), name=RELEASE, namespace=NAMESPACE, is_install=True)
    return [doc for path, text in sorted(out.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


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
