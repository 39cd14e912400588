"""The OpenAI-compatible edge end to end: the official `openai` client, unchanged, against the
real Envoy and a sim mesh started by the launcher; authentication, tenants, rate limits, body
limit, load shedding and error shapes, a fuzz test of random JSON bodies, and a slow reader."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import grpc
import httpx
import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshserve.commands.launcher import Mesh
from meshserve.deploy import envoy_config as envoy
from meshserve.services.config import DEFAULT_MODEL, EnvoyConfig, GatewayConfig, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.prompts import sim_tokenize
from meshserve.services.server import insecure_channel
from tests.conftest import free_port
from tests.integration.helpers import exact_entries, mesh_spec, metric_sum, run_envoy, scrape, wait_until

pytestmark = pytest.mark.integration

KEYS = {"sk-alice-0123456789": "alice", "sk-bob-0123456789": "bob", "sk-carol-0123456789": "carol"}
ALICE, BOB, CAROL = KEYS
DAVE, DAVE_TPM = "sk-dave-0123456789", 200  # a tenant with a budget of tokens a minute
OPS = "sk-ops-0123456789"  # the operators' tenant: may change the fleet's LoRA adapters
MODEL = DEFAULT_MODEL
MAX_BODY = 64 * 1024
WEIGHTS = "sim-weights-v7"  # the workers' --weights-id: the answers' system_fingerprint
GATEWAY_MAX_IN_FLIGHT = 4
LONG = 1500  # max_tokens of a stream that stays open for seconds (sim: ~7 ms per token)


@pytest.fixture(scope="module")
def keys_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("keys") / "api-keys.txt"
    path.write_text("# test keys\n" + "".join(f"{k} {t}\n" for k, t in KEYS.items()) + f"{DAVE} dave tpm={DAVE_TPM}\n"
                    + f"{OPS} ops admin=1\n")
    return path


@pytest.fixture(scope="module", params=["grpc", "http"], ids=["transcoded", "http-edge"])
def mesh(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, keys_file: Path) -> Iterator[Mesh]:
    """The whole suite runs twice: streams transcoded to the gateway's gRPC OpenAI service, and
    proxied to its HTTP edge (``meshserve up --openai-edge http``)."""
    http_port = free_port() if request.param == "http" else -1
    spec = mesh_spec(tmp_path_factory.mktemp("openai-mesh"), "sim", grace_seconds=1,
                     worker=WorkerConfig(weights_id=WEIGHTS, enable_lora=True),
                     gateway=GatewayConfig(max_in_flight=GATEWAY_MAX_IN_FLIGHT, http_port=http_port,
                                           allow_runtime_lora_updating=True),
                     envoy=EnvoyConfig(api_keys_file=str(keys_file), max_request_bytes=MAX_BODY))
    with Mesh(spec) as m:
        yield m


def client(mesh: Mesh, key: str = ALICE) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"http://{mesh.envoy_address}/v1", api_key=key, max_retries=0)


def auth(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def grpc_text(mesh: Mesh, key: str = ALICE, **fields: object) -> tuple[str, list[pb.GenerateResponse]]:
    async with insecure_channel(mesh.envoy_address) as channel:
        call = pb_grpc.InferenceStub(channel).Generate(pb.GenerateRequest(**fields), metadata=(("authorization", f"Bearer {key}"),))
        chunks = [c async for c in call]
    return "".join(c.text for c in chunks), chunks


async def gateway_idle(mesh: Mesh) -> None:
    """Closed client streams free their gateway slot asynchronously: wait for it."""
    await wait_until(
        lambda: metric_sum(scrape(mesh.metrics["gateway"]), "meshserve_gateway_in_flight") == 0, 10, "an idle gateway"
    )


@asynccontextmanager
async def open_stream(base: str, key: str, max_tokens: int = LONG) -> AsyncIterator[httpx.Response]:
    """A chat stream whose first event has arrived (so it holds its slots), then left unread."""
    async with httpx.AsyncClient(base_url=base, timeout=30) as http:
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hold"}], "max_tokens": max_tokens,
                "stream": True, "skip_cache": True}
        async with http.stream("POST", "/v1/chat/completions", json=body, headers=auth(key)) as r:
            assert r.status_code == 200
            lines = r.aiter_lines()
            while not (await lines.__anext__()).startswith("data: "):
                pass
            yield r


# -- the openai client -------------------------------------------------------------------------


async def test_openai_chat_equals_grpc_output(mesh: Mesh) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "Name three colours."}]
    expected, chunks = await grpc_text(
        mesh, messages=[pb.ChatMessage(**m) for m in messages], max_tokens=12, temperature=0, skip_cache=True
    )
    assert expected and chunks[-1].finish_reason == "length"

    oa = client(mesh)
    whole = await oa.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, extra_body={"skip_cache": True}
    )
    assert whole.object == "chat.completion" and whole.model == MODEL
    assert whole.system_fingerprint == f"fp_{WEIGHTS}"  # the weights the workers serve
    assert whole.choices[0].message.role == "assistant"
    assert whole.choices[0].message.content == expected
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + 12

    stream = await oa.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True}, extra_body={"skip_cache": True},
    )
    got = [c async for c in stream]
    content = [c for c in got if c.choices]
    assert content[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in content) == expected
    assert content[-1].choices[0].finish_reason == "length"
    assert got[-1].choices == [] and got[-1].usage.completion_tokens == 12
    assert {c.id for c in got} == {got[0].id} and got[0].object == "chat.completion.chunk"
    assert {c.system_fingerprint for c in got} == {f"fp_{WEIGHTS}"}

    # vLLM's stream_interval extension: the same text in fewer chunks.
    stream = await oa.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=12, temperature=0, stream=True,
        extra_body={"skip_cache": True, "stream_interval": 5},
    )
    grouped = [c async for c in stream if c.choices]
    assert "".join(c.choices[0].delta.content or "" for c in grouped) == expected
    assert len(grouped) < len(content) and grouped[-1].choices[0].finish_reason == "length"


async def test_openai_completions_equal_grpc_output(mesh: Mesh) -> None:
    expected, _ = await grpc_text(mesh, prompt="The quick brown fox", max_tokens=8, temperature=0, skip_cache=True)
    oa = client(mesh)
    whole = await oa.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=8, temperature=0)
    assert whole.object == "text_completion" and whole.choices[0].text == expected
    stream = await oa.completions.create(model=MODEL, prompt="The quick brown fox", max_tokens=8, temperature=0,
                                         stream=True)
    parts = [c async for c in stream]
    assert "".join(c.choices[0].text for c in parts) == expected
    assert parts[-1].choices[0].finish_reason == "length"
    assert {whole.system_fingerprint} | {c.system_fingerprint for c in parts} == {f"fp_{WEIGHTS}"}


async def test_models_list_and_retrieve(mesh: Mesh) -> None:
    oa = client(mesh)
    models = await oa.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert (await oa.models.retrieve(MODEL)).owned_by == "meshserve"
    with pytest.raises(openai.NotFoundError):
        await oa.models.retrieve("gpt-4o")


async def test_client_errors_surface_with_the_service_message(mesh: Mesh) -> None:
    oa = client(mesh)
    with pytest.raises(openai.BadRequestError) as err:
        await oa.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], n=0)
    assert err.value.status_code == 400 and "'n' must be in [1, 128]" in err.value.message
    assert err.value.body["param"] == "n"
    with pytest.raises(openai.NotFoundError, match="the model 'gpt-4o' does not exist") as missing:
        await oa.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}], stream=True)
    assert missing.value.status_code == 404 and missing.value.body["param"] == "model"
    with pytest.raises(openai.NotFoundError, match="the model 'gpt-4o' does not exist"):
        await oa.completions.create(model="gpt-4o", prompt="x", max_tokens=2)
    with pytest.raises(openai.AuthenticationError):
        await client(mesh, key="sk-wrong-0123456789").models.list()


@pytest.mark.parametrize("stream", [False, True])
async def test_errors_name_max_completion_tokens_when_the_client_sent_it(mesh: Mesh, stream: bool) -> None:
    """The gateway and the workers call the limit max_tokens; a client that sent OpenAI's newer
    max_completion_tokens is told about the field it sent."""
    oa, messages = client(mesh), [{"role": "user", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as zero:
        await oa.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=0, stream=stream)
    assert "'max_completion_tokens' must be at least 1, got 0" in zero.value.message
    assert zero.value.body["param"] == "max_completion_tokens"
    with pytest.raises(openai.BadRequestError) as too_many:  # found by the worker: longer than the context
        await oa.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=100_000, stream=stream)
    assert "'max_completion_tokens' is 100000" in too_many.value.message, too_many.value.message
    assert too_many.value.body["param"] == "max_completion_tokens"
    with pytest.raises(openai.BadRequestError) as old_name:
        await oa.chat.completions.create(model=MODEL, messages=messages, max_tokens=100_000, stream=stream)
    assert "'max_tokens' is 100000" in old_name.value.message and old_name.value.body["param"] == "max_tokens"


@pytest.mark.parametrize("stream", [False, True])
async def test_openais_informational_fields_are_accepted(mesh: Mesh, stream: bool) -> None:
    """What a client written for OpenAI sends beside the generation's fields (``store``,
    ``metadata``, ...) is accepted, as vllm serve accepts it; a bad value is still a 400 naming it."""
    oa, messages = client(mesh), [{"role": "user", "content": "informational fields"}]
    fields = dict(store=False, metadata={"team": "search"}, service_tier="auto", safety_identifier="user-5f2a",
                  verbosity="medium", modalities=["text"], prompt_cache_key="conversation-7")
    resp = await oa.chat.completions.create(model=MODEL, messages=messages, max_tokens=3, stream=stream, **fields)
    if stream:
        text = "".join([c.choices[0].delta.content or "" async for c in resp if c.choices])
    else:
        text = resp.choices[0].message.content
    assert text
    with pytest.raises(openai.BadRequestError) as audio:
        await oa.chat.completions.create(model=MODEL, messages=messages, stream=stream, modalities=["text", "audio"])
    assert audio.value.body["param"] == "modalities" and "generates text" in audio.value.message


@pytest.mark.parametrize("stream", [False, True])
async def test_template_kwargs_and_reasoning_effort_reach_the_workers_template(mesh: Mesh, stream: bool) -> None:
    """vLLM's chat_template_kwargs and OpenAI's reasoning_effort change the prompt the worker
    renders (its usage counts them: the sim's stand-in template writes its variables), /tokenize
    counts the same prompt, and the two are cached apart from the plain chat."""
    oa, messages = client(mesh), [{"role": "user", "content": "template variables"}]

    async def prompt_tokens(**fields: object) -> int:
        resp = await oa.chat.completions.create(model=MODEL, messages=messages, max_tokens=2, temperature=0,
                                                stream=stream, stream_options={"include_usage": True} if stream else None,
                                                **fields)
        if not stream:
            return resp.usage.prompt_tokens
        return [c.usage async for c in resp if c.usage][0].prompt_tokens

    plain = await prompt_tokens()
    kwargs = {"enable_thinking": False, "thinking_budget": 512}
    templated = await prompt_tokens(extra_body={"chat_template_kwargs": kwargs})
    effort = await prompt_tokens(reasoning_effort="low")
    assert plain < templated and plain < effort, (plain, templated, effort)
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}", timeout=30, headers=auth(ALICE)) as http:
        counted = await http.post("/tokenize", json={"messages": messages, "chat_template_kwargs": kwargs})
    assert counted.status_code == 200 and counted.json()["count"] == templated
    with pytest.raises(openai.BadRequestError) as own:
        await oa.chat.completions.create(model=MODEL, messages=messages, stream=stream,
                                         extra_body={"chat_template_kwargs": {"tokenize": True}})
    assert own.value.body["param"] == "chat_template_kwargs" and "'tokenize'" in own.value.message


async def test_a_64_bit_seed_is_taken_and_reproduces_its_answer(mesh: Mesh) -> None:
    """vLLM and OpenAI take any 64-bit seed; a seeded answer is the same each time it is generated."""
    oa = client(mesh)
    ask = dict(model=MODEL, prompt="seeded", max_tokens=6, temperature=1.0, extra_body={"skip_cache": True})
    texts = {(await oa.completions.create(**ask, seed=seed)).choices[0].text for seed in (2**40 + 1, 2**40 + 1)}
    other = (await oa.completions.create(**ask, seed=-(2**62))).choices[0].text
    assert len(texts) == 1 and other not in texts


async def test_an_openai_answer_put_back_in_the_history_is_taken(mesh: Mesh) -> None:
    """The fields of an OpenAI answer's message (refusal, annotations, audio, function_call) come
    back when a client appends the answer to its history: both edges take them."""
    oa = client(mesh)
    answered = {"role": "assistant", "content": None, "refusal": "I can't help with that.", "annotations": [],
                "audio": None, "function_call": None, "reasoning": "a request to refuse", "reasoning_content": None}
    messages = [{"role": "user", "content": "history"}, answered, {"role": "user", "content": "and now?"}]
    resp = await oa.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}", timeout=30, headers=auth(ALICE)) as http:
        counted = await http.post("/tokenize", json={"messages": messages})
        without = await http.post("/tokenize", json={"messages": [messages[0], {"role": "assistant", "content": ""},
                                                                  messages[2]]})
    assert resp.usage.prompt_tokens == counted.json()["count"] > without.json()["count"]  # the refusal is in the prompt


async def test_an_answer_begun_for_the_model_is_continued(mesh: Mesh) -> None:
    """vLLM's prefill: continue_final_message with add_generation_prompt false leaves the final
    message open (the sim's template: one turn opening fewer than a chat), /tokenize counts the
    same, and the two set together are refused as vLLM refuses them."""
    oa = client(mesh)
    begun = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "The answer is"}]
    prefill = {"continue_final_message": True, "add_generation_prompt": False}
    resp = await oa.chat.completions.create(model=MODEL, messages=begun, max_tokens=2, extra_body=prefill)
    opened = await oa.chat.completions.create(model=MODEL, messages=begun, max_tokens=2)
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}", timeout=30, headers=auth(ALICE)) as http:
        counted = await http.post("/tokenize", json={"messages": begun, **prefill})
    assert resp.usage.prompt_tokens == counted.json()["count"] < opened.usage.prompt_tokens
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}", timeout=30, headers=auth(ALICE)) as http:
        both_counted = await http.post("/tokenize", json={"messages": begun, "continue_final_message": True})
    assert both_counted.status_code == 400 and both_counted.json()["error"]["param"] == "continue_final_message"
    with pytest.raises(openai.BadRequestError) as both:
        await oa.chat.completions.create(model=MODEL, messages=begun, max_tokens=2,
                                         extra_body={"continue_final_message": True})
    assert both.value.body["param"] == "continue_final_message" and "cannot both be true" in both.value.message


# -- status codes at the edge ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "body", "status", "kind", "says"),
    [
        ({}, {"messages": [{"role": "user", "content": "x"}]}, 401, "authentication_error", "API key"),
        (auth("sk-nope-0123456789"), {"messages": [{"role": "user", "content": "x"}]}, 401,
         "authentication_error", "API key"),
        (auth(ALICE), b"{not json", 400, "invalid_request_error", "not json"),
        (auth(ALICE), {"messages": [{"role": "user", "content": "x"}], "functions": []}, 400,
         "invalid_request_error", "unknown field 'functions'"),
        (auth(ALICE), {"messages": [{"role": "user", "content": "x"}], "max_tokens": "many"}, 400,
         "invalid_request_error", ""),
        (auth(ALICE), {"messages": [{"role": "user", "content": "x"}], "stream": "true"}, 400,
         "invalid_request_error", "'stream' must be true or false (a JSON boolean), got a string"),
        (auth(ALICE), {"messages": []}, 400, "invalid_request_error", "'messages' is empty"),
        (auth(ALICE), {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
         "invalid_request_error", "'messages[0].content[0]'"),
        (auth(ALICE), {"messages": [{"role": "user", "content": "x" * (MAX_BODY + 1)}]}, 413,
         "invalid_request_error", "larger than"),
    ],
    ids=["no-key", "bad-key", "malformed", "unknown-field", "wrong-type", "stream-not-a-boolean", "no-messages",
         "image-part", "too-big"],
)
async def test_edge_status_codes_have_openai_error_bodies(
    mesh: Mesh, headers: dict, body: dict | bytes, status: int, kind: str, says: str
) -> None:
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}") as http:
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        r = await http.post("/v1/chat/completions", content=content,
                            headers={**headers, "content-type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["type"] == kind and says in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
    assert "grpc-status" not in r.headers


async def test_a_get_on_a_post_endpoint_is_405_and_says_to_post(mesh: Mesh) -> None:
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}") as http:
        r = await http.get("/v1/chat/completions", headers=auth(ALICE))
        ok = await http.get("/v1/models", headers=auth(ALICE))
    assert r.status_code == 405 and r.headers["allow"] == "POST", r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] == "method_not_allowed"
    assert error["message"] == "method GET is not allowed on /v1/chat/completions: use POST with a JSON body"
    assert ok.status_code == 200  # a GET endpoint still answers GET


async def test_tenant_from_the_key_isolates_the_cache(mesh: Mesh) -> None:
    fields = {"prompt": "tenant isolation probe", "max_tokens": 4, "temperature": 0}

    def stored() -> int:
        return exact_entries(mesh.redis_url)

    before = stored()
    _, first = await grpc_text(mesh, ALICE, **fields)
    # The gateway stores after the stream ends; until then an identical request is coalesced.
    await wait_until(lambda: stored() > before, 10, "alice's answer to be stored")
    _, again = await grpc_text(mesh, ALICE, **fields)
    _, other = await grpc_text(mesh, BOB, **fields)
    assert not first[0].cached
    assert again[0].cached and again[-1].cache_kind == "exact"  # same tenant: served from the cache
    assert not other[0].cached  # another key's tenant never sees alice's entries
    log_path = mesh.run_dir / "envoy.log"
    await wait_until(lambda: '"tenant":"bob"' in log_path.read_text(), 10, "bob's access log line")
    log = log_path.read_text()
    assert '"tenant":"alice"' in log
    assert ALICE not in log and BOB not in log  # keys are never logged


async def test_n_choices_with_logprobs_streamed_and_not(mesh: Mesh) -> None:
    oa = client(mesh)
    ask = dict(model=MODEL, messages=[{"role": "user", "content": "choices"}], max_tokens=4, n=2, temperature=1.0,
               seed=5, logprobs=True, top_logprobs=2, extra_body={"skip_cache": True})
    resp = await oa.chat.completions.create(**ask)
    assert [c.index for c in resp.choices] == [0, 1] and resp.usage.completion_tokens == 8
    assert all(len(c.logprobs.content) == 4 and all(len(t.top_logprobs) == 2 for t in c.logprobs.content)
               for c in resp.choices)
    assert resp.choices[0].message.content != resp.choices[1].message.content  # seed, seed + 1
    texts: dict[int, str] = {}
    async for chunk in await oa.completions.create(model=MODEL, prompt="choices", max_tokens=4, n=3, seed=9,
                                                  stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
    assert sorted(texts) == [0, 1, 2] and len(set(texts.values())) == 3
    with pytest.raises(openai.BadRequestError, match="greedy"):
        await oa.completions.create(model=MODEL, prompt="choices", max_tokens=4, n=2, temperature=0)


async def test_tokenize_on_the_sim_and_a_clear_no_to_detokenize(mesh: Mesh) -> None:
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}", timeout=30, headers=auth(ALICE)) as http:
        counted = await http.post("/tokenize", json={"prompt": "four char word"})
        chat = await http.post("/tokenize", json={"messages": [{"role": "user", "content": "hi"}]})
        refused = await http.post("/detokenize", json={"tokens": counted.json()["tokens"]})
        both = await http.post("/tokenize", json={"prompt": "x", "messages": [{"role": "user", "content": "hi"}]})
        anonymous = await http.post("/tokenize", json={"prompt": "x"}, headers={"authorization": ""})
        other_model = await http.post("/detokenize", json={"model": "gpt-4", "tokens": [1]})
    assert counted.status_code == 200 and counted.json()["tokens"] == sim_tokenize("four char word")
    assert counted.json()["count"] == len(counted.json()["tokens"])
    assert chat.status_code == 200 and chat.json()["count"] > 1
    assert refused.status_code == 400 and "cannot be turned back into text" in refused.json()["error"]["message"]
    assert both.status_code == 400 and both.json()["error"]["message"].startswith("give either")
    assert both.json()["error"]["param"] is None  # no one field is at fault; the wording is not parsed
    assert anonymous.status_code == 401  # an API route like the others
    assert other_model.status_code == 404 and other_model.json()["error"]["param"] == "model"


async def test_a_cache_hit_says_so_in_the_answer_and_the_last_chunk(mesh: Mesh) -> None:
    def stored() -> int:
        return exact_entries(mesh.redis_url)

    ask = {"model": MODEL, "messages": [{"role": "user", "content": "cache info probe"}], "max_tokens": 4,
           "temperature": 0}
    before = stored()
    first = await client(mesh).chat.completions.create(**ask)
    await wait_until(lambda: stored() > before, 10, "the answer to be stored")
    again = await client(mesh).chat.completions.create(**ask)
    stream = await client(mesh).chat.completions.create(**ask, stream=True)
    chunks = [c async for c in stream]

    assert "cache" not in (first.model_extra or {})
    info = (again.model_extra or {})["cache"]
    assert info["kind"] == "exact" and 0 <= info["age_s"] < 10
    assert again.choices[0].message.content == first.choices[0].message.content
    assert (chunks[-1].model_extra or {})["cache"]["kind"] == "exact"
    assert not any("cache" in (c.model_extra or {}) for c in chunks[:-1])


def envoy_active_requests(cfg: EnvoyConfig) -> float:
    """Requests Envoy counts against the gateway cluster's circuit breaker now."""
    url = f"http://127.0.0.1:{cfg.admin_port}/stats?filter=^cluster.{envoy.GATEWAY_CLUSTER}.upstream_rq_active$"
    with urllib.request.urlopen(url, timeout=5) as r:
        return float(r.read().decode().rpartition(":")[2])


def gateway_refusals(mesh: Mesh) -> float:
    return metric_sum(scrape(mesh.metrics["gateway"]), "meshserve_gateway_requests_total", code="RESOURCE_EXHAUSTED")


async def test_gateway_overload_is_a_quick_429_with_retry_after(mesh: Mesh) -> None:
    base = f"http://{mesh.envoy_address}"
    refused_by_gateway = gateway_refusals(mesh)
    async with open_stream(base, ALICE), open_stream(base, ALICE), open_stream(base, BOB), open_stream(base, BOB):
        async with httpx.AsyncClient(base_url=base) as http:
            r = await http.post("/v1/chat/completions", headers=auth(CAROL),
                                json={"messages": [{"role": "user", "content": "one more"}], "max_tokens": 2})
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert "capacity" in r.json()["error"]["message"]
        with pytest.raises(openai.RateLimitError):
            await client(mesh, CAROL).completions.create(model=MODEL, prompt="x", max_tokens=2)
        if not mesh.gateway_http_addresses:
            # The launcher sized Envoy's circuit breaker to the gateway's capacity: Envoy refused
            # both, and the gateway never saw them.
            assert r.headers["x-envoy-overloaded"] == "true"
            assert gateway_refusals(mesh) == refused_by_gateway
        else:
            # The streams hold the HTTP edges' cluster, whose breaker has the same size; the two
            # unary calls went to the gRPC cluster, and the gateway refused them itself. A fifth
            # stream is refused by Envoy.
            assert gateway_refusals(mesh) == refused_by_gateway + 2
            async with httpx.AsyncClient(base_url=base) as http:
                fifth = await http.post("/v1/chat/completions", headers=auth(CAROL), json={
                    "messages": [{"role": "user", "content": "one more"}], "max_tokens": 2, "stream": True})
            assert fifth.status_code == 429, fifth.text
            assert fifth.headers["x-envoy-overloaded"] == "true" and fifth.headers["retry-after"] == "1"
            assert fifth.json()["error"]["type"] == "rate_limit_error"
            assert gateway_refusals(mesh) == refused_by_gateway + 2
    await gateway_idle(mesh)
    ok = await client(mesh, CAROL).completions.create(model=MODEL, prompt="x", max_tokens=2)
    assert ok.choices[0].finish_reason == "length"


async def test_a_tenant_over_its_tokens_a_minute_gets_a_429_naming_the_limit_and_others_do_not(mesh: Mesh) -> None:
    body = {"messages": [{"role": "user", "content": "spend my budget"}], "max_tokens": 40}
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}", timeout=30) as http:
        for _ in range(DAVE_TPM // 40 + 2):
            r = await http.post("/v1/chat/completions", headers=auth(DAVE), json=body)
            if r.status_code != 200:
                break
        assert r.status_code == 429, r.text
        assert int(r.headers["retry-after"]) >= 1
        error = r.json()["error"]
        assert error["type"] == "rate_limit_error" and "tenant dave is over its tpm limit" in error["message"]
        streamed = await http.post("/v1/chat/completions", headers=auth(DAVE), json={**body, "stream": True})
        assert streamed.status_code == 429, streamed.text
        assert "tpm" in streamed.json()["error"]["message"] and int(streamed.headers["retry-after"]) >= 1
    ok = await client(mesh, BOB).chat.completions.create(model=MODEL, max_tokens=2,
                                                        messages=[{"role": "user", "content": "still served"}])
    assert ok.choices[0].finish_reason == "length"


async def test_rate_limits_per_key_and_circuit_breaker_overflow(
    mesh: Mesh, keys_file: Path, tmp_path: Path
) -> None:
    cfg = EnvoyConfig(
        listen_port=free_port(), admin_port=free_port(), gateways=[mesh.gateway_address],
        api_keys_file=str(keys_file), rate_limit_per_key_requests=2, rate_limit_window_s=60, max_requests=1,
    )
    with run_envoy(cfg, tmp_path / "tight.yaml") as address:
        base = f"http://{address}"
        oa = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=ALICE, max_retries=0)
        for _ in range(2):
            await oa.completions.create(model=MODEL, prompt="x", max_tokens=2)
        with pytest.raises(openai.RateLimitError) as err:
            await oa.completions.create(model=MODEL, prompt="x", max_tokens=2)
        assert err.value.response.headers["retry-after"] == "60"
        assert err.value.body["code"] == "rate_limit_exceeded"
        # Another key has its own bucket.
        bob = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=BOB, max_retries=0)
        await bob.completions.create(model=MODEL, prompt="x", max_tokens=2)
    await gateway_idle(mesh)


