"""What a worker's answers depend on beyond the model's name: a fingerprint of the files the engine
loaded (``WorkerInfo.weights_id``). The response cache keys its entries by it, so a fleet serving
new weights under the same name is never answered with the old weights' completions.

Reading hundreds of gigabytes of weights to hash them would take minutes, so the fingerprint
covers what changes when they change: every file's path and size, the content of the small ones
(config, generation config, tokenizer config and chat template, up to ``SMALL_FILE_BYTES``), and
of each large one (the weights, a large tokenizer) the blob a Hugging Face cache links it to
(named by its content hash) or else ``SAMPLES`` slices of its content spread over the file, its
beginning (a safetensors header: every tensor's name, type and shape) and end included. It
depends on the files' content only, so every copy of the same weights (one per pod) has the same
one; fine-tuned weights differ in nearly every slice. An operator who wants a name of their own
(a model version) gives the worker ``--weights-id``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from pathlib import Path

from meshserve.services.config import WorkerConfig

log = logging.getLogger(__name__)

SMALL_FILE_BYTES = 1 << 20  # read whole up to this; sampled above
SAMPLES = 16                # slices read of a large file
SAMPLE_BYTES = 1 << 16      # each
DIGITS = 16                 # hex digits kept of the sha256


async def weights_id(cfg: WorkerConfig, model: str) -> str:
    """The worker's weights id: its ``--weights-id``, else the fingerprint of ``model`` (read off
    the event loop)."""
    return cfg.weights_id or await asyncio.to_thread(fingerprint, model)


def fingerprint(model: str) -> str:
    """The fingerprint of ``model``: a local directory or file, or a Hugging Face repository id
    found in the local cache (where vLLM downloaded it); of the name itself when neither."""
    path = Path(model)
    if not path.exists():
        path = _cached_snapshot(model) or path
    digest = hashlib.sha256()
    if not path.exists():
        log.warning("model %r is neither a path nor in the Hugging Face cache: its weights id is "
                    "a hash of its name (give the worker --weights-id to name its weights)", model)
        digest.update(f"name\0{model}".encode())
        return digest.hexdigest()[:DIGITS]
    files = [path] if path.is_file() else sorted(
        f for f in path.rglob("*") if f.is_file() and not any(part.startswith(".") for part in f.relative_to(path).parts)
    )
    for f in files:
        name = f.name if f == path else f.relative_to(path).as_posix()
        size = f.stat().st_size
        digest.update(f"{name}\0{size}\0".encode())
        try:
            if size <= SMALL_FILE_BYTES:
                digest.update(f.read_bytes())
            elif f.is_symlink() and _is_blob(target := Path(os.path.realpath(f))):
                digest.update(target.name.encode())  # a Hugging Face cache blob, named by its content hash
            else:
                _sample(f, size, digest)
        except OSError as e:  # not the engine's to read either (a README of other permissions): never fatal
            log.warning("weights id: cannot read %s (%s); counted by its name and size only", f, e)
        digest.update(b"\n")
    return digest.hexdigest()[:DIGITS]


def _is_blob(path: Path) -> bool:
    return path.parent.name == "blobs" and len(path.name) >= 40


def _sample(path: Path, size: int, digest: hashlib._Hash) -> None:
    """``SAMPLES`` slices of the file's content, from its first byte to its last."""
    step = (size - SAMPLE_BYTES) / (SAMPLES - 1)
    with path.open("rb") as f:
        for i in range(SAMPLES):
            f.seek(round(i * step))
            digest.update(f.read(SAMPLE_BYTES))


def _cached_snapshot(repo_id: str) -> Path | None:
    """The local snapshot of a Hugging Face repository (None when it is not cached)."""
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, local_files_only=True))
    except Exception:  # noqa: BLE001 - not a repository id, or not downloaded
        return None
