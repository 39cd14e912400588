"""Prompts sharing a 512-token prefix, given to vLLM's engine before its first step: do the later
ones reuse the first's blocks in the same step?"""
from vllm import LLM, SamplingParams
from worker.tiny_model import ensure_model

if __name__ == "__main__":
    llm = LLM(model=str(ensure_model()), enable_prefix_caching=True, max_model_len=2048, enforce_eager=True,
              dtype="float32", max_num_batched_tokens=8192)
    prefix = [100 + (i % 300) for i in range(512)]
    prompts = [{"prompt_token_ids": prefix + [7, 8, 9, k] * 8} for k in range(4)]
    outs = llm.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True))
    print("cached tokens per request:", [o.num_cached_tokens for o in outs])