async def test_circuit_breaker_overflow_is_429_and_resource_exhausted(
    mesh: Mesh, keys_file: Path, tmp_path: Path
) -> None:
    """An Envoy told the gateways take 1 stream at once: while one is open, every API gets the
    excess refused by Envoy (x-envoy-overloaded) as the gateway would refuse it."""
    cfg = EnvoyConfig(
        listen_port=free_port(), admin_port=free_port(), gateways=[mesh.gateway_address],
        api_keys_file=str(keys_file), gateway_max_in_flight=1,
    )
    with run_envoy(cfg, tmp_path / "tight.yaml") as address:
        base = f"http://{address}"
        refused_by_gateway = gateway_refusals(mesh)
        async with open_stream(base, CAROL):
            async with httpx.AsyncClient(base_url=base) as http:
                openai_reply = await http.post("/v1/completions", json={"prompt": "x"}, headers=auth(BOB))
                native_reply = await http.post("/v1/generate", json={"prompt": "x"}, headers=auth(BOB))
            with pytest.raises(openai.RateLimitError) as err:
                await openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=BOB, max_retries=0).chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=2, stream=True)
            async with insecure_channel(base.removeprefix("http://")) as channel:
                call = pb_grpc.InferenceStub(channel).Generate(
                    pb.GenerateRequest(prompt="x", max_tokens=2), metadata=(("authorization", f"Bearer {BOB}"),))
                with pytest.raises(grpc.aio.AioRpcError) as grpc_err:
                    async for _ in call:
                        pass
                grpc_metadata = dict(await call.initial_metadata() or ()) | dict(await call.trailing_metadata() or ())
            assert gateway_refusals(mesh) == refused_by_gateway  # none of them reached the gateway

        assert openai_reply.status_code == 429, openai_reply.text
        assert openai_reply.headers["retry-after"] == "1" and openai_reply.headers["x-envoy-overloaded"] == "true"
        assert "grpc-status" not in openai_reply.headers
        error = openai_reply.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert (error["type"], error["code"]) == ("rate_limit_error", "resource_exhausted")
        assert "capacity" in error["message"]
        assert err.value.status_code == 429 and err.value.body["code"] == "resource_exhausted"

        assert native_reply.status_code == 429, native_reply.text
        assert native_reply.headers["retry-after"] == "1"
        assert native_reply.json()["code"] == grpc.StatusCode.RESOURCE_EXHAUSTED.value[0]

        assert grpc_err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, grpc_err.value
        assert "capacity" in grpc_err.value.details()
        assert grpc_metadata["retry-after"] == "1"

        # With the stream closed, the same Envoy admits again.
        await wait_until(lambda: envoy_active_requests(cfg) == 0, 10, "Envoy's slot freed")
        ok = await openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=BOB, max_retries=0).completions.create(
            model=MODEL, prompt="x", max_tokens=2)
        assert ok.choices[0].finish_reason == "length"
    await gateway_idle(mesh)


