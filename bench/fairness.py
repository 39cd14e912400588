"""Fairness under overload: one tenant floods a small fleet while another asks short questions, or
two tenants flood it together; flow control on (the default) against ``--flow-control off``,
alternated round by round.

    .venv/bin/python bench/fairness.py OUT_DIR [--rounds 2] [--scenarios idle,flood,flood-priority,two-floods]
        [--seconds 30] [--tree DIR]

Each run starts `meshserve up --engine sim --workers 2 --max-num-seqs 16` with an API keys file
of its tenants and talks to Envoy's gRPC edge with their keys:
  idle            tenant `small` alone, a short question (16 words -> 16 tokens) every 0.5 s: its TTFT
                  on an idle fleet (one variant: flow control has nothing to do)
  flood           tenant `flood` keeps 400 long streams open (64 -> 512 tokens, each user sending its
                  next at once, or after a refusal's retry-after), `small` asks as above: small's TTFT,
                  flood's output tokens/s
  flood-priority  the same with `small` at priority -1 in the keys file (flood at 0)
  two-floods      tenants `left` and `right`, equal weights, 200 streams each: the tokens each was
                  served, and Jain's fairness index of the two
Only what happens between the warm-up (5 s after the flood started) and --seconds later counts;
each run's JSON also lists every question's TTFT by when it was asked (seconds after the window
opened, negative: during the warm-up). Writes one JSON per run and summary.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from meshserve.loadgen.mesh import meshserve_up
from meshserve.loadgen.runner import open_channels
from meshserve.loadgen.workloads import VOCABULARY
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parent.parent
PORT = 8590
FLEET = ["--engine", "sim", "--workers", "2", "--max-num-seqs", "16", "--no-tracing", "--port", str(PORT),
         "--admin-port", "9891", "--gateway-port", "50651", "--gateway-http-port", "50650", "--router-port", "50652",
         "--cache-port", "50653", "--worker-port", "50661", "--trace-port", "4527", "--redis-port", "6579"]
WARM_UP_S = 5.0
KEYS = {"small": "sk-small-0123456789abcdef", "flood": "sk-flood-0123456789abcdef",
        "left": "sk-left-0123456789abcdef", "right": "sk-right-0123456789abcdef"}
SCENARIOS = {  # name -> (tenants flooding with how many streams, small asking?, small's priority)
    "idle": ({}, True, 0),
    "flood": ({"flood": 400}, True, 0),
    "flood-priority": ({"flood": 400}, True, -1),
    "two-floods": ({"left": 200, "right": 200}, False, 0),
}
VARIANTS = {"on": [], "off": ["--flow-control", "off"]}


@dataclass
class Tally:
    tokens: dict[str, int] = field(default_factory=dict)   # tenant -> output tokens inside the window
    small_ttfts: list[float] = field(default_factory=list)
    small_asked: list[tuple[float, float | None]] = field(default_factory=list)  # (s after the window opened, TTFT)
    errors: dict[str, int] = field(default_factory=dict)


def keys_file(folder: Path, small_priority: int) -> Path:
    path = folder / "keys.txt"
    lines = [f"{key} {tenant}" + (f" priority={small_priority}" if tenant == "small" and small_priority else "")
             for tenant, key in KEYS.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def request(words: int, max_tokens: int, i: int) -> pb.GenerateRequest:
    rng = random.Random(i)
    return pb.GenerateRequest(prompt=" ".join(rng.choices(VOCABULARY, k=words)), max_tokens=max_tokens,
                              temperature=0.8, ignore_eos=True, cache="off")


async def one(stub: pb_grpc.InferenceStub, tenant: str, req: pb.GenerateRequest, tally: Tally,
              window: tuple[float, float]) -> float | None:
    """Streams ``req`` as ``tenant``; counts its tokens that came inside the window; its TTFT."""
    started, ttft = time.monotonic(), None
    try:
        async for chunk in stub.Generate(req, metadata=(("authorization", f"Bearer {KEYS[tenant]}"),)):
            now = time.monotonic()
            ttft = ttft if ttft is not None else now - started
            if window[0] <= now <= window[1]:
                tally.tokens[tenant] = tally.tokens.get(tenant, 0) + len(chunk.token_ids)
    except grpc.aio.AioRpcError as e:
        tally.errors[e.code().name] = tally.errors.get(e.code().name, 0) + 1
        retry_after = dict(e.trailing_metadata() or ()).get("retry-after")
        if retry_after:  # a refused user comes back when told to, as the OpenAI SDK does
            await asyncio.sleep(float(retry_after))
        return None
    return ttft


async def drive(scenario: str, seconds: float) -> Tally:
    floods, small, _ = SCENARIOS[scenario]
    tally = Tally()
    start = time.monotonic()
    window = (start + WARM_UP_S, start + WARM_UP_S + seconds)
    channels = open_channels(f"127.0.0.1:{PORT}", max(1, sum(floods.values()) // 100 + 1))
    stubs = [pb_grpc.InferenceStub(c) for c in channels]

    async def flood_user(tenant: str, u: int) -> None:
        i = 0
        while time.monotonic() < window[1]:
            await one(stubs[u % len(stubs)], tenant, request(64, 512, u * 100_000 + i), tally, window)
            i += 1

    async def asker() -> None:
        asks: list[tuple[float, asyncio.Task[float | None]]] = []
        i = 0
        while (now := time.monotonic()) < window[1]:
            asks.append((now - window[0], asyncio.create_task(one(stubs[0], "small", request(16, 16, i), tally, window))))
            i += 1
            await asyncio.sleep(0.5)
        ttfts = await asyncio.gather(*(task for _, task in asks))
        tally.small_asked = [(round(at, 2), ttft) for (at, _), ttft in zip(asks, ttfts, strict=True)]
        tally.small_ttfts = [ttft for at, ttft in tally.small_asked if at >= 0 and ttft is not None]

    users = [asyncio.create_task(flood_user(t, u)) for t, n in floods.items() for u in range(n)]
    try:
        if small:
            await asker()
        else:
            await asyncio.sleep(window[1] - time.monotonic())
    finally:
        for u in users:
            u.cancel()
        await asyncio.gather(*users, return_exceptions=True)
        await asyncio.gather(*(c.close() for c in channels))
    return tally


def figures(scenario: str, variant: str, tally: Tally, seconds: float) -> dict:
    out = {"scenario": scenario, "variant": variant, "errors": tally.errors,
           "tokens_per_s": {t: n / seconds for t, n in tally.tokens.items()}}
    if tally.small_ttfts:
        ttfts = sorted(tally.small_ttfts)
        out |= {"small_requests": len(ttfts), "small_ttft_p50_ms": statistics.median(ttfts) * 1000,
                "small_ttft_p99_ms": ttfts[min(len(ttfts) - 1, int(0.99 * len(ttfts)))] * 1000,
                "small_ttft_ms_by_when_asked": [[at, None if t is None else round(t * 1000, 1)]
                                                for at, t in tally.small_asked]}
    shares = [tally.tokens.get(t, 0) for t in SCENARIOS[scenario][0]]
    if len(shares) == 2 and sum(shares):
        out["jain"] = sum(shares) ** 2 / (len(shares) * sum(s * s for s in shares))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scenarios", default="idle,flood,flood-priority,two-floods")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--tree", type=Path, default=REPO)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for r in range(args.rounds):
        for scenario in args.scenarios.split(","):
            variants = ["on"] if scenario == "idle" else (["on", "off"] if r % 2 == 0 else ["off", "on"])
            for variant in variants:
                with tempfile.TemporaryDirectory(prefix=f"fairness-{scenario}-") as logs:
                    keys = keys_file(Path(logs), SCENARIOS[scenario][2])
                    with meshserve_up([*FLEET, "--api-keys-file", str(keys), *VARIANTS[variant]], logs,
                                      args.tree.resolve()):
                        tally = asyncio.run(drive(scenario, args.seconds))
                row = figures(scenario, variant, tally, args.seconds) | {"round": r + 1}
                rows.append(row)
                (args.out / f"{scenario}-{variant}-{r + 1}.json").write_text(json.dumps(row, indent=1) + "\n")
                print(json.dumps(row), flush=True)
    (args.out / "summary.md").write_text(summary(rows))
    print((args.out / "summary.md").read_text())
    return 0


def summary(rows: list[dict]) -> str:
    def med(scenario: str, variant: str, key: str, sub: str | None = None) -> float | None:
        values = [(r[key] if sub is None else r[key].get(sub, 0.0)) for r in rows
                  if r["scenario"] == scenario and r["variant"] == variant and key in r]
        return statistics.median(values) if values else None

    lines = ["| scenario | flow control | small TTFT p50 / p99 ms | flooders' tokens/s | Jain's index | errors |",
             "|---|---|---|---|---|---|"]
    for scenario in dict.fromkeys(r["scenario"] for r in rows):
        for variant in ("on", "off"):
            these = [r for r in rows if r["scenario"] == scenario and r["variant"] == variant]
            if not these:
                continue
            p50, p99 = med(scenario, variant, "small_ttft_p50_ms"), med(scenario, variant, "small_ttft_p99_ms")
            ttft = f"{p50:.0f} / {p99:.0f}" if p50 is not None and p99 is not None else "-"
            tokens = " + ".join(f"{t} {med(scenario, variant, 'tokens_per_s', t):.0f}" for t in SCENARIOS[scenario][0])
            jain = med(scenario, variant, "jain")
            errors = {k: v for r in these for k, v in r["errors"].items()}
            lines.append(f"| {scenario} | {variant} ({len(these)} runs) | {ttft} | {tokens or '-'} | "
                         f"{'-' if jain is None else f'{jain:.3f}'} | {errors or 0} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
