"""OpenAI request/response conversion: what is accepted, what is refused (by field name), and
the shapes of replies and stream chunks."""

from __future__ import annotations

import json

import pytest
from google.protobuf import json_format

from meshserve.gateway import openai_convert as convert
from meshserve.services import validation
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.validation import InvalidRequest


def chat(**body: object) -> pb.ChatCompletionRequest:
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return json_format.ParseDict(body, pb.ChatCompletionRequest())


def completion(**body: object) -> pb.CompletionRequest:
    body.setdefault("prompt", "hi")
    return json_format.ParseDict(body, pb.CompletionRequest())


def test_chat_request_maps_fields() -> None:
    req = convert.chat_request(chat(
        model="m", max_tokens=5, temperature=0, top_p=0.5, seed=7, stop="END", user="u", n=1,
        presence_penalty=0, messages=[{"role": "system", "content": "s"},
                                      {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                                      {"role": "assistant", "content": None}],
    ))
    assert [(m.role, m.content) for m in req.messages] == [("system", "s"), ("user", "ab"), ("assistant", "")]
    assert (req.model, req.max_tokens, req.temperature, req.top_p, req.seed) == ("m", 5, 0, 0.5, 7)
    assert req.user == "u"  # the session key of session-affinity routing
    assert list(req.stop) == ["END"] and req.HasField("temperature")
    assert not req.HasField("stream_interval")


def test_vllm_stream_interval_extension_is_carried() -> None:
    assert convert.chat_request(chat(stream_interval=8)).stream_interval == 8
    assert convert.completion_request(completion(stream_interval=4)).stream_interval == 4


def test_max_completion_tokens_wins_and_unset_fields_stay_unset() -> None:
    assert convert.chat_request(chat(max_tokens=5, max_completion_tokens=9)).max_tokens == 9
    req = convert.chat_request(chat())
    assert not req.HasField("max_tokens") and not req.HasField("temperature") and not req.stop


def test_vllm_sampling_fields_are_carried() -> None:
    req = convert.chat_request(chat(
        presence_penalty=0.5, frequency_penalty=-0.25, repetition_penalty=1.1, top_k=5, min_p=0.05,
        min_tokens=2, stop_token_ids=[3, 4], logit_bias={"7": -100, "9": 2.5}, include_stop_str_in_output=True,
        skip_special_tokens=False, logprobs=True, top_logprobs=3,
    ))
    assert (req.presence_penalty, req.frequency_penalty, req.repetition_penalty) == (0.5, -0.25, pytest.approx(1.1))
    assert (req.top_k, req.min_tokens, list(req.stop_token_ids)) == (5, 2, [3, 4])
    assert dict(req.logit_bias) == {7: -100.0, 9: 2.5}
    assert req.include_stop_str_in_output and req.HasField("skip_special_tokens") and not req.skip_special_tokens
    assert req.logprobs == 3
    assert not convert.chat_request(chat(logprobs=False)).HasField("logprobs")
    assert convert.chat_request(chat(logprobs=True)).logprobs == 0  # each token's own logprob only
    assert convert.completion_request(completion(logprobs=2, top_k=-1)).logprobs == 2


SCHEMA = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1}}, "required": ["n"]}


@pytest.mark.parametrize(("body", "expected"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": SCHEMA}}},
     {"json": SCHEMA}),
    ({"response_format": {"type": "json_object"}}, {"json_object": True}),
    ({"response_format": {"type": "text"}}, None),
    ({"structured_outputs": {"json": SCHEMA}}, {"json": SCHEMA}),
    ({"structured_outputs": {"json": '{"type": "string"}'}}, {"json": {"type": "string"}}),
    ({"structured_outputs": {"regex": "[a-z]+"}}, {"regex": "[a-z]+"}),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, {"choice": {"values": ["yes", "no"]}}),
    ({"structured_outputs": {"grammar": "root ::= \"a\""}}, {"grammar": 'root ::= "a"'}),
])
def test_structured_output_becomes_the_requests_constraint(body: dict, expected: dict | None) -> None:
    for req in (convert.chat_request(chat(**body)), convert.completion_request(completion(**body))):
        if expected is None:
            assert not req.HasField("structured_outputs")
            continue
        got = json_format.MessageToDict(req.structured_outputs, preserving_proto_field_name=True)
        if "json" in got:
            assert "1.0" not in got["json"]  # a Struct's numbers are doubles: integral ones go back to ints
            got["json"] = json.loads(got["json"])
        assert got == expected