# -- robustness --------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)
fields = st.sampled_from(
    ["model", "messages", "max_tokens", "temperature", "top_p", "seed", "stop", "stream", "stream_options", "n",
     "prompt", "user", "logprobs", "echo", "presence_penalty", "max_completion_tokens", "ignore_eos", "stream_interval", "x",
     "top_logprobs", "logit_bias", "top_k", "min_p", "min_tokens", "stop_token_ids", "best_of", "repetition_penalty",
     "response_format", "structured_outputs", "tools", "tool_choice"]
)
message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "bot", ""]), "content": json_values})
bodies = st.one_of(
    json_values,
    st.dictionaries(fields, json_values, max_size=6),
    st.fixed_dictionaries(
        {"messages": st.lists(message, max_size=3)},
        optional={"max_tokens": st.integers(-5, 40), "stream": st.booleans(), "temperature": json_values,
                  "stop": json_values, "n": st.integers(0, 3), "prompt": json_values},
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/completions"]), body=bodies)
def test_fuzz_random_json_bodies_never_5xx(mesh: Mesh, path: str, body: object) -> None:
    with httpx.Client(base_url=f"http://{mesh.envoy_address}", timeout=30) as http:
        r = http.post(path, json=body, headers=auth(ALICE))
    assert r.status_code < 500 or r.status_code == 503 and "overload" in r.text, (r.status_code, r.text)
    if r.status_code >= 400:
        assert r.json()["error"]["message"]


async def test_services_alive_after_fuzzing(mesh: Mesh) -> None:
    assert all(p.popen.poll() is None for p in mesh.procs)
    ok = await client(mesh).chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=3)
    assert ok.choices[0].message.content


async def test_a_client_that_leaves_a_stream_stops_its_generation_on_the_worker(mesh: Mesh) -> None:
    """Cancellation crosses the edge: the client closes its connection to Envoy mid-stream, and
    the worker's engine lets the request go long before its max_tokens."""
    def aborted() -> float:
        return metric_sum(scrape(mesh.metrics["worker-0"]), "meshserve_worker_requests_total", finish_reason="abort")

    before = aborted()
    async with open_stream(f"http://{mesh.envoy_address}", ALICE):
        pass  # one event read, then the connection is closed
    await wait_until(lambda: aborted() > before, 10, "the worker to count the abort")
    async with insecure_channel(mesh.worker_addresses[0]) as channel:
        async def idle() -> None:  # the sim engine runs nothing: the stream did not go on to its LONG tokens
            async for report in pb_grpc.WorkerStub(channel).WatchLoad(pb.WatchLoadRequest()):
                if report.num_running == 0 and report.num_in_flight == 0:
                    return

        await asyncio.wait_for(idle(), 10)


async def test_slow_reader_does_not_hold_up_another_client(mesh: Mesh) -> None:
    await gateway_idle(mesh)
    base = f"http://{mesh.envoy_address}"
    async with open_stream(base, ALICE) as slow:  # reads one event, then pauses
        oa = client(mesh, BOB)
        stream = await oa.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "quick"}], max_tokens=64, stream=True,
            extra_body={"skip_cache": True},
        )
        chunks = await asyncio.wait_for(_collect(stream), 30)
        assert chunks[-1].choices[0].finish_reason == "length"
        assert not slow.is_closed  # the paused stream is still open: it did not finish first
    await gateway_idle(mesh)


