"""PromptBlocks.chain with the tiny model's HF tokenizer over prefix_repetition prompts (16 prefixes of
1,000 words, 64-word suffixes), plain and as one-message chats: time per chain."""
import random, sys, time
sys.path.insert(0, sys.argv[1])
from router.prefix import PromptBlocks
from commands.bench import prefix_repetition_requests
b = PromptBlocks(); b.configure("/root/.cache/meshserve/models/meshserve-tiny-v1", 16)
prompts = [r.prompt for r in prefix_repetition_requests(600, 16, 1000, 64, 1, random.Random(0))]
for kind in ("plain", "chat"):
    args = [(p, None) if kind == "plain" else ("", [{"role": "user", "content": p}]) for p in prompts]
    for a in args[:50]: b.chain(*a)
    t = time.perf_counter(); lat = []
    for a in args[50:]:
        s = time.perf_counter(); b.chain(*a); lat.append(time.perf_counter() - s)
    lat.sort()
    print(f"{kind}: mean {sum(lat)/len(lat)*1e6:.0f} us, p50 {lat[len(lat)//2]*1e6:.0f} us, p99 {lat[int(len(lat)*.99)]*1e6:.0f} us")
