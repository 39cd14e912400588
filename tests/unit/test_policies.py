"""Routing policy pieces, table-driven: filters, scorers, pickers, policies and their registry."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from meshserve.router.policies import (
    AdapterPlacementFilter,
    POLICIES,
    AdapterFilter,
    AdapterSlotScorer,
    BoundedLoadFilter,
    ExcludeFilter,
    Filter,
    HealthyFilter,
    KvAwareScorer,
    LeastLoadScorer,
    ModelFilter,
    MaxScorePicker,
    NotDrainingFilter,
    NoWorker,
    PickContext,
    Picker,
    PowerOfTwoPicker,
    PrefixAffinityScorer,
    RandomPicker,
    RoundRobinPicker,
    Scorer,
    SessionAffinityScorer,
    Tuning,
    build_policy,
)
from meshserve.router.state import Fleet, LoraSlots, WorkerLoad, WorkerTable, WorkerView


def w(
    worker_id: str,
    running: int = 0,
    waiting: int = 0,
    in_flight: int = 0,
    assigned: int = 0,
    age: float | None = 0.1,
    connected: bool = True,
    draining: bool = False,
    kv_usage: float = 0.0,
) -> WorkerView:
    load = None if age is None else WorkerLoad(
        num_running=running, num_waiting=waiting, num_in_flight=in_flight, draining=draining, kv_cache_usage=kv_usage
    )
    # Reports ``age`` seconds old at the default pick time (PickContext.now = 0).
    return WorkerView.of(worker_id, f"{worker_id}:1", connected, load, None if age is None else -age, assigned)


def of(view: WorkerView, model: str) -> WorkerView:
    """``view`` serving the base model ``model``."""
    return view._replace(model=model)


def serving(view: WorkerView, *adapters: str) -> WorkerView:
    """``view`` with the LoRA ``adapters`` (two slots)."""
    return view._replace(lora=LoraSlots(tuple((a, f"/adapters/{a}") for a in adapters), max_loras=2))


def kept(filter_: Filter, ctx: PickContext, workers: list[WorkerView]) -> list[str]:
    """The ids of the workers ``filter_`` keeps of all of ``workers``."""
    mask = filter_.keep(ctx, Fleet.of(workers), np.ones(len(workers), dtype=bool))
    return [x.worker_id for x, k in zip(workers, mask) if k]


def scores(scorer: Scorer, ctx: PickContext, workers: list[WorkerView]) -> list[float]:
    """``scorer``'s scores of every one of ``workers``."""
    return scorer.score(ctx, Fleet.of(workers), np.arange(len(workers))).tolist()


def picked(picker: Picker, scored: list[float], seed: int) -> str:
    """The worker ``picker`` picks of workers w0, w1, ... scored ``scored``."""
    return f"w{picker.pick(np.array(scored, dtype=float), random.Random(seed))}"