async def _collect(stream: openai.AsyncStream) -> list:
    return [c async for c in stream]


async def test_grpc_clients_need_the_key_too(mesh: Mesh) -> None:
    async with insecure_channel(mesh.envoy_address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await pb_grpc.InferenceStub(channel).Complete(pb.GenerateRequest(prompt="x", max_tokens=2))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_stream_true_sent_as_curl_sends_it_streams(mesh: Mesh) -> None:
    # `curl -d '{"stream": true, ...}'` says application/x-www-form-urlencoded: still a stream.
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True,
            "skip_cache": True}
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}", timeout=30) as http:
        r = await http.post("/v1/chat/completions", content=json.dumps(body).encode(),
                            headers={**auth(ALICE), "content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    data = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
    if mesh.gateway_http_addresses:  # the gateway writes the stream: it ends as OpenAI's and vLLM's do
        assert data[-1] == "[DONE]" and data.count("[DONE]") == 1
        data.pop()
    else:  # Envoy's transcoder prints the gRPC stream's messages, and nothing after them
        assert "[DONE]" not in data
    events = [json.loads(d) for d in data]
    assert events and all(e["object"] == "chat.completion.chunk" for e in events)
    assert events[-1]["choices"][0]["finish_reason"] == "length"


async def test_health_needs_no_api_key(mesh: Mesh) -> None:
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}") as http:
        probe = await http.get("/health")  # a load balancer has no key
        models = await http.get("/v1/models")  # every other path still needs one
    assert probe.status_code == 200 and probe.json() == {"status": "ok", "workers": 1}, probe.text
    assert models.status_code == 401


async def test_tool_choice_auto_without_a_tool_parser_is_a_400_saying_how_to_get_one(mesh: Mesh) -> None:
    """The sim workers have no tool-call parser: "auto" (the default with tools) is refused by
    the worker, by name, and the worker goes on serving."""
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}", timeout=30, headers=auth(ALICE)) as http:
        for extra in ({}, {"tool_choice": "auto"}, {"tool_choice": "auto", "stream": True}):
            reply = await http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "tools": tools, **extra})
            assert reply.status_code == 400, reply.text
            error = reply.json()["error"]
            assert error["param"] == "tool_choice" and "--tool-call-parser" in error["message"], error
        served = await http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "tools": tools, "tool_choice": "none"})
    assert served.status_code == 200 and served.json()["choices"][0]["finish_reason"] == "length"


