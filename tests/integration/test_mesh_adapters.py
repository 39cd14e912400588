"""LoRA adapters through the whole mesh, started by the launcher as `meshserve up --enable-lora
--max-loras 2 --lora-modules ...` starts it (two sim workers, router, gateway with its HTTP edge,
cache, Valkey, Envoy): answers are keyed by the adapter that gave them (the workers' own counters
and Redis's keys say how many generations and entries there were), an unknown adapter is a 404 in
OpenAI's shape naming it, the model list shows each adapter with its parent, and vLLM's
/v1/load_lora_adapter and /v1/unload_lora_adapter change them through the edge."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import redis

from meshserve.commands import bench
from meshserve.commands.launcher import Mesh
from meshserve.services.cache_keys import exact_key
from meshserve.services.config import DEFAULT_MODEL, CacheConfig, GatewayConfig, WorkerConfig
from meshserve.services.gen import meshserve_pb2 as pb
from tests.conftest import free_port
from tests.integration.helpers import (
    generate,
    mesh_spec,
    metric_sum,
    scrape,
    text,
    unknown_model_messages,
    wait_until,
)

pytestmark = pytest.mark.integration

ADAPTERS = {"support": "/adapters/support", "legal": "/adapters/legal"}
MODELS = ["support", "legal", DEFAULT_MODEL]


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    lora = WorkerConfig(enable_lora=True, max_loras=2, lora_modules=[f"{n}={p}" for n, p in ADAPTERS.items()],
                        sim_itl_base_ms=1.0)
    spec = mesh_spec(tmp_path_factory.mktemp("adapters-mesh"), "sim", workers=2, worker=lora,
                     gateway=GatewayConfig(http_port=free_port(), allow_runtime_lora_updating=True))
    with Mesh(spec) as m:
        yield m


def generations(mesh: Mesh) -> float:
    """Requests the workers finished generating, by their own counters."""
    return sum(metric_sum(scrape(url), "meshserve_worker_requests_total", finish_reason="length")
               for name, url in mesh.metrics.items() if name.startswith("worker-"))


def entries(mesh: Mesh) -> set[str]:
    """The exact cache entries in Redis now."""
    client = redis.Redis.from_url(mesh.redis_url, socket_timeout=5)
    try:
        return {k.decode() for k in client.scan_iter(match=f"{CacheConfig.key_prefix}exact:*", count=1000)}
    finally:
        client.close()


def request(prompt: str, model: str) -> dict[str, object]:
    return dict(prompt=prompt, max_tokens=6, temperature=0, model=model)


async def test_the_same_prompt_to_two_adapters_is_two_generations_and_two_entries(mesh: Mesh) -> None:
    prompt = "Where is my parcel right now?"
    generated, stored = generations(mesh), entries(mesh)
    # At once: were the flights keyed without the model, the three would share one generation.
    first = await asyncio.gather(*(generate(mesh.envoy_address, **request(prompt, m)) for m in MODELS))
    # A worker counts a request once its stream is done, a moment after its last chunk went out.
    await wait_until(lambda: generations(mesh) >= generated + 3, 10, "the workers to count three generations")
    assert generations(mesh) == generated + 3
    assert len({text(chunks) for chunks in first}) == 3  # each model answered as itself
    keys = {exact_key(pb.GenerateRequest(**request(prompt, m)), "", CacheConfig.key_prefix) for m in MODELS}
    await wait_until(lambda: entries(mesh) - stored == keys, 10, "an entry per model, under its own key")

    again = [await generate(mesh.envoy_address, **request(prompt, m)) for m in MODELS]
    assert all(chunks[0].cached for chunks in again)
    assert [text(chunks) for chunks in again] == [text(chunks) for chunks in first]  # each its own answer
    assert generations(mesh) == generated + 3 and entries(mesh) - stored == keys


async def test_an_unknown_adapter_is_a_404_in_openais_shape_naming_it(mesh: Mesh) -> None:
    *chats, retrieved = await unknown_model_messages(mesh.envoy_address, "billing")
    for message in chats:
        assert "the model 'billing' does not exist" in message
        assert "'legal', 'support'" in message
    assert "'billing'" in retrieved


async def test_the_model_list_has_each_adapter_with_its_parent_and_answers_name_theirs(mesh: Mesh) -> None:
    client = openai.AsyncOpenAI(base_url=f"http://{mesh.envoy_address}/v1", api_key="unused", max_retries=0)
    cards = {m.id: m for m in (await client.models.list()).data}
    assert list(cards) == [DEFAULT_MODEL, "support", "legal"]
    assert getattr(cards[DEFAULT_MODEL], "parent", None) is None
    for name, path in ADAPTERS.items():
        assert (cards[name].root, cards[name].parent) == (path, DEFAULT_MODEL)  # type: ignore[attr-defined]
    whole = await client.chat.completions.create(model="legal", messages=[{"role": "user", "content": "hi"}],
                                                 max_tokens=2, temperature=0)
    streamed = await client.chat.completions.create(model="support", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=2, temperature=0, stream=True)
    assert whole.model == "legal"
    assert {chunk.model async for chunk in streamed} == {"support"}


async def test_bench_spreads_requests_over_the_adapters_by_popularity(mesh: Mesh, tmp_path: Path) -> None:
    """`meshserve bench --lora-modules a,b --lora-popularity zipf`: every request names an adapter
    (the first twice as often as the second), all are served, and the summary breaks down by
    adapter; the workers generated every one (their own counters)."""
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    out = tmp_path / "result.json"
    before = generations(mesh), adapter_requests(mesh, "support"), adapter_requests(mesh, "legal")
    args = parser.parse_args([
        "--target", mesh.envoy_address, "--num-prompts", "60", "--max-concurrency", "10", "--random-input-len", "4",
        "--random-output-len", "4", "--lora-modules", "support,legal", "--lora-popularity", "zipf",
        "--disable-tqdm", "--save-result", str(out)])
    assert await asyncio.to_thread(bench.main, args) == 0
    result = json.loads(out.read_text())
    assert (result["completed"], result["failed"]) == (60, 0)
    done = {name: r["completed"] for name, r in result["per_model"].items()}
    assert set(done) == {"support", "legal"} and sum(done.values()) == 60
    assert done["support"] > done["legal"] > 0  # Zipf: the first name the most popular
    # The workers took each request on the adapter it named (their own counters).
    taken = adapter_requests(mesh, "support") - before[1], adapter_requests(mesh, "legal") - before[2]
    assert taken == (done["support"], done["legal"])
    await wait_until(lambda: generations(mesh) >= before[0] + 60, 10, "the workers to count the generations")


def adapter_requests(mesh: Mesh, adapter: str) -> float:
    return sum(metric_sum(scrape(url), "meshserve_worker_adapter_requests_total", adapter=adapter)
               for name, url in mesh.metrics.items() if name.startswith("worker-"))


async def test_adapters_load_and_unload_through_the_edge_as_vllms_endpoints(mesh: Mesh, tmp_path: Path) -> None:
    """POST /v1/load_lora_adapter and /v1/unload_lora_adapter at Envoy (transcoded to the gateway's
    Adapters service): the adapter is listed and served at once, refusals are OpenAI's error shape
    with vLLM's reason and status, and the fleet serves on."""
    folder = tmp_path / "billing"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "lora_alpha": 16, "peft_type": "LORA"}))
    client = openai.AsyncOpenAI(base_url=f"http://{mesh.envoy_address}/v1", api_key="unused", max_retries=0)
    async with httpx.AsyncClient(base_url=f"http://{mesh.envoy_address}", timeout=30) as http:
        loaded = await http.post("/v1/load_lora_adapter", json={"lora_name": "billing", "lora_path": str(folder)})
        assert loaded.status_code == 200, loaded.text
        assert loaded.json()["message"] == "Success: LoRA adapter 'billing' added successfully."
        cards = {m.id: m for m in (await client.models.list()).data}
        assert (cards["billing"].root, cards["billing"].parent) == (str(folder), DEFAULT_MODEL)  # type: ignore[attr-defined]
        answer = await client.completions.create(model="billing", prompt="hi", max_tokens=2, temperature=0)
        assert answer.model == "billing"

        twice = await http.post("/v1/load_lora_adapter", json={"lora_name": "billing", "lora_path": str(folder)})
        assert twice.status_code == 400
        assert twice.json()["error"]["message"] == "The lora adapter 'billing' has already been loaded."
        missing = await http.post("/v1/load_lora_adapter", json={"lora_name": "gone", "lora_path": str(tmp_path / "no")})
        assert missing.status_code == 400
        assert missing.json()["error"]["message"] == f"Loading lora gone failed: No adapter found for {tmp_path / 'no'}"
        assert missing.json()["error"]["type"] == "invalid_request_error"

        unloaded = await http.post("/v1/unload_lora_adapter", json={"lora_name": "billing"})
        assert unloaded.status_code == 200, unloaded.text
        assert "billing" not in {m.id for m in (await client.models.list()).data}
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="billing", prompt="hi", max_tokens=2)
        unknown = await http.post("/v1/unload_lora_adapter", json={"lora_name": "billing"})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["message"] == "The lora adapter 'billing' cannot be found."
    served = await client.completions.create(model=DEFAULT_MODEL, prompt="hi", max_tokens=2)
    assert served.choices[0].text
