"""`meshserve make-adapter`: PEFT files vLLM loads, the same bytes for the same seed, weights that
are not zero and fit the tiny model's projections."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from meshserve.commands import cli
from meshserve.worker.tiny_adapter import ensure_adapter


def test_the_command_prints_the_folder_on_its_last_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHSERVE_CACHE_DIR", str(tmp_path))
    assert cli.main(["make-adapter", "support", "--seed", "3", "--rank", "16"]) == 0
    folder = Path(capsys.readouterr().out.splitlines()[-1])
    assert folder.is_relative_to(tmp_path / "adapters")
    assert sorted(p.name for p in folder.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["peft_type"], config["task_type"], config["r"]) == ("LORA", "CAUSAL_LM", 16)


def test_the_same_seed_gives_the_same_files_another_seed_other_weights(tmp_path: Path) -> None:
    one = ensure_adapter("a", seed=7, output=tmp_path / "one")
    again = ensure_adapter("a", seed=7, output=tmp_path / "again")
    other = ensure_adapter("a", seed=8, output=tmp_path / "other")
    for name in ("adapter_config.json", "adapter_model.safetensors"):
        assert (one / name).read_bytes() == (again / name).read_bytes()
    assert (one / "adapter_model.safetensors").read_bytes() != (other / "adapter_model.safetensors").read_bytes()


def test_two_names_without_a_seed_are_two_adapters(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MESHSERVE_CACHE_DIR", str(tmp_path))
    a, b = ensure_adapter("a"), ensure_adapter("b")
    assert a != b
    assert (a / "adapter_model.safetensors").read_bytes() != (b / "adapter_model.safetensors").read_bytes()


def test_every_projection_has_non_zero_weights_of_the_models_shapes(tmp_path: Path, tiny_model: Path) -> None:
    rank = 8
    tensors = load_file(str(ensure_adapter("a", seed=1, rank=rank, output=tmp_path / "a") / "adapter_model.safetensors"))
    model = load_file(str(tiny_model / "model.safetensors"))
    targets = json.loads((tmp_path / "a" / "adapter_config.json").read_text())["target_modules"]
    projections = [name.removesuffix(".weight") for name in model
                   if name.endswith(".weight") and name.split(".")[-2] in targets]
    assert len(projections) == 2 * 7  # two layers, seven projections each
    for projection in projections:
        out_features, in_features = model[f"{projection}.weight"].shape
        a = tensors[f"base_model.model.{projection}.lora_A.weight"]
        b = tensors[f"base_model.model.{projection}.lora_B.weight"]
        assert (a.shape, b.shape) == ((rank, in_features), (out_features, rank))
        assert np.count_nonzero(a) == a.size and np.count_nonzero(b) == b.size
    assert len(tensors) == 2 * len(projections)


def test_a_rank_vllm_does_not_serve_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="rank 5"):
        ensure_adapter("a", rank=5, output=tmp_path / "a")
