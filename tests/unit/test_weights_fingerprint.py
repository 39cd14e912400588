"""A worker's weights id (worker.weights): the same for every copy of the same files, another for
other weights, config or tokenizer, without reading whole weight files."""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from meshserve.worker import weights
from meshserve.worker.weights import SMALL_FILE_BYTES, fingerprint

LARGE = 3 * SMALL_FILE_BYTES  # sampled, not read whole


def _model(root: Path, seed: int = 0) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"hidden_size": 64}')
    (root / "tokenizer_config.json").write_text('{"chat_template": "{{ messages }}"}')
    (root / "model.safetensors").write_bytes(random.Random(seed).randbytes(LARGE))
    return root


def test_copies_of_the_same_files_have_one_id_whenever_they_were_written(tmp_path: Path) -> None:
    a = _model(tmp_path / "a")
    b = tmp_path / "b"
    shutil.copytree(a, b)
    os.utime(b / "model.safetensors", (0, 0))  # another pod's download: another modification time
    (a / ".cache").mkdir()  # a downloader's own bookkeeping is not the model
    (a / ".cache" / "state").write_text("etag 1")
    assert fingerprint(str(a)) == fingerprint(str(b))
    assert len(fingerprint(str(a))) == weights.DIGITS


@pytest.mark.parametrize("change", ["weights", "config", "chat template", "a file added"])
def test_other_weights_config_or_template_have_another_id(tmp_path: Path, change: str) -> None:
    model = _model(tmp_path / "m")
    before = fingerprint(str(model))
    if change == "weights":  # fine-tuned: the same shapes, other values
        (model / "model.safetensors").write_bytes(random.Random(1).randbytes(LARGE))
    elif change == "config":
        (model / "config.json").write_text('{"hidden_size": 65}')
    elif change == "chat template":
        (model / "tokenizer_config.json").write_text('{"chat_template": "{{ messages[0] }}"}')
    else:
        (model / "adapter.safetensors").write_bytes(b"\0" * 16)
    assert fingerprint(str(model)) != before


def test_a_large_file_is_sampled_not_read_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(tmp_path / "m")
    read = 0
    real_open = Path.open

    def counting_open(self: Path, *args: Any, **kwargs: Any) -> Any:
        f = real_open(self, *args, **kwargs)
        real_read = f.read

        def counted(n: int = -1) -> bytes:
            nonlocal read
            data = real_read(n)
            read += len(data)
            return data

        f.read = counted  # type: ignore[method-assign]
        return f

    monkeypatch.setattr(Path, "open", counting_open)
    fingerprint(str(model))
    small = sum(f.stat().st_size for f in model.iterdir() if f.suffix == ".json")
    assert read == weights.SAMPLES * weights.SAMPLE_BYTES + small < LARGE


def test_a_hugging_face_cache_link_is_named_by_its_blob(tmp_path: Path) -> None:
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for name, seed in (("a" * 64, 0), ("b" * 64, 0)):  # the same bytes under two content hashes
        (blobs / name).write_bytes(random.Random(seed).randbytes(LARGE))
    ids = []
    for name in ("a" * 64, "b" * 64):
        snapshot = tmp_path / f"snapshot-{name[0]}"
        snapshot.mkdir()
        (snapshot / "model.safetensors").symlink_to(blobs / name)
        ids.append(fingerprint(str(snapshot)))
    assert ids[0] != ids[1]  # the blob's name decides, its bytes are not read


def test_a_model_that_is_no_path_is_named_by_its_name() -> None:
    assert fingerprint("org/no-such-model-here") == fingerprint("org/no-such-model-here")
    assert fingerprint("org/no-such-model-here") != fingerprint("org/no-such-model-there")


def test_a_file_that_cannot_be_read_counts_by_its_name_and_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model(tmp_path / "m")
    (model / "NOTES.md").write_text("kept by someone else")
    real = Path.read_bytes

    def refused(self: Path) -> bytes:
        if self.name == "NOTES.md":
            raise PermissionError(13, "Permission denied")
        return real(self)

    readable = fingerprint(str(model))
    monkeypatch.setattr(Path, "read_bytes", refused)
    assert fingerprint(str(model)) != readable  # computed all the same, without that file's content