@pytest.mark.parametrize(
    ("filter_", "ctx", "workers", "kept_ids"),
    [
        (HealthyFilter(2.0), PickContext(), [w("a"), w("b", connected=False)], ["a"]),
        (HealthyFilter(2.0), PickContext(), [w("a", age=1.9), w("b", age=2.5)], ["a"]),
        (HealthyFilter(2.0), PickContext(), [w("a", age=None), w("b")], ["b"]),
        # No fresh worker: the late ones that are still connected, as a last resort.
        (HealthyFilter(2.0), PickContext(), [w("a", age=2.5), w("b", age=9.0), w("c", age=3.0, connected=False)],
         ["a", "b"]),
        (NotDrainingFilter(), PickContext(), [w("a", draining=True), w("b")], ["b"]),
        (ExcludeFilter(), PickContext(exclude=frozenset({"a", "c"})), [w("a"), w("b"), w("c")], ["b"]),
        (ExcludeFilter(), PickContext(), [w("a"), w("b")], ["a", "b"]),
        # bound = ceil(1.25 * (total + 1) / n); a worker passes while outstanding + 1 <= bound
        (BoundedLoadFilter(0.25), PickContext(), [w("a"), w("b"), w("c")], ["a", "b", "c"]),
        (BoundedLoadFilter(0.25), PickContext(), [w("a", 10), w("b"), w("c")], ["b", "c"]),
        (BoundedLoadFilter(0.25), PickContext(), [w("a", 6), w("b", 4), w("c", 2)], ["b", "c"]),
        (BoundedLoadFilter(0.25), PickContext(), [w("a", 4), w("b", 4), w("c", 4)], ["a", "b", "c"]),
        (BoundedLoadFilter(0.25), PickContext(), [w("a", 3, assigned=3), w("b", 1)], ["b"]),
        (AdapterFilter(), PickContext(adapter="x"), [w("a"), serving(w("b"), "x", "y"), serving(w("c"), "y")], ["b"]),
        (AdapterFilter(), PickContext(), [w("a"), serving(w("b"), "x")], ["a", "b"]),  # the base model: any
        (AdapterFilter(), PickContext(adapter="z"), [w("a"), serving(w("b"), "x")], []),
        # An adapter workers can load: those with LoRA enabled while none holds it, else its holders.
        (AdapterFilter(), PickContext(adapter="z", adapter_loadable=True), [w("a"), serving(w("b"), "x"),
                                                                            serving(w("c"))], ["b", "c"]),
        (AdapterFilter(), PickContext(adapter="x", adapter_loadable=True), [w("a"), serving(w("b"), "x"),
                                                                            serving(w("c"))], ["b"]),
        (AdapterFilter(), PickContext(adapter="z", adapter_loadable=True), [w("a")], []),
        (ModelFilter(), PickContext(model="m2"), [of(w("a"), "m1"), of(w("b"), "m2"), of(w("c"), "m2")], ["b", "c"]),
        (ModelFilter(), PickContext(), [of(w("a"), "m1"), of(w("b"), "m2")], ["a", "b"]),  # none named: any
        (ModelFilter(), PickContext(model="m3"), [of(w("a"), "m1"), of(w("b"), "m2")], []),
    ],
)
def test_filters(filter_: Filter, ctx: PickContext, workers: list[WorkerView], kept_ids: list[str]) -> None:
    assert kept(filter_, ctx, workers) == kept_ids


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_picks_among_the_workers_of_the_model(name: str) -> None:
    policy = POLICIES[name](Tuning())
    # The other model's workers are idle and would win on load, prefix or session alone.
    workers = [of(w("a"), "m1"), of(w("b", 5), "m2"), of(serving(w("c", 9), "x"), "m2"), of(w("d"), "m1")]
    assert {policy.pick(PickContext(model="m2", prompt=f"p{i}", session_key=f"s{i}"), workers,
                        random.Random(i)).worker.worker_id for i in range(10)} <= {"b", "c"}
    assert {policy.pick(PickContext(model="m2", adapter="x", prompt=f"p{i}"), workers,
                        random.Random(i)).worker.worker_id for i in range(10)} == {"c"}
    with pytest.raises(NoWorker, match="no worker serves the model 'm3'"):
        policy.pick(PickContext(model="m3"), workers, random.Random(0))


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_picks_among_the_workers_that_serve_the_adapter(name: str) -> None:
    policy = POLICIES[name](Tuning())
    workers = [w("a"), serving(w("b", 5), "x"), w("c")]
    assert {policy.pick(PickContext(adapter="x", prompt=f"p{i}"), workers, random.Random(i)).worker.worker_id
            for i in range(10)} == {"b"}
    with pytest.raises(NoWorker, match="no worker serves the LoRA adapter 'z'"):
        policy.pick(PickContext(adapter="z"), workers, random.Random(0))


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        ([w("a", 0), w("b", 5), w("c", 10)], [1.0, 0.5, 0.0]),
        ([w("a", 3), w("b", 3)], [1.0, 1.0]),
        ([w("a", 1, waiting=4), w("b", 2)], [0.0, 1.0]),
        ([w("a", 0, assigned=2), w("b", 1)], [0.0, 1.0]),       # picks not yet reported count
        ([w("a", 1, in_flight=5), w("b", 3)], [0.0, 1.0]),      # streams the engine has not queued yet count
    ],
)
def test_least_load_scorer(workers: list[WorkerView], expected: list[float]) -> None:
    assert scores(LeastLoadScorer(), PickContext(), workers) == pytest.approx(expected)


def slots(view: WorkerView, *active: str, running: tuple[str, ...] | None = None,
          picked: tuple[str, ...] = (), waiting: tuple[str, ...] = ()) -> WorkerView:
    """``view`` serving adapters x, y and z with two slots, ``active`` in them (its last report),
    of which ``running`` (default: all) run requests, ``waiting`` adapters waiting for a slot, and
    picks on ``picked`` not reported yet."""
    load = replace(view.load or WorkerLoad(), active_adapters=active,
                   running_adapters=active if running is None else running, waiting_adapters=waiting)
    return serving(view, "x", "y", "z")._replace(load=load, picked_adapters=picked)


