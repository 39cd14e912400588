"""The layout is the architecture: every service folder imports only itself and the shared
runtime (services/), the runtime imports only itself, deploy/ only the runtime, and only the
command line (commands/) may use them all. An import across these lines fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"services", "gateway", "router", "worker", "cache_service", "trace_service", "commands", "deploy"}
ALLOWED = {
    "services": {"services"},
    "deploy": {"deploy", "services"},
    **{svc: {svc, "services"} for svc in ("gateway", "router", "worker", "cache_service", "trace_service")},
    "commands": PACKAGES,
}


def imported_packages(path: Path) -> set[str]:
    """The project's top-level packages ``path`` imports (anywhere in it, functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.partition(".")[0])
    return found & PACKAGES


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_its_layer_may(package: str) -> None:
    crossings = {
        str(path.relative_to(ROOT)): sorted(wrong)
        for path in sorted((ROOT / package).rglob("*.py"))
        if (wrong := imported_packages(path) - ALLOWED[package])
    }
    assert not crossings, crossings


def test_the_check_sees_an_import_that_crosses(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from deploy import envoy_config\n    import router.state\n")
    assert imported_packages(module) == {"deploy", "router"}
