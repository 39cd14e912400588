"""The exact-match cache key: stable for the same request, different for anything that changes output."""

from __future__ import annotations

import pytest

from meshserve.services.cache_keys import canonical, exact_key
from meshserve.services.gen import meshserve_pb2 as pb


def base() -> pb.GenerateRequest:
    return pb.GenerateRequest(prompt="Hello", max_tokens=16, temperature=0.0, stop=["\n"], model="m")


def test_same_request_same_key() -> None:
    assert exact_key(base(), "t") == exact_key(base(), "t")


def test_prefix_and_kind_are_in_the_key() -> None:
    key = exact_key(base(), "t", prefix="meshserve:cache:")
    assert key.startswith("meshserve:cache:exact:")
    assert len(key.rsplit(":", 1)[1]) == 64


def test_request_id_skip_cache_and_stream_interval_are_ignored() -> None:
    other = base()
    other.request_id = "abc"
    other.skip_cache = True
    other.stream_interval = 8  # how the text is chunked, not what it is
    assert exact_key(other, "t") == exact_key(base(), "t")


def test_tenant_isolates() -> None:
    assert exact_key(base(), "a") != exact_key(base(), "b")


def test_defaults_are_applied_before_hashing() -> None:
    unset = pb.GenerateRequest(prompt="Hello", seed=1)
    spelled = pb.GenerateRequest(prompt="Hello", seed=1, max_tokens=128, temperature=1.0, top_p=1.0)
    assert exact_key(unset, "t") == exact_key(spelled, "t")


def test_stop_order_does_not_matter() -> None:
    a, b = base(), base()
    a.stop[:] = ["x", "y"]
    b.stop[:] = ["y", "x"]
    assert exact_key(a, "t") == exact_key(b, "t")


def _with(**changes: object) -> pb.GenerateRequest:
    req = base()
    for name, value in changes.items():
        if name == "messages":
            req.ClearField("prompt")
            req.messages.extend(value)  # type: ignore[arg-type]
        elif name in ("stop", "stop_token_ids"):
            getattr(req, name)[:] = value
        elif name == "logit_bias":
            req.logit_bias.update(value)  # type: ignore[call-overload]
        elif name == "structured_outputs":
            req.structured_outputs.CopyFrom(value)  # type: ignore[arg-type]
        else:
            setattr(req, name, value)
    return req


@pytest.mark.parametrize(
    "changes",
    [
        {"prompt": "Hello!"},
        {"messages": [pb.ChatMessage(role="user", content="Hello")]},
        {"model": "other"},
        {"max_tokens": 17},
        {"temperature": 0.5},
        {"top_p": 0.9},
        {"seed": 7},
        {"stop": ["\n", "."]},
        {"stop": []},
        {"ignore_eos": True},
        {"presence_penalty": 0.5},
        {"frequency_penalty": -0.5},
        {"repetition_penalty": 1.2},
        {"top_k": 5},
        {"min_p": 0.1},
        {"min_tokens": 4},
        {"stop_token_ids": [2]},
        {"logit_bias": {7: 5.0}},
        {"include_stop_str_in_output": True},
        {"skip_special_tokens": False},
        {"logprobs": 0},
        {"logprobs": 3},
        {"structured_outputs": pb.StructuredOutputs(json_object=True)},
        {"structured_outputs": pb.StructuredOutputs(regex="[a-z]+")},
    ],
    ids=lambda c: f"{next(iter(c))}={next(iter(c.values()))}",
)
def test_output_changing_field_changes_key(changes: dict[str, object]) -> None:
    assert exact_key(_with(**changes), "t") != exact_key(base(), "t")


# Fields that never change the text (or are the gateway's own, set on a migrated stream).
NOT_IN_KEY = {"request_id", "skip_cache", "stream_interval", "user", "cache", "continue_token_ids",
              "priority",    # when a request is served, not what it is answered
              "lora_path"}   # where a worker finds the adapter the key's model names (the registry's)


def test_every_field_of_the_request_is_in_the_key_or_listed_as_not() -> None:
    """A new GenerateRequest field must be hashed, or named here as not changing the output."""
    for field in pb.GenerateRequest.DESCRIPTOR.fields:
        if field.name in NOT_IN_KEY or field.name in ("prompt", "messages"):
            continue
        req = base()
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            getattr(req, field.name)[3] = 1.0
        elif field.name == "structured_outputs":
            req.structured_outputs.json_object = True
        elif field.is_repeated:
            getattr(req, field.name).append("x" if field.type == field.TYPE_STRING else 3)
        elif field.type == field.TYPE_BOOL:  # whichever of the two is not the default
            setattr(req, field.name, True)
            if exact_key(req, "t") == exact_key(base(), "t"):
                setattr(req, field.name, False)
        elif field.type == field.TYPE_STRING:
            setattr(req, field.name, getattr(req, field.name) + "x")
        else:
            setattr(req, field.name, getattr(req, field.name) + 3)
        assert exact_key(req, "t") != exact_key(base(), "t"), f"{field.name} is not in the cache key"