async def test_only_an_admin_tenant_changes_the_adapters_at_the_edge(mesh: Mesh, tmp_path: Path) -> None:
    """/v1/load_lora_adapter is behind the edge's API-key auth, and the gateway takes it only from
    a tenant marked admin=1 in the keys file: others get OpenAI's 403."""
    folder = tmp_path / "ops-adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "peft_type": "LORA"}))
    load = {"lora_name": "ops-adapter", "lora_path": str(folder)}
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}", timeout=30) as http:
        assert (await http.post("/v1/load_lora_adapter", json=load)).status_code == 401
        refused = await http.post("/v1/load_lora_adapter", json=load, headers=auth(ALICE))
        assert refused.status_code == 403, refused.text
        assert refused.json()["error"]["type"] == "permission_error" and "admin=1" in refused.json()["error"]["message"]
        assert "ops-adapter" not in {m.id for m in (await client(mesh).models.list()).data}
        loaded = await http.post("/v1/load_lora_adapter", json=load, headers=auth(OPS))
        assert loaded.status_code == 200, loaded.text
        assert "ops-adapter" in {m.id for m in (await client(mesh).models.list()).data}
        unloaded = await http.post("/v1/unload_lora_adapter", json={"lora_name": "ops-adapter"}, headers=auth(OPS))
        assert unloaded.status_code == 200, unloaded.text