@pytest.mark.parametrize(
    ("ctx", "workers", "expected"),
    [
        # In a slot; a free slot; every slot running others; a slot whose adapter is idle.
        (PickContext(adapter="x"), [slots(w("a"), "y", "x"), slots(w("b"), "y"), slots(w("c"), "y", "z"),
                                    slots(w("d"), "y", "z", running=("y",))], [1.0, 0.5, 0.0, 0.5]),
        # A pick on x the worker has not reported yet holds its slot; picks on others fill the slots.
        (PickContext(adapter="x"), [slots(w("a"), "y", "z", picked=("x",)), slots(w("b"), picked=("y", "z"))],
         [1.0, 0.0]),
        (PickContext(adapter="x"), [slots(w("a")), slots(w("b"), "x")], [0.5, 1.0]),  # nothing loaded yet
        # An adapter waiting there for a slot is about to be in one.
        (PickContext(adapter="z"), [slots(w("a"), "x", "y", waiting=("z",)), slots(w("b"), "x", "y")], [1.0, 0.0]),
        (PickContext(adapter="x"), [slots(w("a", age=None)), slots(w("b"), "y", "z")], [0.5, 0.0]),  # no report yet
        (PickContext(), [slots(w("a"), "x"), slots(w("b"))], [0.0, 0.0]),  # the base model: no preference
    ],
)
def test_adapter_slot_scorer(ctx: PickContext, workers: list[WorkerView], expected: list[float]) -> None:
    assert scores(AdapterSlotScorer(), ctx, workers) == pytest.approx(expected)


def demand(view: WorkerView, **picks: float) -> WorkerView:
    """``view`` sent ``picks`` requests on each adapter lately."""
    return view._replace(adapter_demand=picks)


@pytest.mark.parametrize(
    ("adapter", "workers", "expected"),
    [
        # Its holder only, within the load bound: not a free slot elsewhere, nor one that waits.
        ("x", [slots(w("a", 3), "x", "y"), slots(w("b", 3), "y", "z"), slots(w("c", 3))], ["a"]),
        # Past the bound it keeps its holder rather than wait behind other adapters...
        ("x", [slots(w("a", 12), "x", "y"), slots(w("b", 2), "y", "z")], ["a"]),
        # ...and takes a second worker's free slot only while no adapter held nowhere needs it:
        ("x", [slots(w("a", 12), "x", "y"), slots(w("b", 2), "y"), slots(w("c", 2), "z")], ["a", "b", "c"]),
        ("x", [slots(w("a", 12), "x", "y"), slots(w("b", 2), "y")], ["a"]),  # z has no slot but b's
        ("x", [slots(w("a", 12), "x", "y"), slots(w("b", 2), "y", "z", running=("y",))], ["a"]),  # z idle there
        # Held nowhere: the free slots; none free: every worker (it waits for one).
        ("z", [slots(w("a"), "x", "y"), slots(w("b", 2), "y"), slots(w("c", 2)), slots(w("d", 3))], ["b", "c"]),
        ("z", [slots(w("a"), "x", "y"), slots(w("b"), "x", "y")], ["a", "b"]),
        # z waits for a's slots: a drains x, which b holds too; y, held by a alone, goes on.
        ("x", [slots(w("a"), "x", "y", waiting=("z",)), slots(w("b", 9), "x", "z")], ["b"]),
        ("y", [slots(w("a"), "x", "y", waiting=("z",)), slots(w("b", 9), "x", "z")], ["a"]),
        # Neither held elsewhere: a drains the one it was sent fewest of lately, which waits
        # elsewhere rather than there.
        ("y", [demand(slots(w("a"), "x", "y", waiting=("z",)), x=5, y=1), slots(w("b"), "z")], ["b"]),
        ("x", [demand(slots(w("a"), "x", "y", waiting=("z",)), x=5, y=1), slots(w("b"), "z")], ["a"]),
        # A free slot takes the waiting adapter: nothing to drain.
        ("x", [slots(w("a"), "x", running=("x",), waiting=("z",)), slots(w("b"), "x", "y")], ["a", "b"]),
        # The base model: every worker.
        ("", [slots(w("a"), "x", "y", waiting=("z",)), slots(w("b"))], ["a", "b"]),
    ],
)
def test_adapter_placement_filter(adapter: str, workers: list[WorkerView], expected: list[str]) -> None:
    fleet = Fleet.of(workers)
    kept = AdapterPlacementFilter().keep(PickContext(adapter=adapter), fleet, np.ones(len(workers), dtype=bool))
    assert [fleet.views[r].worker_id for r in kept.nonzero()[0]] == expected


def test_the_drained_adapter_is_the_one_picked_fewest_of_lately() -> None:
    """The table counts each worker's recent picks per adapter, halved every half-life."""
    now = [0.0]
    table = WorkerTable(["a:1"], clock=lambda: now[0])
    table.on_connected("a:1", "a", lora=LoraSlots((("x", "/x"), ("y", "/y")), max_loras=2))
    for adapter in ("x", "x", "y"):
        table.on_assigned("a:1", adapter)
    now[0] = 10.0
    table.on_assigned("a:1", "y")
    assert table.snapshot()[0].adapter_demand == pytest.approx({"x": 1.0, "y": 1.5})


