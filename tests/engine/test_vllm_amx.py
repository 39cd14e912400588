"""vLLM in bfloat16 on this CPU: on CPUs with AMX (Intel Sapphire Rapids and later), vLLM's CPU
attention runs its AMX kernel, which needs the AMX permission Linux grants a process only on
request; meshserve's vLLM plugin (worker/vllm_plugin.py) asks in every vLLM process. Without it
the model rank died with SIGILL on the first request (seen on this kind of machine). On a CPU
without AMX the same request takes another kernel and this test only checks bfloat16 serves."""

from __future__ import annotations

import asyncio
import importlib.metadata
from pathlib import Path

import pytest

from meshserve.services.config import WorkerConfig
from meshserve.worker.engine import Request
from meshserve.worker.vllm_engine import VllmEngine

pytestmark = pytest.mark.engine


def test_the_amx_plugin_is_registered_for_vllm() -> None:
    plugins = {e.name: e.value for e in importlib.metadata.entry_points(group="vllm.general_plugins")}
    assert plugins.get("meshserve_amx") == "meshserve.worker.vllm_plugin:init_amx"


async def test_bfloat16_serves_on_this_cpu(tiny_model: Path) -> None:
    engine = VllmEngine(WorkerConfig(model=str(tiny_model), dtype="bfloat16", max_model_len=256,
                                     kv_cache_memory_bytes=32 * 2**20, max_num_seqs=8, enforce_eager=True))
    await engine.start()
    cores = list(engine.processes)
    try:
        async with asyncio.timeout(60):
            deltas = [d async for d in engine.generate(
                Request(request_id="bf16", prompt="Hello world", max_tokens=8, temperature=0.0, ignore_eos=True))]
    finally:
        await engine.close()
    # Closed means gone: the next engine in this process must not find this one's core.
    assert cores and not any(p.is_running() for p in cores)
    assert sum(len(d.token_ids) for d in deltas) == 8
    assert deltas[-1].finish_reason == "length"
