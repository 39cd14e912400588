"""Regenerates the Python stubs and the Envoy descriptor set from protos/ (one command).

Run ``python -m meshserve.commands.codegen`` (``make proto``); ``--check`` fails if the committed files
differ from what protos/ generates (CI's drift check).
"""

from __future__ import annotations

import argparse
import importlib.resources
import re
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
GEN = ROOT / "services" / "gen"
DESCRIPTOR = ROOT / "deploy" / "envoy" / "meshserve.pb"
PROTO_FILES = ["meshserve.proto"]  # the mesh's services: the stubs and Envoy's descriptor set
INTERNAL_PROTO_FILES = ["traces.proto"]  # stubs only: nothing of it passes Envoy


def _include_dirs() -> list[str]:
    well_known = importlib.resources.files("grpc_tools") / "_proto"
    # googleapis-common-protos ships google/api/*.proto next to its Python modules.
    import google.api

    googleapis = Path(google.api.__path__[0]).parent.parent
    return [str(PROTOS), str(well_known), str(googleapis)]


def generate(out_dir: Path, descriptor: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    descriptor.parent.mkdir(parents=True, exist_ok=True)
    args = ["protoc", *(f"-I{d}" for d in _include_dirs())]
    args += [
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        "--include_imports",
        f"--descriptor_set_out={descriptor}",
        *PROTO_FILES,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    internal = ["protoc", *(f"-I{d}" for d in _include_dirs()), f"--python_out={out_dir}", f"--pyi_out={out_dir}",
                f"--grpc_python_out={out_dir}", *INTERNAL_PROTO_FILES]
    if protoc.main(internal) != 0:
        raise SystemExit("protoc failed")
    # protoc writes top-level imports ("import meshserve_pb2"); make them package-relative.
    for grpc_file in out_dir.glob("*_pb2_grpc.py"):
        text = grpc_file.read_text()
        grpc_file.write_text(re.sub(r"^import (\w+_pb2) as", r"from . import \1 as", text, flags=re.M))
    (out_dir / "__init__.py").write_text('"""Generated from protos/ by `python -m meshserve.commands.codegen`; do not edit."""\n')


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if generated files are stale")
    args = parser.parse_args(argv)
    if not args.check:
        generate(GEN, DESCRIPTOR)
        print(f"generated {GEN.relative_to(ROOT)}/ and {DESCRIPTOR.relative_to(ROOT)}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        out, desc = Path(tmp) / "gen", Path(tmp) / "meshserve.pb"
        generate(out, desc)
        stale = [
            str(p.relative_to(ROOT))
            for p, fresh in [(GEN / f.name, f) for f in sorted(out.iterdir()) if f.is_file()] + [(DESCRIPTOR, desc)]
            if not p.exists() or p.read_bytes() != fresh.read_bytes()
        ]
    if stale:
        print("generated code is stale; run `make proto`:", *stale, sep="\n  ", file=sys.stderr)
        return 1
    print("generated code is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
