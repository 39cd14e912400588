"""Two base models in one mesh on the real vLLM engine: the project's two tiny models
(meshserve-tiny and meshserve-tiny-2, made by `meshserve make-model --name`), a worker group each,
as `meshserve up --worker-group model=meshserve-tiny --worker-group model=meshserve-tiny-2`
starts them. Through Envoy, each model's greedy answer is the one vLLM's own offline ``LLM`` gives
with that model alone (token for token), and the two models' answers differ."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from meshserve.commands.launcher import Mesh, WorkerGroup
from meshserve.services.config import WorkerConfig
from meshserve.worker.tiny_model import NAME, SECOND_NAME, ensure_model
from tests.integration.helpers import generate, mesh_spec, token_ids

pytestmark = [pytest.mark.integration, pytest.mark.engine]

TIMEOUT = 180.0
MAX_TOKENS = 24
PROMPTS = ["The capital of France is", "Once upon a time there was a grey cat"]
ENGINE = dict(dtype="float32", max_model_len=512, kv_cache_memory_bytes=64 * 2**20, enforce_eager=True)
MODELS = (NAME, SECOND_NAME)

# vLLM's offline engine, in a process of its own (its engine core in that process): each model
# alone, one after the other, and each prompt's greedy token ids on it.
OFFLINE = """
import gc, json, sys
from vllm import LLM, SamplingParams
models, prompts, max_tokens, engine = json.loads(sys.argv[1])
params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
out = {}
for name, path in models.items():
    llm = LLM(model=path, **engine)
    out[name] = [list(o.outputs[0].token_ids) for o in llm.generate(prompts, params, use_tqdm=False)]
    del llm
    gc.collect()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def offline() -> dict[str, list[list[int]]]:
    paths = {name: str(ensure_model(name=name)) for name in MODELS}
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    out = subprocess.run([sys.executable, "-c", OFFLINE, json.dumps([paths, PROMPTS, MAX_TOKENS, ENGINE])],
                         capture_output=True, text=True, env=env, timeout=TIMEOUT)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    groups = [WorkerGroup(1, WorkerConfig(engine="vllm", model=name, **ENGINE)) for name in MODELS]  # type: ignore[arg-type]
    with Mesh(mesh_spec(tmp_path_factory.mktemp("two-models"), "vllm", groups=groups)) as m:
        yield m


async def test_each_model_answers_through_the_mesh_as_vllm_offline_does_with_it_alone(
    mesh: Mesh, offline: dict[str, list[list[int]]]
) -> None:
    assert mesh.worker_models == list(MODELS)
    for i, prompt in enumerate(PROMPTS):
        ours = dict(zip(MODELS, await asyncio.gather(*(
            generate(mesh.envoy_address, prompt=prompt, max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True,
                     model=name) for name in MODELS)), strict=True))
        assert {name: token_ids(chunks) for name, chunks in ours.items()} == {n: offline[n][i] for n in MODELS}, prompt
        assert {name: {c.worker for c in chunks if c.worker} for name, chunks in ours.items()} == {
            NAME: {"worker-0"}, SECOND_NAME: {"worker-1"}}
        assert offline[NAME][i] != offline[SECOND_NAME][i], "the two models answered alike"
