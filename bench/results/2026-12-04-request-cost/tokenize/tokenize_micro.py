"""A prompt's token ids on the tiny model's tokenizer, as the router and the worker compute them
(services.prompts.hf_prompt_ids): transformers' encode() against hf_encode's short way, alternated.
    PYTHONPATH=. .venv/bin/python bench/results/2026-12-04-request-cost/tokenize/tokenize_micro.py"""
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
from transformers import AutoTokenizer  # noqa: E402

from services import prompts  # noqa: E402
from worker.tiny_model import ensure_model  # noqa: E402

tok = AutoTokenizer.from_pretrained(ensure_model())
chat = [{"role": "user", "content": "question 17 of the cost probe: how far is the nearest city from the coast, "
                                    "in kilometres, and why? " * 2}]
plain = "The quick brown fox jumps over the lazy dog"


def transformers_ids(prompt, messages):
    if messages:
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return list(tok.encode(text, add_special_tokens=False))
    return list(tok.encode(prompt))


def timed(f, n=3000):
    f()
    t = time.perf_counter()
    for _ in range(n):
        f()
    return (time.perf_counter() - t) / n * 1e6


assert transformers_ids("", chat) == prompts.hf_prompt_ids(tok, "", chat)
for rnd in range(3):
    for label, prompt, messages in (("chat", "", chat), ("plain", plain, None)):
        a = timed(lambda: transformers_ids(prompt, messages))
        b = timed(lambda: prompts.hf_prompt_ids(tok, prompt, messages))
        print(f"round {rnd + 1} {label:5}: transformers {a:6.1f} us, hf_encode {b:6.1f} us (x{b / a:.2f})")