def test_how_the_template_ends_a_chat_is_in_the_key() -> None:
    turns = [pb.ChatMessage(role="user", content="2+2?"), pb.ChatMessage(role="assistant", content="It is")]
    opened = pb.GenerateRequest(messages=turns, temperature=0)
    said = pb.GenerateRequest(messages=turns, temperature=0, add_generation_prompt=True)
    closed = pb.GenerateRequest(messages=turns, temperature=0, add_generation_prompt=False)
    continued = pb.GenerateRequest(messages=turns, temperature=0, add_generation_prompt=False, continue_final_message=True)
    assert exact_key(opened, "t") == exact_key(said, "t")  # the default spelled out
    assert len({exact_key(r, "t") for r in (opened, closed, continued)}) == 3


def test_an_answers_thinking_in_the_history_is_in_the_key() -> None:
    def chat(reasoning: str) -> pb.GenerateRequest:
        return pb.GenerateRequest(messages=[pb.ChatMessage(role="assistant", content="4", reasoning=reasoning),
                                            pb.ChatMessage(role="user", content="why?")], temperature=0)
    assert exact_key(chat("two and two"), "t") != exact_key(chat(""), "t")
    assert b"reasoning" not in canonical(chat(""), "t")  # a turn without thinking keeps its key


def test_tool_turns_are_in_the_key() -> None:
    plain = pb.GenerateRequest(messages=[pb.ChatMessage(role="tool", content="42")], temperature=0)
    answering = pb.GenerateRequest(messages=[pb.ChatMessage(role="tool", content="42", tool_call_id="c1")],
                                   temperature=0)
    calling = pb.GenerateRequest(messages=[pb.ChatMessage(role="assistant", tool_calls=[
        pb.ToolCall(id="c1", name="f", arguments="{}")])], temperature=0)
    assert len({exact_key(r, "t") for r in (plain, answering, calling)}) == 3


def test_top_k_minus_one_and_zero_share_a_key() -> None:
    assert exact_key(_with(top_k=-1), "t") == exact_key(_with(top_k=0), "t")


def test_max_tokens_default_differs_from_other_values() -> None:
    unset = pb.GenerateRequest(prompt="Hello", temperature=0)
    explicit = pb.GenerateRequest(prompt="Hello", temperature=0, max_tokens=64)
    assert exact_key(unset, "t") != exact_key(explicit, "t")


def test_messages_are_distinguished_by_role_and_boundary() -> None:
    one = pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="ab")], temperature=0)
    two = pb.GenerateRequest(
        messages=[pb.ChatMessage(role="user", content="a"), pb.ChatMessage(role="user", content="b")],
        temperature=0,
    )
    system = pb.GenerateRequest(messages=[pb.ChatMessage(role="system", content="ab")], temperature=0)
    assert len({exact_key(one, "t"), exact_key(two, "t"), exact_key(system, "t")}) == 3


def test_template_kwargs_are_in_the_key_and_a_request_without_keeps_its_key() -> None:
    chat = pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="why")], temperature=0)
    thinking = pb.GenerateRequest(messages=chat.messages, temperature=0, chat_template_kwargs='{"enable_thinking": true}')
    assert exact_key(thinking, "t") != exact_key(chat, "t")
    assert b"chat_template_kwargs" not in canonical(chat, "t")  # entries stored before the field are still found


def test_an_entry_keeps_what_a_reasoning_parser_took_apart() -> None:
    from meshserve.services.cache_keys import _entry_bytes, parse_entry

    chunks = [pb.GenerateResponse(text="", reasoning="so: four", token_ids=[1, 2]),
              pb.GenerateResponse(text="Four.", token_ids=[3], finish_reason="stop", usage=pb.Usage(reasoning_tokens=2))]
    replayed = parse_entry(_entry_bytes(chunks)).chunks
    assert [(c.reasoning, c.text) for c in replayed] == [("so: four", ""), ("", "Four.")]
    assert replayed[-1].usage.reasoning_tokens == 2


def test_include_reasoning_false_has_a_key_of_its_own_and_unset_or_true_share_one() -> None:
    chat = pb.GenerateRequest(messages=[pb.ChatMessage(role="user", content="why")], temperature=0)
    kept = pb.GenerateRequest(messages=chat.messages, temperature=0, include_reasoning=True)
    dropped = pb.GenerateRequest(messages=chat.messages, temperature=0, include_reasoning=False)
    assert exact_key(chat, "t") == exact_key(kept, "t") != exact_key(dropped, "t")


def test_a_lora_adapters_name_is_in_the_key() -> None:
    """A request naming an adapter and one naming the base model (or another adapter) are
    answered by other weights: three entries."""
    keys = {exact_key(_with(model=model), "t") for model in ("m", "support", "legal")}
    assert len(keys) == 3
