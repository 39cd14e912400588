"""The routing benchmark's fixed command lines parse: a scenario with a flag that `meshserve up`
or `meshserve bench` does not take fails here, not minutes into a run."""

from __future__ import annotations

import pytest

from bench import cache, routing
from meshserve.commands.cli import build_parser


@pytest.mark.parametrize("name", sorted(routing.SCENARIOS))
def test_every_routing_scenario_is_what_up_and_bench_take(name: str) -> None:
    scenario = routing.SCENARIOS[name]
    parser = build_parser()
    up = parser.parse_args(["up", *routing.FLEET, *scenario.up])
    bench = parser.parse_args(["bench", "--target", "127.0.0.1:1", *scenario.bench, "--seed", "1"])
    assert up.engine == "sim" and up.workers == 4
    assert bench.dataset_name in ("prefix_repetition", "multi_turn")


def test_a_scenario_s_own_flags_win_over_the_fleet_s() -> None:
    scenario = routing.SCENARIOS["multi-history"]
    up = build_parser().parse_args(["up", *routing.FLEET, *scenario.up])
    bench = build_parser().parse_args(["bench", "--target", "127.0.0.1:1", *scenario.bench])
    assert up.sim_num_kv_blocks == 4000 and up.max_model_len == 4096  # FLEET says 1000 blocks first
    assert bench.multi_turn_user_history_len == 1000


@pytest.mark.parametrize("name", sorted(cache.SCENARIOS))
def test_every_cache_scenario_is_what_up_and_bench_take(name: str) -> None:
    parser = build_parser()
    for label, (up_flags, bench_flags) in cache.SCENARIOS[name].variants.items():
        up = parser.parse_args(["up", *cache.FLEET, *up_flags])
        assert up.engine == "sim" and up.workers == 4, label
        if name == "hits":  # its bench flags say whether users generate meanwhile: BACKGROUND's
            assert bench_flags in ([], ["--load"])
            bench_flags = cache.BACKGROUND
        else:
            bench_flags = [*cache.BENCH[name], *bench_flags]
        parser.parse_args(["bench", "--target", "127.0.0.1:1", *bench_flags, "--seed", "1"])