def test_a_burst_on_one_adapter_meets_on_one_worker_and_another_adapter_goes_elsewhere() -> None:
    """Before any report shows an adapter loaded, the picks themselves say where each went."""
    table = WorkerTable(["a:1", "b:1"], clock=lambda: 0.0)
    lora = LoraSlots((("x", "/x"), ("y", "/y")), max_loras=1)
    for address in ("a:1", "b:1"):
        table.on_connected(address, address, lora=lora)
        table.on_report(address, WorkerLoad())
    policy = build_policy("kv-aware", 2.0)
    chosen = {}
    for adapter in ("x", "x", "y", "y"):
        choice = policy.pick(PickContext(adapter=adapter, now=0.0), table.fleet(), random.Random(0))
        table.on_assigned(choice.worker.address, adapter)
        chosen.setdefault(adapter, set()).add(choice.worker.worker_id)
    assert len(chosen["x"]) == len(chosen["y"]) == 1 and chosen["x"] != chosen["y"]


@pytest.mark.parametrize(
    ("workers", "prompts", "chosen"),
    [
        # The slot that holds it beats a lighter worker that must evict, whichever worker is the
        # prompt's text-hash home...
        ([slots(w("a", 4), "x", "y"), slots(w("b", 2), "y", "z")], [f"p{i}" for i in range(20)], "a"),
        # ...a slot it can load into at once beats waiting for one...
        ([slots(w("a", 4), "z", "y", running=("y",)), slots(w("b", 3), "y", "z")], [""], "a"),
        # ...but not past the load bound: there a lighter worker with an empty slot loads it.
        ([slots(w("a", 12), "x", "y"), slots(w("b", 2), "y"), slots(w("c", 3), "z")], [f"p{i}" for i in range(20)], "bc"),
    ],
)
def test_kv_aware_sends_an_adapter_where_its_slot_is(workers: list[WorkerView], prompts: list[str], chosen: str) -> None:
    policy = build_policy("kv-aware", 2.0)
    assert {policy.pick(PickContext(adapter="x", prompt=p), workers, random.Random(0)).worker.worker_id
            for p in prompts} <= set(chosen)  # ids of one letter


def test_prefix_affinity_prefers_one_worker_per_prefix_consistently() -> None:
    scorer = PrefixAffinityScorer(prefix_chars=32)
    workers = [w("a"), w("b"), w("c")]
    preferred: dict[str, str] = {}
    for i in range(300):
        prompt = f"system prompt number {i:04d}".ljust(32, ".")
        home = scores(scorer, PickContext(prompt=prompt), workers)
        assert sorted(home) == [0.0, 0.0, 1.0]
        preferred[prompt] = workers[home.index(1.0)].worker_id
        # the same prefix (whatever follows it, whatever the order of workers) -> the same worker
        again = scores(scorer, PickContext(prompt=prompt + " then a different question"), workers[::-1])
        assert workers[::-1][again.index(1.0)].worker_id == preferred[prompt]
    spread = Counter(preferred.values())
    assert set(spread) == {"a", "b", "c"} and min(spread.values()) > 50
    # Removing a worker moves only the prompts it had (rendezvous hashing).
    without_c = [w("a"), w("b")]
    for prompt, worker_id in preferred.items():
        if worker_id != "c":
            home = scores(scorer, PickContext(prompt=prompt), without_c)
            assert without_c[home.index(1.0)].worker_id == worker_id


def test_two_homes_take_the_less_loaded_of_the_first_two_in_rendezvous_order() -> None:
    one, two = PrefixAffinityScorer(prefix_chars=32), PrefixAffinityScorer(prefix_chars=32, homes=2)
    idle = [w("a"), w("b"), w("c"), w("d")]
    homes: dict[str, tuple[str, str]] = {}
    for i in range(200):
        prompt = f"system prompt number {i:04d}".ljust(32, ".")
        first = idle[scores(one, PickContext(prompt=prompt), idle).index(1.0)].worker_id
        # The first home filtered out: the next in the key's order is the second home.
        rest = [x for x in idle if x.worker_id != first]
        second = rest[scores(one, PickContext(prompt=prompt), rest).index(1.0)].worker_id
        homes[prompt] = (first, second)
        # Equal loads: the first home; the first home busier: the second; the others never.
        assert scores(two, PickContext(prompt=prompt), idle) == scores(one, PickContext(prompt=prompt), idle)
        busy = [w(x.worker_id, running=5 if x.worker_id == first else 0) for x in idle]
        got = scores(two, PickContext(prompt=prompt), busy)
        assert sorted(got) == [0.0, 0.0, 0.0, 1.0] and busy[got.index(1.0)].worker_id == second
        # The second home busier still: back to the first.
        busier = [w(x.worker_id, running={first: 5, second: 9}.get(x.worker_id, 0)) for x in idle]
        assert busier[scores(two, PickContext(prompt=prompt), busier).index(1.0)].worker_id == first
    # Every worker is some prompts' first home and some prompts' second.
    assert {f for f, _ in homes.values()} == {s for _, s in homes.values()} == {"a", "b", "c", "d"}
    assert scores(two, PickContext(prompt="x"), [w("a", running=3)]) == [1.0]
    with pytest.raises(ValueError, match="homes must be 1 or 2"):
        PrefixAffinityScorer(homes=3)


