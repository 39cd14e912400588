"""The project's own tiny LLaMA-architecture models and tokenizer, made offline and reproducibly.

No model can be downloaded here, so the mesh serves models it builds itself: random weights
from a fixed seed and a byte-level BPE tokenizer trained on ``worker/data/corpus.txt``. Their
output is gibberish, but they exercise the real engines exactly like a real LLaMA model does.
``TINY_MODELS`` names them: ``meshserve-tiny``, the default, and ``meshserve-tiny-2``, smaller
and from another seed (a second base model for a mesh that serves several); a worker whose
``--model`` is one of these names builds it on first use and serves it under that name.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from meshserve.services.config import DEFAULT_MODEL, default_cache_dir

log = logging.getLogger(__name__)

VERSION = "v1"
NAME = DEFAULT_MODEL
SEED = 1234
CORPUS = Path(__file__).parent / "data" / "corpus.txt"

VOCAB_SIZE = 1024
HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 352
NUM_LAYERS = 2
NUM_HEADS = 4
NUM_KV_HEADS = 2
MAX_POSITIONS = 4096


@dataclass(frozen=True)
class TinyModel:
    """The shape and seed of one of the project's tiny models (they share the tokenizer)."""

    seed: int = SEED
    hidden_size: int = HIDDEN_SIZE
    intermediate_size: int = INTERMEDIATE_SIZE
    num_layers: int = NUM_LAYERS
    num_heads: int = NUM_HEADS
    num_kv_heads: int = NUM_KV_HEADS


SECOND_NAME = f"{NAME}-2"
# By the name each is served under. The second is half as wide (heads of the same size, which
# vLLM's CPU attention supports): cheaper still, and its answers are its own.
TINY_MODELS = {
    NAME: TinyModel(),
    SECOND_NAME: TinyModel(seed=4321, hidden_size=64, intermediate_size=176, num_heads=2, num_kv_heads=1),
}
# Wider than LLaMA's 0.02 so that logits are well apart and greedy decoding has no near-ties
# (vLLM and HF then agree token for token in fp32).
INIT_STD = 0.1

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


# The "decisive" variant: the same model with its attention and MLP outputs (o_proj, down_proj)
# scaled by this, so every step's logits are dominated by the residual stream and their top two
# are never near a tie. Comparisons whose two sides sum in another order (tensor parallel vs one
# rank: the all-reduce) then agree token for token; with flat random logits they part at an
# argmax flip after ~10-50 tokens (tests/integration/test_mesh_tp.py says more).
DECISIVE_SCALE = 0.01


def default_model_dir(decisive: bool = False, name: str = NAME) -> Path:
    return default_cache_dir() / "models" / f"{name}{'-decisive' if decisive else ''}-{VERSION}"


def ensure_model(cache_dir: Path | None = None, decisive: bool = False, name: str = NAME) -> Path:
    """The folder of the tiny model ``name`` (of ``TINY_MODELS``), built on first use. The build
    goes to a temporary folder renamed into place, so a folder that exists is complete
    (concurrent builders: the first rename wins)."""
    if name not in TINY_MODELS:
        raise ValueError(f"no tiny model is named {name!r}; there are {', '.join(TINY_MODELS)}")
    target = Path(cache_dir) if cache_dir is not None else default_model_dir(decisive, name)
    return build_once(target, "config.json", lambda tmp: _build(tmp, decisive, TINY_MODELS[name]))


def build_once(target: Path, marker: str, build: Callable[[Path], None]) -> Path:
    """``target``, built by ``build`` into a temporary folder renamed into place unless it holds
    ``marker`` already: a folder that exists is complete (concurrent builders: the first rename
    wins)."""
    if (target / marker).exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    log.info("building %s", target)
    build(tmp)
    try:
        os.rename(tmp, target)
    except OSError:
        if not (target / marker).exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another process built it first
    return target


def _build(out: Path, decisive: bool = False, shape: TinyModel = TinyModel()) -> None:
    out.mkdir(parents=True)
    _build_tokenizer().save_pretrained(out)
    _build_weights(out, decisive, shape)


def _build_tokenizer():  # -> transformers.PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS, PAD, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS.read_text().splitlines(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=ROLE_TOKENS,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITIONS,
        clean_up_tokenization_spaces=False,
    )


def _build_weights(out: Path, decisive: bool = False, shape: TinyModel = TinyModel()) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_layers,
        num_attention_heads=shape.num_heads,
        num_key_value_heads=shape.num_kv_heads,
        max_position_embeddings=MAX_POSITIONS,
        initializer_range=INIT_STD,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    generator = torch.Generator().manual_seed(shape.seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.copy_(torch.randn(param.shape, generator=generator) * INIT_STD)
            if decisive and name.endswith(("o_proj.weight", "down_proj.weight")):
                param.mul_(DECISIVE_SCALE)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(bos_token_id=0, eos_token_id=1, pad_token_id=2, do_sample=False).save_pretrained(out)


def fingerprint(model_dir: Path) -> str:
    """A hash of every file of the model (the same for every build)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        digest.update(path.relative_to(model_dir).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--output", type=Path, default=None,
        help=f"model folder (default: $MESHSERVE_CACHE_DIR/models/NAME-{VERSION})",
    )
    parser.add_argument("--name", choices=list(TINY_MODELS), default=NAME,
                        help="which tiny model (default: %(default)s)")


def main(args: argparse.Namespace) -> int:
    print(ensure_model(args.output, name=args.name))
    return 0