@pytest.mark.parametrize(("body", "field"), [
    ({"response_format": {"type": "xml"}}, "'response_format.type'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "'response_format.json_schema.schema'"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}}},
     "'response_format.json_schema.schema'"),
    ({"response_format": {"type": "json_object"}, "structured_outputs": {"regex": "a"}}, "give 'response_format'"),
    ({"structured_outputs": {}}, "'structured_outputs'"),
    ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "'structured_outputs'"),
    ({"structured_outputs": {"json": "{not json"}}, "'structured_outputs.json'"),
    ({"structured_outputs": {"json": {"properties": {"a": {"minimum": "x"}}}}}, "'structured_outputs.json'"),
])
def test_a_bad_constraint_never_reaches_an_engine(body: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        convert.chat_request(chat(**body))
    assert str(err.value).startswith(field)


def test_n_choices_get_their_own_ids_and_seeds() -> None:
    req = convert.chat_request(chat(n=3, seed=2**63 - 2))
    assert convert.choices(chat(n=3)) == 3
    reqs = convert.choice_requests(req, "abc", 3)
    assert [r.request_id for r in reqs] == ["abc-0", "abc-1", "abc-2"]
    assert [r.seed for r in reqs] == [2**63 - 2, 2**63 - 1, -(2**63)]  # as vLLM: seed + i (wrapped to int64)
    unseeded = convert.choice_requests(convert.chat_request(chat(n=2, temperature=0.5)), "g", 2)
    assert not any(r.HasField("seed") for r in unseeded)
    assert [r.request_id for r in convert.choice_requests(req, "one", 1)] == ["one"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"n": 0}, "'n'"),
        ({"n": 129}, "'n'"),
        ({"n": 2, "temperature": 0}, "'n'"),  # vLLM: greedy choices would all be the same
        ({"top_logprobs": 2}, "'top_logprobs'"),
        ({"logprobs": True, "top_logprobs": 21}, "'top_logprobs'"),
        ({"stop": [1, 2]}, "'stop'"),
        ({"messages": []}, "'messages'"),
        ({"messages": [{"role": "user", "content": 5}]}, "'messages[0].content'"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, "'messages[0].content[0]'"),
    ],
)
def test_chat_refuses_what_it_cannot_honour(body: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        convert.chat_request(chat(**body))
    assert str(err.value).startswith(field)


def test_openais_informational_fields_are_accepted_and_checked() -> None:
    """store, metadata, service_tier, safety_identifier, verbosity and modalities: what a client
    written for OpenAI sends, accepted as vllm serve accepts them; prompt_cache_key routes."""
    req = convert.chat_request(chat(
        store=True, metadata={"team": "search", "k" * 64: "v" * 512}, service_tier="flex",
        safety_identifier="h" * 64, verbosity="low", modalities=["text"], user="u", prompt_cache_key="conv-7",
    ))
    assert req.user == "conv-7"  # the session key: OpenAI's cache-locality hint wins over user
    assert convert.chat_request(chat(user="u")).user == "u"
    assert req.priority == 1  # the flex tier: served after the default one (below)
    req.ClearField("priority")
    assert req == convert.chat_request(chat(user="u", prompt_cache_key="conv-7"))  # nothing else reaches a worker


@pytest.mark.parametrize(("body", "priority"), [
    ({}, None), ({"service_tier": "priority"}, None), ({"service_tier": "flex"}, 1), ({"service_tier": "auto"}, None),
    ({"priority": 7}, 7), ({"priority": 7, "service_tier": "priority"}, 7),  # vLLM's own field wins
])
def test_priority_and_the_service_tier_ask_for_a_priority(body: dict, priority: int | None) -> None:
    req = convert.chat_request(chat(**body))
    assert (req.priority if req.HasField("priority") else None) == priority


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"metadata": {str(i): "v" for i in range(17)}}, "metadata"),
        ({"metadata": {"k" * 65: "v"}}, "metadata"),
        ({"metadata": {"k": "v" * 513}}, "metadata"),
        ({"service_tier": "gold"}, "service_tier"),
        ({"verbosity": "loud"}, "verbosity"),
        ({"safety_identifier": "h" * 65}, "safety_identifier"),
        ({"modalities": ["text", "audio"]}, "modalities"),
    ],
)
def test_openais_informational_fields_out_of_bounds_are_refused(body: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        convert.chat_request(chat(**body))
    assert err.value.param == field and str(err.value).startswith(f"'{field}")


def test_template_kwargs_and_reasoning_effort_go_to_the_template_as_vllm_gives_them() -> None:
    req = convert.chat_request(chat(chat_template_kwargs={"thinking_budget": 512, "enable_thinking": False}))
    assert json.loads(req.chat_template_kwargs) == {"thinking_budget": 512, "enable_thinking": False}  # 512, not 512.0
    req = convert.chat_request(chat(reasoning_effort="none"))
    assert json.loads(req.chat_template_kwargs) == {"reasoning_effort": "none", "enable_thinking": False}
    req = convert.chat_request(chat(reasoning_effort="high", chat_template_kwargs={"enable_thinking": False,
                                                                                   "reasoning_effort": "low"}))
    assert json.loads(req.chat_template_kwargs) == {"reasoning_effort": "high", "enable_thinking": False}
    assert not convert.chat_request(chat()).chat_template_kwargs
    counted = convert.tokenize_request(json_format.ParseDict(
        {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": True}},
        pb.TokenizeRequest()))
    assert json.loads(counted.chat_template_kwargs) == {"enable_thinking": True}  # /tokenize counts the same prompt


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reasoning_effort": "extreme"}, "reasoning_effort"),
        ({"chat_template_kwargs": {"tokenize": True}}, "chat_template_kwargs"),
        ({"chat_template_kwargs": {"add_generation_prompt": False, "messages": []}}, "chat_template_kwargs"),
    ],
)
def test_template_kwargs_the_worker_cannot_honour_are_refused(body: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:  # converted, then validated as the gateway validates a request
        validation.validate(convert.chat_request(chat(**body)))
    assert err.value.param == field and str(err.value).startswith(f"'{field}'")


def test_an_openai_answer_put_back_in_the_history_is_taken() -> None:
    """OpenAI's answers carry refusal, annotations, audio and function_call; a client that appends
    an answer to its history sends them back."""
    req = convert.chat_request(chat(messages=[
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": None, "refusal": "I can't help with that.", "annotations": [],
         "audio": None, "function_call": None, "tool_calls": []},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "No."}, {"type": "text", "text": " Sorry."}]},
        {"role": "assistant", "content": "b", "refusal": None, "annotations": [{"type": "url_citation"}]},
    ]))
    assert [m.content for m in req.messages] == ["a", "I can't help with that.", "No. Sorry.", "b"]
    thought = convert.chat_request(chat(messages=[
        {"role": "user", "content": "a", "reasoning": "not a user's"},
        {"role": "assistant", "content": "4", "reasoning": "2+2"},
        {"role": "assistant", "content": "5", "reasoning_content": "2+3"},  # the older name, DeepSeek's
    ]))
    assert [m.reasoning for m in thought.messages] == ["", "2+2", "2+3"]  # an answer's thinking, back in the history