def test_prefix_affinity_without_a_prompt_scores_nobody() -> None:
    assert scores(PrefixAffinityScorer(), PickContext(prompt=""), [w("a"), w("b")]) == [0.0, 0.0]


@pytest.mark.parametrize(
    ("scored", "allowed"),
    [
        ([0.2, 0.9, 0.5], {"w1"}),
        ([0.9, 0.9, 0.5], {"w0", "w1"}),
        ([0.0], {"w0"}),
    ],
)
def test_max_score_picker_breaks_ties_at_random(scored: list[float], allowed: set[str]) -> None:
    assert {picked(MaxScorePicker(), scored, seed) for seed in range(50)} == allowed


def test_power_of_two_picker_never_picks_the_worst_and_spreads() -> None:
    scored = [0.0, 0.25, 0.5, 0.75, 1.0]
    counts = Counter(picked(PowerOfTwoPicker(), scored, seed) for seed in range(400))
    assert "w0" not in counts
    assert counts["w4"] > counts["w3"] > counts["w2"] > counts["w1"] > 0
    assert picked(PowerOfTwoPicker(), scored[:1], 0) == "w0"


def test_random_picker_ignores_scores() -> None:
    assert {picked(RandomPicker(), [0.0, 1.0], seed) for seed in range(50)} == {"w0", "w1"}


@pytest.mark.parametrize(
    ("workers", "exclude", "message"),
    [
        ([], set(), "knows no workers"),
        ([w("a", connected=False), w("b", age=None)], set(), "no healthy worker"),
        ([w("a", draining=True)], set(), "draining"),
        ([w("a"), w("b"), w("c", connected=False)], {"a", "b"}, "every healthy worker is excluded"),
    ],
)
@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_refuses_when_no_worker_is_eligible(
    name: str, workers: list[WorkerView], exclude: set[str], message: str
) -> None:
    policy = build_policy(name, stale_after_s=2.0)
    with pytest.raises(NoWorker, match=message):
        policy.pick(PickContext(exclude=frozenset(exclude)), workers, random.Random(0))


@pytest.mark.parametrize("name", list(POLICIES))
def test_every_policy_picks_only_eligible_workers(name: str) -> None:
    policy = build_policy(name, stale_after_s=2.0)
    workers = [
        w("sick", connected=False), w("old", age=5.0), w("drain", draining=True),
        w("gone"), w("ok", 7), w("ok2", 9),
    ]
    for seed in range(30):
        ctx = PickContext(prompt=f"p{seed}", exclude=frozenset({"gone"}))
        assert policy.pick(ctx, workers, random.Random(seed)).worker.worker_id in {"ok", "ok2"}


def test_least_load_policy_picks_the_least_outstanding() -> None:
    policy = build_policy("least-load", 2.0)
    workers = [w("a", 5), w("b", 1, waiting=1), w("c", 1, assigned=2)]
    choice = policy.pick(PickContext(), workers, random.Random(0))
    assert (choice.worker.worker_id, choice.num_candidates, choice.score) == ("b", 3, 1.0)


def test_prefix_affinity_policy_sticks_to_its_worker_until_it_is_overloaded() -> None:
    policy = build_policy("prefix-affinity", 2.0)
    ctx = PickContext(prompt="You are a helpful assistant. " * 20)
    idle = [w("a"), w("b"), w("c")]
    home = policy.pick(ctx, idle, random.Random(0)).worker.worker_id
    # A little busier than the others: affinity still wins.
    busier = [w(x, 2 if x == home else 1) for x in "abc"]
    assert policy.pick(ctx, busier, random.Random(0)).worker.worker_id == home
    # Far above the average: the request overflows to another worker.
    hot = [w(x, 20 if x == home else 1) for x in "abc"]
    assert policy.pick(ctx, hot, random.Random(0)).worker.worker_id != home


def test_a_burst_of_picks_spreads_through_assigned_unreported() -> None:
    """Between two load reports the table counts each pick, so equal workers share a burst."""
    clock = [0.0]
    table = WorkerTable(["a:1", "b:1", "c:1"], clock=lambda: clock[0])
    for address in table.addresses():
        table.on_connected(address, address[0])
        table.on_report(address, WorkerLoad())
    policy = build_policy("least-load", 2.0)
    rng = random.Random(0)
    picks = Counter()
    for _ in range(9):
        choice = policy.pick(PickContext(), table.snapshot(), rng)
        table.on_assigned(choice.worker.address)
        picks[choice.worker.worker_id] += 1
    assert picks == {"a": 3, "b": 3, "c": 3}
    table.on_report("a:1", WorkerLoad(num_running=3, requests_received=3))  # all three arrived
    assert [x.assigned_unreported for x in table.snapshot()] == [0, 3, 3]
    clock[0] = 5.0
    assert not any(x.is_healthy(2.0, table.now()) for x in table.snapshot())


