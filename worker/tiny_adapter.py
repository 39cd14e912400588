"""Small LoRA adapters for the project's tiny model, made offline and reproducibly.

An adapter is random, non-zero low-rank weights for every attention and MLP projection of the
tiny model (worker/tiny_model.py), written in the PEFT format vLLM loads (``adapter_config.json``
and ``adapter_model.safetensors``). Its weights come from a seed alone, so the same name, seed and
rank give the same files byte for byte, and two seeds give adapters whose outputs differ.
"""

from __future__ import annotations

import argparse
import json
import zlib
from pathlib import Path

import numpy as np

from meshserve.services.config import DEFAULT_MODEL, default_cache_dir
from meshserve.worker import tiny_model

VERSION = "v1"
DEFAULT_RANK = 8
# vLLM serves adapters of these ranks (its LoRAConfig's max_lora_rank choices); --max-lora-rank
# must be at least the adapter's.
RANKS = (1, 8, 16, 32, 64, 128, 256)
# LoRA's A and B both random: B A is a change of the weights about as large as the weights themselves
# (scaled by lora_alpha / r = 2), so every adapter's greedy output parts from the base model's.
INIT_STD = 0.1
ALPHA_PER_RANK = 2

_ATTENTION = {"q_proj": tiny_model.NUM_HEADS, "k_proj": tiny_model.NUM_KV_HEADS,
              "v_proj": tiny_model.NUM_KV_HEADS}


def target_shapes() -> dict[str, tuple[int, int]]:
    """Each target module of one decoder layer and its (in, out) features."""
    hidden, head_dim = tiny_model.HIDDEN_SIZE, tiny_model.HIDDEN_SIZE // tiny_model.NUM_HEADS
    shapes = {name: (hidden, heads * head_dim) for name, heads in _ATTENTION.items()}
    shapes["o_proj"] = (hidden, hidden)
    shapes["gate_proj"] = shapes["up_proj"] = (hidden, tiny_model.INTERMEDIATE_SIZE)
    shapes["down_proj"] = (tiny_model.INTERMEDIATE_SIZE, hidden)
    return shapes


def default_seed(name: str) -> int:
    """The seed of an adapter made without one: from its name, so two names give two adapters."""
    return zlib.crc32(name.encode())


def default_adapter_dir(name: str, seed: int, rank: int) -> Path:
    return default_cache_dir() / "adapters" / f"{DEFAULT_MODEL}-{tiny_model.VERSION}" / f"{name}-s{seed}-r{rank}-{VERSION}"


def ensure_adapter(name: str, seed: int | None = None, rank: int = DEFAULT_RANK, output: Path | None = None) -> Path:
    """The adapter's folder, built on first use (into a temporary folder renamed into place, so a
    folder that exists is complete, as the tiny model's)."""
    if rank not in RANKS:
        raise ValueError(f"rank {rank} is not one vLLM serves; choose one of {', '.join(map(str, RANKS))}")
    seed = default_seed(name) if seed is None else seed
    target = Path(output) if output is not None else default_adapter_dir(name, seed, rank)

    def build(tmp: Path) -> None:
        tmp.mkdir()
        _write(tmp, seed, rank)

    return tiny_model.build_once(target, "adapter_config.json", build)


def _write(out: Path, seed: int, rank: int) -> None:
    from safetensors.numpy import save_file

    shapes = target_shapes()
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(tiny_model.NUM_LAYERS):
        for module, (fan_in, fan_out) in shapes.items():
            block = "self_attn" if module in (*_ATTENTION, "o_proj") else "mlp"
            prefix = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((rank, fan_in)) * INIT_STD).astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((fan_out, rank)) * INIT_STD).astype(np.float32)
    save_file(tensors, str(out / "adapter_model.safetensors"))
    config = {
        "base_model_name_or_path": DEFAULT_MODEL,
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": ALPHA_PER_RANK * rank,
        "lora_dropout": 0.0,
        "target_modules": sorted(shapes),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    (out / "adapter_config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the adapter's name (what requests will send as 'model')")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of its random weights (default: one derived from the name)")
    parser.add_argument("--rank", type=int, default=DEFAULT_RANK, choices=RANKS,
                        help="LoRA rank r; serve it with --max-lora-rank at least this (default: %(default)s)")
    parser.add_argument("--output", type=Path, default=None,
                        help="adapter folder (default: $MESHSERVE_CACHE_DIR/adapters/MODEL/NAME-sSEED-rRANK-"
                             f"{VERSION})")


def main(args: argparse.Namespace) -> int:
    print(ensure_adapter(args.name, args.seed, args.rank, args.output))
    return 0
