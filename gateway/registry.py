"""The LoRA adapters a gateway may have loaded on demand (``--lora-registry``): a request naming one
that no worker holds is sent with its folder, and the worker picked loads it first (vLLM's LoRA
resolvers, for a fleet).

The registry is a folder whose subfolders are adapters, each named by its folder (as vLLM's
filesystem resolver reads ``VLLM_LORA_RESOLVER_CACHE_DIR``: an adapter dropped in is served
without a restart), or a file of ``name=path`` lines (``#`` starts a comment), read at start.
Paths are the workers': a folder they all see (a shared volume), as --lora-modules' are.
"""

from __future__ import annotations

import os
import re

NAME_RE = re.compile(r"[A-Za-z0-9_.:-]{1,128}")  # a folder name of its own: no separator, not . or ..
CONFIG = "adapter_config.json"  # what makes a folder a PEFT adapter


class LoraRegistry:
    """``path(name)``: the folder of the adapter ``name``, or None when the registry has none."""

    def __init__(self, source: str) -> None:
        self._folder: str | None = None
        self._paths: dict[str, str] = {}
        if os.path.isdir(source):
            self._folder = source
        elif os.path.isfile(source):
            self._paths = parse(open(source, encoding="utf-8").read(), source)
        else:
            raise ValueError(f"--lora-registry {source!r}: neither a folder of adapters nor a file of name=path lines")

    def path(self, name: str) -> str | None:
        if self._folder is None:
            return self._paths.get(name)
        if not NAME_RE.fullmatch(name) or name in (".", ".."):
            return None
        folder = os.path.join(self._folder, name)
        return folder if os.path.isfile(os.path.join(folder, CONFIG)) else None


def parse(text: str, source: str) -> dict[str, str]:
    """``name=path`` lines -> {name: path}; ValueError naming the line of the first mistake."""
    paths: dict[str, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        name, _, path = (part.strip() for part in line.partition("="))
        if not name or not path:
            raise ValueError(f"{source} line {n}: expected name=path, got {line!r}")
        if name in paths:
            raise ValueError(f"{source} line {n}: the adapter {name!r} is named twice")
        paths[name] = path
    return paths