@pytest.mark.parametrize("field", ["audio", "function_call"])
def test_an_assistant_turn_with_audio_or_a_function_call_is_refused(field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        convert.chat_request(chat(messages=[{"role": "user", "content": "a"},
                                            {"role": "assistant", "content": "b", field: {"id": "x"}}]))
    assert err.value.param == f"messages[1].{field}"


def test_an_answer_begun_for_the_model_is_continued_as_vllm_continues_it() -> None:
    """vLLM's add_generation_prompt / continue_final_message (prefill): carried, and checked as vLLM
    checks them."""
    begun = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "The answer is"}]
    req = convert.chat_request(chat(messages=begun, continue_final_message=True, add_generation_prompt=False))
    assert req.continue_final_message and req.HasField("add_generation_prompt") and not req.add_generation_prompt
    validation.validate(req)
    plain = convert.chat_request(chat())
    assert not plain.HasField("add_generation_prompt") and not plain.continue_final_message
    for bad in (pb.GenerateRequest(messages=req.messages, continue_final_message=True),  # the opening too: vLLM refuses
                pb.GenerateRequest(messages=[pb.ChatMessage(role="assistant", content="")], continue_final_message=True,
                                   add_generation_prompt=False),
                pb.GenerateRequest(prompt="x", continue_final_message=True, add_generation_prompt=False)):
        with pytest.raises(InvalidRequest) as err:
            validation.validate(bad)
        assert err.value.param == "continue_final_message"