def test_picks_count_until_a_report_shows_them_arrived() -> None:
    clock = [0.0]
    table = WorkerTable(["a:1"], clock=lambda: clock[0], pick_ttl_s=2.0)
    table.on_connected("a:1", "a")
    table.on_report("a:1", WorkerLoad(requests_received=10))  # a new stream: the baseline
    for _ in range(3):
        table.on_assigned("a:1")

    def unreported() -> int:
        return table.snapshot()[0].assigned_unreported

    # A report sent before the picks arrived (the race the old reset lost) settles none of them.
    table.on_report("a:1", WorkerLoad(requests_received=10))
    assert unreported() == 3
    table.on_report("a:1", WorkerLoad(num_running=1, requests_received=11))
    assert unreported() == 2
    # Requests from elsewhere (more arrivals than picks) settle at most what is pending.
    table.on_report("a:1", WorkerLoad(requests_received=20))
    assert unreported() == 0
    # A pick that never arrives stops counting after pick_ttl_s.
    table.on_assigned("a:1")
    clock[0] = 1.0
    assert unreported() == 1
    clock[0] = 2.5
    assert unreported() == 0
    # A restarted worker (its counter went back) or a new stream starts the count again.
    table.on_assigned("a:1")
    table.on_report("a:1", WorkerLoad(requests_received=0))
    assert unreported() == 0


def test_each_worker_s_picks_expire_on_their_own_time() -> None:
    """Unsettled picks stop counting pick_ttl_s after they were made, worker by worker, and a
    view's outstanding is its engine's queue (or accepted streams, if more) plus those picks."""
    clock = [0.0]
    table = WorkerTable(["a:1", "b:1"], clock=lambda: clock[0], pick_ttl_s=2.0)
    for address in table.addresses():
        table.on_connected(address, address[0])
    table.on_report("a:1", WorkerLoad(num_running=2, num_waiting=1))
    table.on_report("b:1", WorkerLoad(num_running=1, num_in_flight=4))
    table.on_assigned("a:1")
    clock[0] = 1.0
    table.on_assigned("b:1")
    table.on_assigned("b:1")

    def outstanding() -> list[int]:
        return [v.outstanding for v in table.snapshot()]

    assert outstanding() == [3 + 1, 4 + 2]
    clock[0] = 2.5  # a's pick is 2.5 s old, b's 1.5 s
    assert outstanding() == [3, 4 + 2]
    clock[0] = 3.5
    assert outstanding() == [3, 4]
    table.on_assigned("a:1")  # a later pick counts again, and expires in its turn
    assert outstanding() == [4, 4]
    clock[0] = 5.6
    assert outstanding() == [3, 4]


def test_a_pick_settled_by_a_report_does_not_expire_a_later_one() -> None:
    clock = [0.0]
    table = WorkerTable(["a:1"], clock=lambda: clock[0], pick_ttl_s=2.0)
    table.on_connected("a:1", "a")
    table.on_report("a:1", WorkerLoad(requests_received=0))
    table.on_assigned("a:1")
    table.on_report("a:1", WorkerLoad(requests_received=1))  # that pick arrived
    clock[0] = 1.0
    table.on_assigned("a:1")

    def unreported() -> int:
        return table.snapshot()[0].assigned_unreported

    clock[0] = 2.5  # the first pick's time is up, but it was settled: the second still counts
    assert unreported() == 1
    clock[0] = 3.5
    assert unreported() == 0


def test_the_table_s_columns_follow_its_workers() -> None:
    """The columns a table writes in place as its workers change are the ones its views make,
    and a fleet taken earlier keeps what it saw."""
    clock = [0.0]
    table = WorkerTable(["a:1", "b:1"], clock=lambda: clock[0], pick_ttl_s=2.0)

    def columns() -> Fleet:
        fleet, made = table.fleet(), Fleet.of(table.snapshot())
        for name in ("connected", "reported_at", "draining", "outstanding", "waiting", "kv_usage", "seeds"):
            assert getattr(fleet, name).tolist() == getattr(made, name).tolist(), name
        assert dict(fleet.rows) == dict(made.rows)
        return fleet

    columns()
    table.on_connected("a:1", "worker-a")
    table.on_report("a:1", WorkerLoad(num_running=3, draining=True))
    before = columns()
    table.add("c:1")
    table.on_connected("c:1", "worker-c")
    table.on_report("c:1", WorkerLoad(num_waiting=2, kv_cache_usage=0.5))
    table.on_assigned("c:1")
    assert columns().outstanding.tolist() == [3, 0, 3]
    assert columns().waiting.tolist() == [0, 0, 2] and columns().kv_usage.tolist() == [0.0, 0.0, 0.5]
    table.remove("a:1")
    fleet = columns()
    assert dict(fleet.rows) == {"b:1": 0, "c:1": 1} and fleet.outstanding.tolist() == [0, 3]
    clock[0] = 5.0  # c's pick expired, every report is stale
    assert columns().outstanding.tolist() == [0, 2]
    table.on_disconnected("c:1")
    assert columns().connected.tolist() == [False, False]
    assert before.outstanding.tolist() == [3, 0] and before.draining.tolist() == [True, False]


