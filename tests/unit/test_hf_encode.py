"""services.prompts.hf_encode gives transformers' token ids, on the short way and the long one."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.prompts import (
    SIM_TEMPLATE_VARIABLES,
    TemplateCall,
    chat_turns,
    hf_encode,
    hf_prompt_ids,
    sim_render,
    template_variables,
)

TEXTS = [
    "The quick brown fox",
    "",
    "  leading and trailing spaces  ",
    "Unicode: naïve café, 東京, emoji 🤖, tabs\tand\nnewlines",
    "numbers 3.14159 and 1,000,000 and code: def f(x): return x ** 2",
    "a" * 3000,
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model)


@pytest.mark.parametrize("special", [True, False])
def test_the_same_ids_as_transformers(tokenizer: Any, special: bool) -> None:
    for text in [*TEXTS, *(t + tokenizer.eos_token + t for t in TEXTS)]:
        assert hf_encode(tokenizer, text, add_special_tokens=special) == tokenizer.encode(text, add_special_tokens=special)


def test_a_chat_prompt_as_the_chat_template_and_transformers_make_it(tokenizer: Any) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": TEXTS[3]}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert hf_prompt_ids(tokenizer, "", messages) == tokenizer.encode(text, add_special_tokens=False)
    assert hf_prompt_ids(tokenizer, TEXTS[0], None) == tokenizer.encode(TEXTS[0])


def test_a_truncation_left_on_the_backend_does_not_cut_the_prompt(tiny_model: Path) -> None:
    # transformers' encode() truncates only when asked; a backend configured to truncate (some
    # tokenizer.json files are) must not cut a prompt the engine would get whole.
    fresh = AutoTokenizer.from_pretrained(tiny_model)
    fresh.backend_tokenizer.enable_truncation(max_length=8)
    text = TEXTS[4]
    ids = hf_encode(fresh, text)
    assert len(ids) > 8 and ids == AutoTokenizer.from_pretrained(tiny_model).encode(text)


def test_an_answers_thinking_in_the_history_reaches_a_template_that_shows_it(tokenizer: Any) -> None:
    """An assistant turn's reasoning goes to the template as vLLM gives it (``reasoning_content``
    too, the name templates such as Qwen3's read)."""
    showing = copy.deepcopy(tokenizer)
    showing.chat_template = ("{% for m in messages %}{% if m.reasoning_content %}<think>{{ m.reasoning_content }}"
                             "</think>{% endif %}{{ m.content }}</s>{% endfor %}")
    turns = chat_turns([pb.ChatMessage(role="user", content="2+2?"),
                        pb.ChatMessage(role="assistant", content="4", reasoning="two and two")])
    assert showing.decode(hf_prompt_ids(showing, "", turns)) == "2+2?</s><think>two and two</think>4</s>"


def test_a_past_calls_arguments_reach_the_template_parsed_or_as_their_text() -> None:
    """Arguments that are JSON are parsed; text that is not, or JSON nested deeper than Python's
    parser recurses, stays text (a request, not a server error)."""
    deep = "[" * 5000 + "]" * 5000
    calls = [pb.ToolCall(id=str(i), name="f", arguments=text) for i, text in enumerate(['{"x": 1}', "not json", deep])]
    (turn,) = chat_turns([pb.ChatMessage(role="assistant", tool_calls=calls)])
    assert [c["function"]["arguments"] for c in turn["tool_calls"]] == [{"x": 1}, "not json", deep]


def test_the_final_message_left_open_or_no_turn_opened(tokenizer: Any) -> None:
    """vLLM's continue_final_message (the model continues an answer begun for it) and
    add_generation_prompt false, through the model's template as transformers renders them."""
    begun = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "The answer is"}]
    continued = tokenizer.decode(hf_prompt_ids(tokenizer, "", begun, call=TemplateCall(False, True)))
    assert continued.endswith("<|assistant|>\nThe answer is")
    closed = tokenizer.decode(hf_prompt_ids(tokenizer, "", begun[:1], call=TemplateCall(add_generation_prompt=False)))
    assert closed.endswith("2+2?</s>\n") and "<|assistant|>" not in closed


def test_template_kwargs_reach_the_chat_template(tokenizer: Any) -> None:
    """vLLM's chat_template_kwargs: more variables for the model's template (a thinking switch
    here), rendered by the worker as vLLM renders them."""
    thinking = copy.deepcopy(tokenizer)
    thinking.chat_template = tokenizer.chat_template + "{% if enable_thinking %}<think>{% endif %}"
    messages = [{"role": "user", "content": "why"}]
    plain = hf_prompt_ids(thinking, "", messages)
    assert plain == hf_prompt_ids(tokenizer, "", messages)  # unset: the template as it was
    on = hf_prompt_ids(thinking, "", messages, template_kwargs={"enable_thinking": True})
    assert on == tokenizer.encode(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
                                  + "<think>", add_special_tokens=False)
    assert hf_prompt_ids(thinking, "", messages, template_kwargs={"enable_thinking": False}) == plain


def test_only_the_templates_own_variables_reach_it(tokenizer: Any) -> None:
    """chat_template_kwargs against an allow list, as vLLM checks them: the variables the template
    reads, less what its renderer gives it (special tokens, Jinja's and transformers' functions). A
    client cannot set the template's BOS text or break the template's own functions."""
    reading = copy.deepcopy(tokenizer)
    reading.chat_template = ("{{ bos_token }}{% for i in range(1) %}{% endfor %}"
                             "{% if enable_thinking %}<think>{% endif %}" + tokenizer.chat_template)
    assert template_variables(reading.chat_template) == {"bos_token", "enable_thinking", "messages",
                                                         "add_generation_prompt"}
    messages = [{"role": "user", "content": "why"}]
    plain = hf_prompt_ids(reading, "", messages)
    thinking = hf_prompt_ids(reading, "", messages, template_kwargs={"enable_thinking": True})
    assert thinking != plain
    assert hf_prompt_ids(reading, "", messages, template_kwargs={
        "enable_thinking": True, "bos_token": "<|system|>", "range": 0, "not_read": 1}) == thinking


def test_the_sims_stand_in_template_reads_its_own_variables_only() -> None:
    messages = [{"role": "user", "content": "why"}]
    plain = sim_render("", messages)
    assert sim_render("", messages, {"not_read": True}) == plain
    for name in SIM_TEMPLATE_VARIABLES:
        assert sim_render("", messages, {name: True}) != plain