def test_completion_request() -> None:
    req = convert.completion_request(completion(prompt=["one"], stop=["a", "b"]))
    assert req.prompt == "one" and list(req.stop) == ["a", "b"]
    assert req.max_tokens == convert.COMPLETIONS_DEFAULT_MAX_TOKENS


@pytest.mark.parametrize(
    ("body", "field"),
    [({"prompt": ["a", "b"]}, "'prompt'"), ({"prompt": [1, 2]}, "'prompt'"), ({"prompt": None}, "'prompt'"),
     ({"echo": True, "logprobs": 1}, "'echo'"), ({"best_of": 3}, "'best_of'"), ({"n": 2, "best_of": 3}, "'best_of'")],
)
def test_completion_refuses_what_it_cannot_honour(body: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        convert.completion_request(completion(**body))
    assert str(err.value).startswith(field)


def logprob(token: str, value: float, *top: tuple[str, float]) -> pb.TokenLogprob:
    return pb.TokenLogprob(token=token, logprob=value, top=[pb.TopLogprob(token=t, logprob=v) for t, v in top])


def test_chat_logprobs_have_openai_shape() -> None:
    out = json_format.MessageToDict(convert.chat_logprobs([logprob("é", -0.5, ("é", -0.5), ("a", -1.5))]),
                                    preserving_proto_field_name=True)
    assert out == {"content": [{"token": "é", "logprob": -0.5, "bytes": [195, 169],
                                "top_logprobs": [{"token": "é", "logprob": -0.5, "bytes": [195, 169]},
                                                 {"token": "a", "logprob": -1.5, "bytes": [97]}]}]}


def test_completion_logprobs_have_the_legacy_shape() -> None:
    out = convert.completion_logprobs([logprob(" a", -0.5, (" b", -0.25)), logprob("bc", -1.0)], offset=4)
    assert list(out.text_offset) == [4, 6] and list(out.tokens) == [" a", "bc"]
    assert list(out.token_logprobs) == [-0.5, -1.0]
    assert [dict(t) for t in out.top_logprobs] == [{" b": -0.25, " a": -0.5}, {"bc": -1.0}]


def test_n_choices_are_indexed_and_their_usage_summed() -> None:
    resps = [pb.CompleteResponse(text=t, finish_reason="stop", usage=pb.Usage(prompt_tokens=3, completion_tokens=c,
                                                                             cached_prompt_tokens=2))
             for t, c in (("a", 1), ("bb", 2))]
    out = convert.chat_completion(resps, "x", False, "m", 1)
    assert [(c.index, c.message.content) for c in out.choices] == [(0, "a"), (1, "bb")]
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (3, 3, 6)
    assert out.id == "chatcmpl-x" and not out.choices[0].HasField("logprobs")
    text = convert.completion(resps, "x", True, "hi ", "m", 1)
    assert [c.text for c in text.choices] == ["hi a", "hi bb"] and text.choices[1].HasField("logprobs")


def test_chat_chunks_carry_role_first_then_finish() -> None:
    first = convert.chat_chunk(pb.GenerateResponse(request_id="r-1", text="a"), 1, True, "r", False, "m", 1)
    last = convert.chat_chunk(
        pb.GenerateResponse(request_id="r-1", text="", finish_reason="stop", cache_kind="exact"), 1, False, "r",
        False, "m", 1)
    assert first.choices[0].delta.role == "assistant" and first.choices[0].index == 1
    assert not first.choices[0].HasField("finish_reason") and not first.HasField("cache")
    assert last.choices[0].finish_reason == "stop" and not last.choices[0].delta.HasField("role")
    assert last.cache.kind == "exact" and {first.id, last.id} == {"chatcmpl-r"}


def test_a_workers_thinking_is_vllms_reasoning_field_in_chunks_messages_and_usage() -> None:
    """A worker's reasoning parser splits the thinking from the answer: vLLM's server puts it in
    `reasoning` (a chunk of thinking alone has no content), and counts its tokens in usage."""
    thinking = convert.chat_chunk(pb.GenerateResponse(text="", reasoning="hmm"), 0, True, "r", False, "m", 1)
    answer = convert.chat_chunk(pb.GenerateResponse(text="Four.", reasoning=""), 0, False, "r", False, "m", 1)
    both = convert.chat_chunk(pb.GenerateResponse(text="Four", reasoning="so"), 0, False, "r", False, "m", 1)
    assert json_format.MessageToDict(thinking.choices[0].delta) == {"role": "assistant", "reasoning": "hmm"}
    assert json_format.MessageToDict(answer.choices[0].delta) == {"content": "Four."}
    assert json_format.MessageToDict(both.choices[0].delta) == {"content": "Four", "reasoning": "so"}
    done = pb.CompleteResponse(text="Four.", reasoning="hmm", finish_reason="stop",
                               usage=pb.Usage(prompt_tokens=3, completion_tokens=5, reasoning_tokens=2))
    reply = convert.chat_completion([done, done], "r", False, "m", 1)
    assert (reply.choices[0].message.reasoning, reply.choices[0].message.content) == ("hmm", "Four.")
    assert reply.usage.completion_tokens_details.reasoning_tokens == 4  # both choices'
    plain = convert.chat_completion([pb.CompleteResponse(text="a", usage=pb.Usage(completion_tokens=1))], "r", False,
                                    "m", 1)
    assert not plain.choices[0].message.HasField("reasoning") and not plain.usage.HasField("completion_tokens_details")
    assert convert.chat_request(chat(include_reasoning=False)).include_reasoning is False
    assert not convert.chat_request(chat()).HasField("include_reasoning")


def test_completion_chunk_puts_the_echo_first_and_offsets_logprobs() -> None:
    chunk = pb.GenerateResponse(text=" a", logprobs=[logprob(" a", -0.1)], finish_reason="length")
    out = convert.completion_chunk(chunk, 0, "hi", 0, "r", True, "m", 1)
    assert out.choices[0].text == "hi a" and out.choices[0].finish_reason == "length"
    assert list(out.choices[0].logprobs.text_offset) == [2]


WEATHER = {"type": "function", "function": {"name": "weather", "description": "today's weather",
                                            "parameters": {"type": "object", "required": ["city"],
                                                           "properties": {"city": {"type": "string"}}}}}
TIME = {"type": "function", "function": {"name": "time"}}
NAMED = {"type": "function", "function": {"name": "weather"}}


def test_a_named_tool_choice_is_its_parameters_schema() -> None:
    req = convert.chat_request(chat(tools=[WEATHER, TIME], tool_choice=NAMED, messages=[
        {"role": "user", "content": "weather in Oslo?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]))
    assert json.loads(req.structured_outputs.json) == WEATHER["function"]["parameters"]
    tools = json.loads(req.tools)  # for the chat template
    assert [t["function"]["name"] for t in tools] == ["weather", "time"]
    assert tools[1]["function"]["parameters"] == convert.EMPTY_PARAMETERS
    call = req.messages[1].tool_calls[0]
    assert (call.id, call.name, call.arguments) == ("c1", "weather", '{"city": "Oslo"}')
    assert req.messages[2].tool_call_id == "c1"


def test_required_is_a_list_of_calls_and_none_passes_the_tools_only() -> None:
    req = convert.chat_request(chat(tools=[WEATHER, TIME], tool_choice="required", parallel_tool_calls=False))
    schema = json.loads(req.structured_outputs.json)
    assert schema["type"] == "array" and schema["minItems"] == 1 and schema["maxItems"] == 1
    assert [s["properties"]["name"]["enum"] for s in schema["items"]["anyOf"]] == [["weather"], ["time"]]
    none = convert.chat_request(chat(tools=[WEATHER], tool_choice="none"))
    assert none.tools and not none.HasField("structured_outputs")


@pytest.mark.parametrize(("body", "field"), [
    ({"tool_choice": "required"}, "'tool_choice'"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "'tool_choice'"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "'tool_choice'"),
    ({"tools": [WEATHER, WEATHER], "tool_choice": "required"}, "'tools[1].function.name'"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}], "tool_choice": "none"},
     "'tools[0].function.parameters'"),
    ({"tools": [WEATHER], "tool_choice": NAMED, "response_format": {"type": "json_object"}}, "'tool_choice'"),
])
def test_tool_requests_that_cannot_be_served_are_refused(body: dict, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        convert.chat_request(chat(**body))
    assert str(err.value).startswith(field) and err.value.param == field.strip("'")


def test_a_forced_call_is_answered_as_tool_calls() -> None:
    done = pb.CompleteResponse(text='{"city": "Oslo"}', finish_reason="stop")
    named = convert.chat_completion([done], "x", False, "m", 1, (convert.FUNCTION, "weather"))
    message = named.choices[0].message
    assert message.content == "" and named.choices[0].finish_reason == "stop"  # as vLLM: "stop" for a named call
    (call,) = message.tool_calls
    assert (call.type, call.function.name, json.loads(call.function.arguments)) == ("function", "weather", {"city": "Oslo"})
    assert call.id.startswith("chatcmpl-tool-")
    listed = pb.CompleteResponse(text='[{"name": "time", "parameters": {}}, {"name": "weather", "parameters": '
                                      '{"city": "Rome"}}]', finish_reason="stop")
    required = convert.chat_completion([listed], "x", False, "m", 1, (convert.REQUIRED, ""))
    assert [c.function.name for c in required.choices[0].message.tool_calls] == ["time", "weather"]
    assert required.choices[0].finish_reason == "tool_calls"
    cut = convert.chat_completion([pb.CompleteResponse(text='[{"na', finish_reason="length")], "x", False, "m", 1,
                                  (convert.REQUIRED, ""))
    assert cut.choices[0].message.content == '[{"na' and not cut.choices[0].message.tool_calls


def test_a_named_call_streams_its_arguments() -> None:
    tools = (convert.FUNCTION, "weather")
    first = convert.chat_chunk(pb.GenerateResponse(text='{"ci'), 0, True, "r", False, "m", 1, tools)
    last = convert.chat_chunk(pb.GenerateResponse(text='ty": "Oslo"}', finish_reason="stop"), 0, False, "r", False,
                              "m", 1, tools)
    (head,), (tail,) = first.choices[0].delta.tool_calls, last.choices[0].delta.tool_calls
    assert head.id and head.type == "function" and head.function.name == "weather" and head.function.arguments == '{"ci'
    assert not tail.HasField("id") and not tail.function.HasField("name") and tail.function.arguments == 'ty": "Oslo"}'
    assert not first.choices[0].delta.HasField("content") and last.choices[0].finish_reason == "stop"


def test_auto_asks_the_worker_to_parse_the_calls_and_answers_with_what_it_found() -> None:
    for body in ({"tools": [WEATHER]}, {"tools": [WEATHER], "tool_choice": "auto"}):  # auto: the default
        req = convert.chat_request(chat(**body))
        assert req.parse_tool_calls and req.tools and not req.HasField("structured_outputs")
    assert not convert.chat_request(chat(tools=[WEATHER], tool_choice="none")).parse_tool_calls
    auto = (convert.AUTO, "")
    done = pb.CompleteResponse(text="", finish_reason="tool_calls",
                               tool_calls=[pb.ToolCall(id="chatcmpl-tool-1", name="weather", arguments='{"city": "Oslo"}')])
    choice = convert.chat_completion([done], "x", False, "m", 1, auto).choices[0]
    (call,) = choice.message.tool_calls
    assert (call.id, call.type, call.function.name, call.function.arguments) == (
        "chatcmpl-tool-1", "function", "weather", '{"city": "Oslo"}')
    assert choice.finish_reason == "tool_calls"
    plain = convert.chat_completion([pb.CompleteResponse(text="Sunny.", finish_reason="stop")], "x", False, "m", 1, auto)
    assert plain.choices[0].message.content == "Sunny." and not plain.choices[0].message.tool_calls
    # Streamed: content as it comes; a call's first piece has its id, type and name.
    first = convert.chat_chunk(pb.GenerateResponse(tool_calls=[pb.ToolCallDelta(index=0, id="c1", name="weather",
                                                                               arguments='{"ci')]),
                               0, True, "r", False, "m", 1, auto)
    (piece,) = first.choices[0].delta.tool_calls
    assert (piece.index, piece.id, piece.type, piece.function.name, piece.function.arguments) == (
        0, "c1", "function", "weather", '{"ci')
    assert not first.choices[0].delta.HasField("content")
    later = convert.chat_chunk(pb.GenerateResponse(tool_calls=[pb.ToolCallDelta(index=0, arguments='ty": "Oslo"}')],
                                                   finish_reason="tool_calls"), 0, False, "r", False, "m", 1, auto)
    (piece,) = later.choices[0].delta.tool_calls
    assert not piece.HasField("id") and not piece.function.HasField("name") and piece.function.arguments == 'ty": "Oslo"}'
    assert later.choices[0].finish_reason == "tool_calls"
    text = convert.chat_chunk(pb.GenerateResponse(text="Sun"), 0, False, "r", False, "m", 1, auto)
    assert text.choices[0].delta.content == "Sun" and not text.choices[0].delta.tool_calls