def test_registry_builds_each_policy_by_name_and_rejects_unknown_names() -> None:
    for name in POLICIES:
        assert build_policy(name, 2.0).name == name
    with pytest.raises(ValueError, match="least-load"):
        build_policy("fastest", 2.0)


# -- KV-aware, session affinity, round robin -------------------------------------------------


@pytest.mark.parametrize(
    ("ctx", "expected"),
    [
        # The fraction of the prompt's blocks each worker holds (by address).
        (PickContext(block_hashes=(1, 2, 3, 4), cached_blocks={"a:1": 4, "b:1": 1}), [1.0, 0.25, 0.0]),
        (PickContext(block_hashes=(1, 2), cached_blocks={}), [0.0, 0.0, 0.0]),
        # What every candidate holds does not count: only the blocks beyond it.
        (PickContext(block_hashes=(1, 2, 3, 4), cached_blocks={"a:1": 4, "b:1": 2, "c:1": 2}), [0.5, 0.0, 0.0]),
        # A prompt shorter than a block: nothing to reuse anywhere.
        (PickContext(block_hashes=(), cached_blocks={}), [0.0, 0.0, 0.0]),
    ],
)
def test_kv_aware_scores_the_cached_fraction(ctx: PickContext, expected: list[float]) -> None:
    assert scores(KvAwareScorer(), ctx, [w("a"), w("b"), w("c")]) == expected


@pytest.mark.parametrize(
    ("holder", "full", "expected"),
    [
        # A full KV cache and a queue: the blocks count for the share of requests the engine runs.
        (w("a", running=2, waiting=6, kv_usage=0.98), 0.95, 0.25),
        (w("a", running=2, waiting=6, kv_usage=0.98), 0.0, 1.0),      # off
        (w("a", running=2, waiting=6, kv_usage=0.90), 0.95, 1.0),     # a queue, room in the cache
        (w("a", running=8, waiting=0, kv_usage=1.0), 0.95, 1.0),      # full, nothing waiting
    ],
)
def test_kv_aware_discounts_the_blocks_of_a_worker_whose_full_cache_queues(
    holder: WorkerView, full: float, expected: float
) -> None:
    ctx = PickContext(block_hashes=(1, 2, 3, 4), cached_blocks={"a:1": 4})
    assert scores(KvAwareScorer(full=full), ctx, [holder, w("b", running=8)]) == [expected, 0.0]


def test_a_prefix_on_a_worker_whose_full_cache_queues_goes_to_one_that_runs_it() -> None:
    """The holder's KV cache is full of other prefixes: it runs 20 requests and queues 60. The
    request goes to a worker that runs it now (and computes the prefix); with the discount off
    (``kv_full_usage`` 0), to the holder."""
    ctx = PickContext(block_hashes=(1, 2, 3, 4), cached_blocks={"a:1": 4})
    fleet = [w("a", running=20, waiting=60, kv_usage=0.99), w("b", running=70, kv_usage=0.8)]
    assert build_policy("kv-aware", 2.0).pick(ctx, fleet, random.Random(0)).worker.worker_id == "b"
    assert build_policy("kv-aware", 2.0, kv_full_usage=0).pick(ctx, fleet, random.Random(0)).worker.worker_id == "a"


def test_kv_aware_without_a_view_falls_back_to_the_text_hash() -> None:
    workers = [w("a"), w("b"), w("c")]
    ctx = PickContext(prompt="a system prompt", cached_blocks=None)
    assert scores(KvAwareScorer(), ctx, workers) == scores(PrefixAffinityScorer(), ctx, workers)
    assert sum(scores(KvAwareScorer(), ctx, workers)) == 1.0


def test_session_affinity_keeps_a_session_on_one_worker() -> None:
    workers = [w("a"), w("b"), w("c"), w("d")]
    homes = {s: scores(SessionAffinityScorer(), PickContext(session_key=s), workers).index(1.0)
             for s in (f"user-{i}" for i in range(40))}
    assert len(set(homes.values())) == 4  # sessions spread over the workers
    again = {s: scores(SessionAffinityScorer(), PickContext(session_key=s), workers).index(1.0) for s in homes}
    assert again == homes
    assert scores(SessionAffinityScorer(), PickContext(), workers) == [0.0] * 4


def test_round_robin_takes_each_candidate_in_turn() -> None:
    picker = RoundRobinPicker()
    assert [picked(picker, [0.0, 9.0, 0.0], 0) for _ in range(6)] == ["w0", "w1", "w2"] * 2


