"""router.prefix.TokenReuse: a text that begins like a recent one reuses that beginning's tokens
and tokenizes only the rest, and its ids and block hashes are exactly those of tokenizing it
whole — with the sim's tokenizer and with the tiny model's Hugging Face tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from transformers import AutoTokenizer

from meshserve.loadgen.workloads import prefix_repetition_requests
from meshserve.router.prefix import TOKENIZED, PromptBlocks, TokenReuse
from meshserve.services.prompts import SIM_TOKENIZER, Encoder, HfEncoder, SimEncoder, block_hashes

BLOCK = 16


@pytest.fixture(scope="module", params=["sim", "hf"])
def encoder(request: pytest.FixtureRequest, tiny_model: Path) -> Encoder:
    if request.param == "sim":
        return SimEncoder()
    return HfEncoder(AutoTokenizer.from_pretrained(tiny_model))


def _reused() -> float:
    return TOKENIZED.labels(way="reused")._value.get()


def _texts() -> list[str]:
    """Families of texts sharing long beginnings, parting in every way a tokenizer could mind:
    after a word, inside a word, in a run of spaces, at a newline, in punctuation and non-ASCII."""
    rng = random.Random(7)
    texts = [r.prompt for r in prefix_repetition_requests(12, 3, 400, 40, 1, rng)]
    base = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "naïve", "東京", "x=1,", "(ok)"])
                    for _ in range(300))
    for tail in ["", " transform", "transformer", "  two  spaces", "\n\nnew paragraph", "!!?", "é🤖 end",
                 "\t tab", " 12345.678", "ing"]:
        texts.append(base + tail)
    cut = len(base) // 2
    texts += [base[:cut] + "Z" + base[cut:], base[:cut] + base[cut + 1:], base[:cut] + " " + base[cut:]]
    return texts


@pytest.mark.parametrize("special", [True, False])
def test_reused_tokens_are_the_whole_texts_tokens(encoder: Encoder, special: bool) -> None:
    reuse = TokenReuse(encoder, BLOCK)
    before = _reused()
    for text in _texts():
        ids, _ = encoder.encode(text, special)
        assert reuse.tokens(text, special) == (len(ids), block_hashes(ids, BLOCK)), text[-60:]
    assert _reused() - before >= 10  # the texts did share their beginnings' tokens


def test_a_repeated_text_and_an_evicted_one(encoder: Encoder) -> None:
    reuse = TokenReuse(encoder, BLOCK, keep=2)
    texts = _texts()[:4]
    for text in texts + texts[::-1]:
        ids, _ = encoder.encode(text, False)
        assert reuse.tokens(text, False) == (len(ids), block_hashes(ids, BLOCK))


async def test_the_chain_of_a_chat_is_its_templates_tokens(tiny_model: Path) -> None:
    blocks = PromptBlocks()
    await blocks.configure(str(tiny_model), BLOCK)
    hasher = blocks.hasher("")
    assert hasher is not None
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    system = {"role": "system", "content": " ".join(["be brief and exact"] * 60)}
    history: list[dict[str, str]] = [system]
    for turn in range(4):
        history.append({"role": "user", "content": f"question {turn}: " + "why " * (turn + 3)})
        text = tokenizer.apply_chat_template(history, add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert hasher.chain("", history) == tuple(block_hashes(ids, BLOCK, limit=(len(ids) - 1) // BLOCK))
        history.append({"role": "assistant", "content": "because " * (turn + 5)})


async def test_each_model_s_prompts_are_hashed_with_its_own_tokenizer(tiny_model: Path) -> None:
    """A mesh serving two base models whose tokenizers differ: each model's prompts are hashed with
    the tokenizer its workers reported, whichever worker connected first."""
    blocks = PromptBlocks()
    await blocks.configure(SIM_TOKENIZER, BLOCK, "sim-model")
    await blocks.configure(str(tiny_model), BLOCK, "tiny")
    await blocks.configure(SIM_TOKENIZER, BLOCK, "sim-model")  # another worker of the first model
    assert blocks.ready
    prompt = " ".join(f"word{i} and some more" for i in range(40))
    hf = AutoTokenizer.from_pretrained(tiny_model)
    expected = {}
    for model, ids in [("sim-model", SimEncoder().encode(prompt, False)[0]), ("tiny", hf.encode(prompt))]:
        expected[model] = tuple(block_hashes(ids, BLOCK, limit=(len(ids) - 1) // BLOCK))
    hashed = {}
    for model in expected:
        hasher = blocks.hasher(model)
        assert hasher is not None
        hashed[model] = hasher.chain(prompt, None)
    assert hashed == expected and expected["sim-model"] != expected["tiny"]
    # A request naming no model, in a mesh whose workers hash differently, is not hashed.
    assert blocks.hasher("") is None and blocks.hasher("other") is None
    blocks.close()


def test_the_remembered_tokens_stay_within_their_budget(encoder: Encoder) -> None:
    reuse = TokenReuse(encoder, BLOCK, keep=100, keep_tokens=3000)
    for text in _texts():
        reuse.tokens(text, False)
        remembered = list(reuse._seen.values())
        assert sum(len(s.ids) for s in remembered) <= 3000
        assert all(s in remembered for s in reuse._by_chunk.values())  # no key outlives its text
    ids, _ = encoder.encode(_texts()[-1], False)
    assert reuse.tokens(_texts()[-1], False) == (len(ids), block_hashes(ids, BLOCK))
