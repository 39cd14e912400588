"""The layout is the architecture: every service folder imports only itself and the shared
runtime (services/), the runtime imports only itself, deploy/ and the load generator (loadgen/)
only the runtime, only the command line (commands/) may use them all, and the benchmark scripts
(bench/) import only installed packages. An import across these lines fails here, and so does
any import cycle between the modules of these folders."""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"services", "gateway", "router", "worker", "cache_service", "trace_service", "commands", "deploy",
            "loadgen"}
# Top-level folders of the repository that are not installed: the benchmark scripts and the tests.
FOLDERS = {"bench", "tests"}
ALLOWED = {
    "services": {"services"},
    "deploy": {"deploy", "services"},
    **{svc: {svc, "services"} for svc in ("gateway", "router", "worker", "cache_service", "trace_service")},
    "loadgen": {"loadgen", "services"},
    "commands": PACKAGES,
    # `python bench/X.py` puts bench/, not the repository, on sys.path: a script imports installed
    # packages only (router_scale.py measures the router's picks in-process, semantic.py the cache
    # service's matching and lookups), never another script.
    "bench": {"loadgen", "services", "router", "cache_service"},
}


def _folder_path(dotted: str) -> str:
    """A module's name by its folder: ``meshserve.gateway.relay`` (as installed) is ``gateway.relay``."""
    return dotted.removeprefix("meshserve.")


def imported_packages(path: Path) -> set[str]:
    """The project's top-level packages and folders ``path`` imports (anywhere in it, functions included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {_folder_path(alias.name).partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(_folder_path(node.module).partition(".")[0])
    return found & (PACKAGES | FOLDERS)


def sources(folder: str) -> list[Path]:
    """The Python files of a package, or bench/'s scripts (bench/results/ keeps past runs' files)."""
    return sorted((ROOT / folder).glob("*.py") if folder == "bench" else (ROOT / folder).rglob("*.py"))


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_each_package_imports_only_what_its_layer_may(package: str) -> None:
    crossings = {
        str(path.relative_to(ROOT)): sorted(wrong)
        for path in sources(package)
        if (wrong := imported_packages(path) - ALLOWED[package])
    }
    assert not crossings, crossings


def test_the_check_sees_an_import_that_crosses(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("def f():\n    from meshserve.deploy import envoy_config\n    import meshserve.router.state\n"
                      "    import bench\n")
    assert imported_packages(module) == {"deploy", "router", "bench"}


# ---------------------------------------------------------------------------------------------
# Import cycles, module by module
# ---------------------------------------------------------------------------------------------


def modules_under(root: Path, folders: Iterable[str]) -> dict[str, Path]:
    """Every module under ``folders`` of ``root`` by its dotted name (a package by its ``__init__``)."""
    modules = {}
    for folder in folders:
        for path in (root / folder).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _deepest(dotted: str, modules: Collection[str]) -> str | None:
    """The longest prefix of ``dotted`` that is one of ``modules`` (``a.b.name`` -> ``a.b``)."""
    parts = dotted.split(".")
    return next((m for i in range(len(parts), 0, -1) if (m := ".".join(parts[:i])) in modules), None)


def imported_modules(name: str, path: Path, modules: Collection[str]) -> set[str]:
    """The ``modules`` that module ``name`` (the file ``path``) imports anywhere in it (in
    functions and under TYPE_CHECKING too), each the deepest module the import names; relative
    imports are resolved against ``name``'s package."""
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    targets = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            anchor = package[: len(package) - node.level + 1] if node.level else []
            base = ".".join([*anchor, *([node.module] if node.module else [])])
            targets += [f"{base}.{alias.name}" if base else alias.name for alias in node.names]
    found = {m for target in targets if (m := _deepest(_folder_path(target), modules)) is not None}
    return found - {name}


def import_graph(root: Path, folders: Iterable[str]) -> dict[str, set[str]]:
    """Module -> the modules it imports, over every module under ``folders`` of ``root``."""
    modules = modules_under(root, folders)
    return {name: imported_modules(name, path, modules) for name, path in modules.items()}


def find_cycle(graph: Mapping[str, Collection[str]]) -> list[str]:
    """One import cycle of ``graph`` as ``[a, b, ..., a]``, or ``[]`` when there is none."""
    done: set[str] = set()
    path: list[str] = []  # the modules being visited, each imported by the one before

    def visit(module: str) -> list[str]:
        path.append(module)
        for imported in sorted(graph.get(module, ())):
            if imported in path:
                return [*path[path.index(imported):], imported]
            if imported not in done and (cycle := visit(imported)):
                return cycle
        path.pop()
        done.add(module)
        return []

    for module in sorted(graph):
        if module not in done and (cycle := visit(module)):
            return cycle
    return []


def test_no_module_imports_itself_through_others() -> None:
    cycle = find_cycle(import_graph(ROOT, sorted(PACKAGES | {"bench"})))
    assert not cycle, " -> ".join(cycle)


def test_the_cycle_check_finds_a_cycle_through_type_checking_functions_and_relative_imports(
    tmp_path: Path,
) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .c import C\n")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (pkg / "b.py").write_text("def f():\n    from .sub import c\n")
    (pkg / "sub" / "c.py").write_text("import json\nfrom .. import a\n")
    (pkg / "d.py").write_text("from pkg import a, b\nimport pkg.sub.c\n")  # imports the cycle, not in it
    graph = import_graph(tmp_path, ["pkg"])
    assert graph["pkg.d"] == {"pkg.a", "pkg.b", "pkg.sub.c"} and graph["pkg.sub"] == {"pkg.sub.c"}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    (pkg / "sub" / "c.py").write_text("import json\n")
    assert find_cycle(import_graph(tmp_path, ["pkg"])) == []