def test_kv_aware_goes_where_the_prefix_is_unless_that_worker_is_over_the_load_bound() -> None:
    policy = build_policy("kv-aware", 2.0)
    ctx = PickContext(block_hashes=(1, 2, 3, 4), cached_blocks={"b:1": 4})
    assert policy.pick(ctx, [w("a", running=2), w("b", running=2), w("c", running=1)],
                       random.Random(0)).worker.worker_id == "b"
    # b holds the prefix but would exceed 1.25x the average outstanding: the least loaded instead.
    hot = [w("a", running=2), w("b", running=12), w("c", running=1)]
    assert policy.pick(ctx, hot, random.Random(0)).worker.worker_id == "c"


def test_kv_aware_computes_an_unheld_prompt_on_one_of_its_two_homes() -> None:
    """No candidate holds more of the prompt than the others: the less loaded of the prompt's two
    text-hash homes takes it, not whichever worker is least loaded, so a prefix that spills (its
    holder over the load bound) or was evicted everywhere lands on the same two workers."""
    policy = build_policy("kv-aware", 2.0)
    names = ["a", "b", "c", "d", "e"]
    idle = [w(n) for n in names]
    two = PrefixAffinityScorer(prefix_chars=256, homes=2)
    for i in range(40):
        prompt = f"a long shared document number {i}"
        first = names[scores(two, PickContext(prompt=prompt), idle).index(1.0)]
        second = names[scores(two, PickContext(prompt=prompt),
                              [w(n, running=9 if n == first else 0) for n in names]).index(1.0)]
        # e is the least loaded worker; a prompt nobody holds still goes to its first home.
        fleet = [w(n, running=0 if n == "e" else 3) for n in names]
        ctx = PickContext(prompt=prompt, block_hashes=(1, 2, 3), cached_blocks={})
        want = "e" if "e" in (first, second) else first  # e is one of its homes: the less loaded
        assert policy.pick(ctx, fleet, random.Random(0)).worker.worker_id == want
        # The holder is over the load bound: the spill goes to a home among the rest, every time.
        holder = next(n for n in names if n not in (first, second))
        hot = [w(n, running=20 if n == holder else 3) for n in names]
        held = replace(ctx, cached_blocks={f"{holder}:1": 3})
        assert {policy.pick(held, hot, random.Random(s)).worker.worker_id for s in range(5)} == {first}
    # The same blocks held everywhere (a system prompt) tell nobody apart: the homes decide too.
    common = PickContext(prompt="x", block_hashes=(1, 2), cached_blocks={f"{n}:1": 1 for n in names})
    assert scores(policy.scorers[0][0], common, idle) == scores(two, common, idle)
    # No full block to place, or no choice to make: 0, and load decides.
    assert scores(policy.scorers[0][0], replace(common, block_hashes=()), idle) == [0.0] * 5
    assert scores(policy.scorers[0][0], replace(common, cached_blocks={}), [w("a")]) == [0.0]


def test_a_choice_says_what_each_scorer_gave_the_chosen_worker() -> None:
    """The router's span shows why a worker won: each scorer's score of it, before weights."""
    ctx = PickContext(block_hashes=(1, 2, 3, 4), cached_blocks={"b:1": 3})
    choice = build_policy("kv-aware", 2.0).pick(ctx, [w("a", running=4), w("b", running=5), w("c", running=6)],
                                                random.Random(0))
    assert choice.worker.worker_id == "b"
    # A scorer at weight 0 (prefix-home) is off; the adapter scorer has no adapter to score.
    assert choice.scores == {"kv": 0.75, "load": 0.5, "adapter": 0.0}
    assert choice.score == pytest.approx(0.75 + 0.3 * 0.5)
    assert build_policy("round-robin", 2.0).pick(ctx, [w("a")], random.Random(0)).scores == {}


@pytest.mark.parametrize(("knobs", "named"), [({"load_bound": 0.9}, "load_bound"), ({"kv_load_weight": -1}, "kv_load_weight"),
                                              ({"kv_home_weight": -0.1}, "kv_home_weight"),
                                              ({"kv_full_usage": 1.5}, "kv_full_usage"),
                                              ({"kv_adapter_weight": -1}, "kv_adapter_weight")])
def test_bad_weights_are_refused_naming_the_knob(knobs: dict, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        build_policy("kv-aware", 2.0, **knobs)


@pytest.mark.parametrize("argv", [["up", "--routing", "fastest"], ["serve", "router", "--routing", "fastest"],
                                  ["serve", "router", "--load-bound", "0.5"], ["up", "--kv-load-weight", "-1"]])
def test_the_command_line_refuses_an_unknown_policy_or_bad_weight(argv: list[str], capsys: pytest.CaptureFixture) -> None:
    from meshserve.commands.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    err = capsys.readouterr().err
    assert ("round-robin" in err and "kv-aware" in err) if "--routing" in argv else "must be at least" in err
