"""Routing policies, in the shape of the Gateway API inference extension's scheduler: filters drop
workers that must not get the request, weighted scorers rate the rest from 0 to 1, and one picker
chooses. Every piece is a small synchronous class over a ``Fleet`` (the workers' views and their
fields as columns): a filter narrows a mask of rows, a scorer scores the candidate rows, each in
a few array operations, so a pick over hundreds of workers costs what one over four does.
``POLICIES`` names the combinations that ``RouterConfig.routing`` selects.
"""

from __future__ import annotations

import abc
import hashlib
import itertools
import math
import random
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from meshserve.router.kv_index import HeldBlocks
from meshserve.router.state import Fleet, WorkerLoad, WorkerView
from meshserve.services.config import ROUTING_POLICIES, RoutingConfig


@dataclass(frozen=True)
class PickContext:
    """What a policy knows about the request."""

    request_id: str = ""
    prompt: str = ""                        # the prompt, or the chat messages as "role: content" lines
    first_user: str = ""                    # a chat's first user message ("" for a plain prompt)
    exclude: frozenset[str] = frozenset()   # worker ids that already failed this request
    adapter: str = ""                       # the LoRA adapter it runs on ("": the base model)
    adapter_loadable: bool = False          # a worker with LoRA enabled can load it (its lora_path)
    model: str = ""                         # the base model it runs on, as workers report it ("": any)
    session_key: str = ""                   # same key, same worker (session affinity)
    # The prompt's full-block hash chain and, by worker address, how many leading blocks of it
    # each worker holds (from the KV index the policy reads); None when the router has no view.
    block_hashes: tuple[int, ...] = ()
    cached_blocks: Mapping[str, int] | None = None
    now: float = 0.0  # the clock time of the pick (the worker table's clock): how old reports are


@dataclass(frozen=True)
class Choice:
    worker: WorkerView
    score: float
    num_candidates: int
    # Each scorer's score of the chosen worker, before its weight (by ``Scorer.name``): why it won.
    scores: Mapping[str, float] = field(default_factory=dict)


class NoWorker(Exception):
    """No worker may take the request (gRPC UNAVAILABLE); the message says why."""


class Filter(abc.ABC):
    """Keeps the workers that may take the request."""

    empty_reason = "no eligible worker"   # the NoWorker message when nothing passes

    @abc.abstractmethod
    def keep(self, ctx: PickContext, fleet: Fleet, mask: np.ndarray) -> np.ndarray:
        """The rows of ``mask`` (bool, one per worker) that pass; a new array."""

    def why_empty(self, ctx: PickContext) -> str:
        """The NoWorker message when no worker passes."""
        return self.empty_reason


class Scorer(abc.ABC):
    """Rates each candidate from 0 (worst) to 1 (best) for this request."""

    name: str  # in traces: the span attribute meshserve.router.score.<name>

    @abc.abstractmethod
    def score(self, ctx: PickContext, fleet: Fleet, rows: np.ndarray) -> np.ndarray:
        """A float per row of ``rows`` (the candidates' rows of ``fleet``, never empty)."""


class Picker(abc.ABC):
    """Chooses one candidate from their total scores (never empty): its position."""

    @abc.abstractmethod
    def pick(self, scores: np.ndarray, rng: random.Random) -> int: ...


# -- filters ---------------------------------------------------------------------------------


class ModelFilter(Filter):
    """Workers that serve the request's base model (``WorkerInfo.model``): a mesh may serve
    several, and a request for one never runs on another's weights. No model named: any worker."""

    def keep(self, ctx: PickContext, fleet: Fleet, mask: np.ndarray) -> np.ndarray:
        if not ctx.model:
            return mask
        kept = mask.copy()
        for row in mask.nonzero()[0]:
            kept[row] = fleet.views[row].model == ctx.model
        return kept

    def why_empty(self, ctx: PickContext) -> str:
        return f"no worker serves the model {ctx.model!r}"


class AdapterFilter(Filter):
    """Workers that serve the request's LoRA adapter (every worker serves the base model). While
    none does, an adapter the request can have loaded (``adapter_loadable``) admits the workers
    with LoRA enabled: the one picked loads it."""

    def keep(self, ctx: PickContext, fleet: Fleet, mask: np.ndarray) -> np.ndarray:
        if not ctx.adapter:
            return mask
        kept = mask.copy()
        for row in mask.nonzero()[0]:
            kept[row] = fleet.views[row].serves(ctx.adapter)
        if ctx.adapter_loadable and not kept.any():
            for row in mask.nonzero()[0]:
                kept[row] = fleet.views[row].lora is not None
        return kept

    def why_empty(self, ctx: PickContext) -> str:
        return f"no worker serves the LoRA adapter {ctx.adapter!r}"


class HealthyFilter(Filter):
    """Workers whose load stream is open and whose last report is younger than ``stale_after_s``;
    when there are none, the connected workers whose reports are late: a worker too busy to
    report on time (a long pause, a starved CPU) still serves better than a refusal, and a
    worker that is gone closes its stream (or the watcher closes it after ``lost_after_s``)."""

    empty_reason = "no healthy worker"

    def __init__(self, stale_after_s: float) -> None:
        self.stale_after_s = stale_after_s

    def keep(self, ctx: PickContext, fleet: Fleet, mask: np.ndarray) -> np.ndarray:
        connected = mask & fleet.connected & (fleet.reported_at > -np.inf)
        fresh = connected & (fleet.reported_at >= ctx.now - self.stale_after_s)
        return fresh if np.count_nonzero(fresh) else connected


class NotDrainingFilter(Filter):
    """Workers that are not shutting down."""

    empty_reason = "no healthy worker: every worker is draining"

    def keep(self, ctx: PickContext, fleet: Fleet, mask: np.ndarray) -> np.ndarray:
        return mask & ~fleet.draining


class ExcludeFilter(Filter):
    """Workers the caller did not exclude (the gateway excludes a worker that failed the request)."""

    empty_reason = "no healthy worker left: every healthy worker is excluded"

    def keep(self, ctx: PickContext, fleet: Fleet, mask: np.ndarray) -> np.ndarray:
        if not ctx.exclude:
            return mask
        kept = mask.copy()
        for row in mask.nonzero()[0]:
            if fleet.views[row].worker_id in ctx.exclude:
                kept[row] = False
        return kept


class BoundedLoadFilter(Filter):
    """Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, 2018): a worker
    may take one more request only while it would hold at most ``1 + epsilon`` times the
    average. Keeps affinity from piling one hot prefix onto one worker; at least the least
    loaded worker always passes."""

    def __init__(self, epsilon: float = 0.25) -> None:
        self.epsilon = epsilon

    def keep(self, ctx: PickContext, fleet: Fleet, mask: np.ndarray) -> np.ndarray:
        return mask & (fleet.outstanding < _load_capacity(fleet, mask, self.epsilon))


def _load_capacity(fleet: Fleet, rows: np.ndarray, epsilon: float) -> int:
    """The bounded-load capacity of the workers ``rows`` (a mask or row numbers) as one more
    request arrives: a worker holding this many outstanding requests or more is past the bound."""
    outstanding = fleet.outstanding[rows]
    return math.ceil((1 + epsilon) * (int(np.add.reduce(outstanding)) + 1) / len(outstanding))


class AdapterPlacementFilter(Filter):
    """For a request on a LoRA adapter, the workers where it starts without starving another.
    An engine's slots (--max-loras) hold that many adapters in its running batch, and vLLM's
    scheduler skips a request whose adapter has no slot for as long as the running adapters
    have requests: on a worker whose slots run other adapters it waits until one of them is
    idle, which new requests on them put off for ever. So the request goes

    1. to the workers that hold its adapter (``WorkerView.held_adapters``), less one draining it;
    2. else to the least loaded of those with a free slot (empty, or holding an adapter none of
       its requests runs): an adapter stays where it is placed, whatever its first prompt. When
       every holder is past the load bound (``1 + epsilon`` times the average) while empty
       slots outnumber the fleet's adapters that no worker holds, to those with an empty slot
       too: a hot adapter takes a second worker's slot, not one that an idle adapter holds or
       an adapter held nowhere will need;
    3. else to those where it waits for a slot, and there a worker drains one.

    A worker with requests waiting for a slot while its slots all run drains as many of its
    running adapters as adapters wait: first those other workers hold too (their requests
    have somewhere to go), then those it was sent fewest of lately. It gets no more requests on
    them while any other worker may take them, so their slots empty within a request's length
    and the waiting ones start."""

    def __init__(self, epsilon: float = 0.25) -> None:
        self.epsilon = epsilon  # the load bound's, as BoundedLoadFilter's

    def keep(self, ctx: PickContext, fleet: Fleet, mask: np.ndarray) -> np.ndarray:
        if not ctx.adapter:
            return mask
        held = {int(r): fleet.views[r].held_adapters() for r in mask.nonzero()[0] if fleet.views[r].lora}
        if not held:
            return mask
        holders = Counter(a for adapters in held.values() for a in adapters)
        draining = {r for r in held if ctx.adapter in _drained(fleet.views[r], holders)}
        spare = {r for r in held if ctx.adapter not in held[r] and _has_free_slot(fleet.views[r])}
        keep = {r for r in held if ctx.adapter in held[r]} - draining
        if not keep and spare:
            # Where an adapter goes it stays: to the least loaded worker that can take it.
            lightest = min(fleet.outstanding[r] for r in spare)
            keep = {r for r in spare if fleet.outstanding[r] == lightest}
        elif self._replica_allowed(keep, held, holders, fleet):
            # A slot no adapter holds: not an idle one, whose adapter's next request would wait.
            keep |= {r for r in spare if len(held[r]) < fleet.views[r].lora.max_loras}
        if not keep:
            keep = set(held) - draining or set(held)
        kept = np.zeros_like(mask)
        kept[sorted(keep)] = True
        return kept

    def _replica_allowed(self, keep: set[int], held: Mapping[int, set[str]], holders: Counter[str],
                         fleet: Fleet) -> bool:
        """Whether every holder is past the load bound while empty slots outnumber the adapters
        that no worker holds."""
        capacity = _load_capacity(fleet, np.array(list(held)), self.epsilon)
        if any(fleet.outstanding[r] < capacity for r in keep):
            return False
        slots = {r: fleet.views[r].lora for r in held}  # LoRA is on in every row of ``held``
        empty = sum(max(lora.max_loras - len(held[r]), 0) for r, lora in slots.items() if lora)
        unheld = {name for lora in slots.values() if lora for name, _ in lora.adapters} - set(holders)
        return empty > len(unheld)


def _drained(view: WorkerView, holders: Counter[str]) -> set[str]:
    """The running adapters ``view`` drains for the adapters waiting for its slots (none while
    a slot is free for them): first those other workers hold too, then those it was sent
    fewest of lately (``holders``: how many workers hold each adapter)."""
    load = view.load
    if view.lora is None or load is None or not load.waiting_adapters:
        return set()
    running = list(set(load.running_adapters) - set(load.waiting_adapters))
    if len(running) < view.lora.max_loras:
        return set()
    running.sort(key=lambda a: (holders[a] <= 1, view.adapter_demand.get(a, 0.0), a))
    return set(running[: len(set(load.waiting_adapters))])


# -- scorers ---------------------------------------------------------------------------------


class LeastLoadScorer(Scorer):
    """1 for the fewest outstanding requests (running + waiting + assigned but not yet
    reported), 0 for the most, linear in between; all equal scores 1."""

    name = "load"

    def score(self, ctx: PickContext, fleet: Fleet, rows: np.ndarray) -> np.ndarray:
        loads = fleet.outstanding[rows]
        low, high = np.minimum.reduce(loads), np.maximum.reduce(loads)
        if high == low:
            return np.ones(len(rows))
        return (high - loads) / (high - low)


class PrefixAffinityScorer(Scorer):
    """1 for the worker that the prompt's first ``prefix_chars`` characters hash to, 0 for the
    others: requests sharing a prefix (a document, a few-shot preamble) meet on one worker and
    reuse its prefix cache. A chat's key also holds the first ``prefix_chars`` characters of its
    first user message, which every turn of a conversation repeats: conversations that open
    with the same system prompt (cached everywhere soon enough) spread over the workers, and
    each keeps its history on one. Rendezvous hashing keeps the preference stable when workers
    come and go, and when the preferred one is filtered out, the next in its order takes over.

    With ``homes=2`` a key has two homes, the first two workers in its order, and the one with
    fewer outstanding requests scores 1 (the first on a tie): the power of two choices, so keys
    spread over the workers nearly as evenly as by load alone, and a prefix still lives on at
    most two of them."""

    name = "prefix-home"

    def __init__(self, prefix_chars: int = 256, homes: int = 1) -> None:
        if homes not in (1, 2):
            raise ValueError(f"homes must be 1 or 2, got {homes}")
        self.prefix_chars = prefix_chars
        self.homes = homes

    def score(self, ctx: PickContext, fleet: Fleet, rows: np.ndarray) -> np.ndarray:
        if not ctx.prompt:
            return np.zeros(len(rows))
        key = ctx.prompt[: self.prefix_chars]
        if ctx.first_user:
            key += "\0" + ctx.first_user[: self.prefix_chars]
        seeds = fleet.seeds[rows]
        if self.homes == 1 or len(rows) == 1:
            return _rendezvous_home(key.encode(), seeds)
        first, second = (int(i) for i in np.argsort(_rendezvous_ranks(key.encode(), seeds))[-2:][::-1])
        loads = fleet.outstanding[rows]
        home = np.zeros(len(rows))
        home[second if loads[second] < loads[first] else first] = 1.0
        return home


class KvAwareScorer(Scorer):
    """The fraction of the prompt's blocks a worker holds in its prefix cache beyond what every
    candidate holds (leading blocks only: an engine reuses a prefix), from the router's KV
    index. Without a view (KV events off, no tokenizer) it falls back to ``fallback``, the
    text-hash affinity. A prompt shorter than a block, or a lone candidate, scores 0. When no
    candidate holds more of the prompt than the others (a prompt nobody has computed, a
    conversation's first turn past a shared system prompt, or a prefix whose holders are all
    over the load bound), ``unheld`` scores them, if given: with the prompt's two text-hash
    homes, the prompt is computed on one of the same two workers each time, not on whichever
    worker load points to, so a prefix spills to one more worker instead of seeding every cache
    (the span's ``kv`` score is then the home's: 1 for the chosen home). With ``full``, a worker
    whose KV cache is at least that full while its engine queues requests (it holds too many
    other prefixes to run more) scores its blocks times the share of its outstanding requests it
    runs: a request it would queue goes where it starts now."""

    name = "kv"

    def __init__(self, fallback: Scorer | None = None, unheld: Scorer | None = None, full: float = 0.0) -> None:
        self.fallback = fallback or PrefixAffinityScorer()
        self.unheld = unheld
        self.full = full

    def score(self, ctx: PickContext, fleet: Fleet, rows: np.ndarray) -> np.ndarray:
        if ctx.cached_blocks is None:
            return self.fallback.score(ctx, fleet, rows)
        if not ctx.block_hashes or len(rows) == 1:
            return np.zeros(len(rows))  # no full block to reuse, or no choice (the prompt was not worked out)
        held = _column(ctx.cached_blocks, fleet)[rows]
        # Blocks every candidate holds (a system prompt cached everywhere) tell them apart no
        # better than none: only what a worker holds beyond the others counts.
        beyond = (held - held.min()) / len(ctx.block_hashes)
        if self.unheld is not None and not beyond.any():
            return self.unheld.score(ctx, fleet, rows)
        if self.full:
            # A worker whose KV cache is full and whose engine queues requests (too many other
            # prefixes) runs a request only after its queue: its blocks count for the share of
            # its requests it runs.
            waiting, usage = fleet.waiting[rows], fleet.kv_usage[rows]
            pressed = (usage >= self.full) & (waiting > 0)
            if pressed.any():
                beyond = np.where(pressed, beyond * (1.0 - waiting / np.maximum(fleet.outstanding[rows], 1)), beyond)
        return beyond


class AdapterSlotScorer(Scorer):
    """For a request on a LoRA adapter, where it can start soonest: 1 for a worker whose adapter
    slots hold the adapter (``WorkerView.held_adapters``: its last report, or a pick on it the
    worker has not reported yet, so a burst of one adapter's requests meets on the worker the
    first went to), ``free`` for one with a slot it can load the adapter into at once (free, or
    holding an adapter none of its requests runs), 0 for one whose slots all run other adapters
    (the request waits until one of them is idle). A request on the base model scores 0
    everywhere: no worker is better for it."""

    name = "adapter"

    def __init__(self, free: float = 0.5) -> None:
        self.free = free

    def score(self, ctx: PickContext, fleet: Fleet, rows: np.ndarray) -> np.ndarray:
        scores = np.zeros(len(rows))
        if not ctx.adapter:
            return scores
        for i, row in enumerate(rows):
            view = fleet.views[row]
            if ctx.adapter in view.held_adapters():
                scores[i] = 1.0
            elif _has_free_slot(view):
                scores[i] = self.free
        return scores


def _has_free_slot(view: WorkerView) -> bool:
    return view.lora is not None and len(view.busy_slots()) < view.lora.max_loras


def _column(blocks: Mapping[str, int], fleet: Fleet) -> np.ndarray:
    """``blocks`` (by worker address) as a column over ``fleet``'s rows (0 for the others)."""
    if isinstance(blocks, HeldBlocks) and blocks.rows is fleet.rows:
        return blocks.counts  # already one (the router's KV index made it for this fleet)
    column = np.zeros(len(fleet), dtype=np.int64)
    for address, n in blocks.items():
        row = fleet.rows.get(address)
        if row is not None:
            column[row] = n
    return column


class SessionAffinityScorer(Scorer):
    """1 for the worker the request's session key hashes to (rendezvous), 0 for the others; 0
    for all when the request has no key. A conversation's turns meet its cached history."""

    name = "session"

    def score(self, ctx: PickContext, fleet: Fleet, rows: np.ndarray) -> np.ndarray:
        if not ctx.session_key:
            return np.zeros(len(rows))
        return _rendezvous_home(ctx.session_key.encode(), fleet.seeds[rows])


def _rendezvous_ranks(key: bytes, seeds: np.ndarray) -> np.ndarray:
    """Each worker's rank for ``key`` (the highest is its home): splitmix64's finalizer over the
    key's hash xor the worker's seed (``rendezvous_seed``)."""
    z = np.uint64(int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")) ^ seeds
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return z


def _rendezvous_home(key: bytes, seeds: np.ndarray) -> np.ndarray:
    """1.0 for the worker whose seed ranks highest for ``key``, 0.0 for the others."""
    home = np.zeros(len(seeds))
    home[int(_rendezvous_ranks(key, seeds).argmax())] = 1.0
    return home


# -- pickers ---------------------------------------------------------------------------------


class MaxScorePicker(Picker):
    """The highest score; ties broken at random so equal workers share the traffic."""

    def pick(self, scores: np.ndarray, rng: random.Random) -> int:
        best = (scores >= np.maximum.reduce(scores) - 1e-9).nonzero()[0]
        return int(best[0]) if len(best) == 1 else int(rng.choice(best))


class PowerOfTwoPicker(Picker):
    """Power of two choices: the better of two workers sampled at random. Nearly as balanced as
    the best score, and many routers picking at once do not all pile onto the same worker."""

    def pick(self, scores: np.ndarray, rng: random.Random) -> int:
        if len(scores) == 1:
            return 0
        two = rng.sample(range(len(scores)), 2)
        return two[MaxScorePicker().pick(scores[two], rng)]


class RoundRobinPicker(Picker):
    """Each candidate in turn, whatever the scores: the baseline every peer router offers."""

    def __init__(self) -> None:
        self._next = itertools.count()

    def pick(self, scores: np.ndarray, rng: random.Random) -> int:
        return next(self._next) % len(scores)


class RandomPicker(Picker):
    """Uniformly at random, whatever the scores (a baseline for benchmarks)."""

    def pick(self, scores: np.ndarray, rng: random.Random) -> int:
        return rng.randrange(len(scores))


# -- policies --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """Filters, then weighted scorers, then the picker."""

    name: str
    filters: Sequence[Filter]
    scorers: Sequence[tuple[Scorer, float]]
    picker: Picker
    # The prefix view its scorers read (PickContext.cached_blocks): "kv" from the workers' KV
    # events, "approx" from the router's own record of what it sent where, "" none.
    prefix_view: str = ""

    def pick(self, ctx: PickContext, workers: Fleet | Sequence[WorkerView], rng: random.Random) -> Choice:
        """Chooses a worker; raises NoWorker when a filter leaves none."""
        fleet = workers if isinstance(workers, Fleet) else Fleet.of(workers)
        if not len(fleet):
            raise NoWorker("no healthy worker: the router knows no workers")
        mask = np.ones(len(fleet), dtype=bool)
        for f in self.filters:
            mask = f.keep(ctx, fleet, mask)
            if not np.count_nonzero(mask):
                raise NoWorker(f.why_empty(ctx))
        rows = mask.nonzero()[0]
        totals = np.zeros(len(rows))
        parts = []
        for scorer, weight in self.scorers:
            if weight:  # a knob at 0 switches its scorer off
                score = scorer.score(ctx, fleet, rows)
                totals += weight * score
                parts.append((scorer.name, score))
        at = self.picker.pick(totals, rng)
        return Choice(fleet.views[int(rows[at])], float(totals[at]), len(rows),
                      {name: float(score[at]) for name, score in parts})


def _eligible(stale_after_s: float) -> list[Filter]:
    return [ModelFilter(), AdapterFilter(), HealthyFilter(stale_after_s), NotDrainingFilter(), ExcludeFilter()]


@dataclass(frozen=True)
class Tuning:
    """The knobs of the policies (RouterConfig): when a report is stale, how far above the
    average load an affine worker may go, and how much load weighs against cached blocks. The
    defaults are the command line's (RoutingConfig), stated once."""

    stale_after_s: float = RoutingConfig.stale_after_s
    load_bound: float = RoutingConfig.load_bound
    kv_load_weight: float = RoutingConfig.kv_load_weight
    kv_home_weight: float = RoutingConfig.kv_home_weight
    kv_full_usage: float = RoutingConfig.kv_full_usage
    kv_adapter_weight: float = RoutingConfig.kv_adapter_weight

    def __post_init__(self) -> None:
        if self.load_bound < 1.0:
            raise ValueError(f"load_bound must be at least 1.0 (the average load), got {self.load_bound}")
        if self.kv_load_weight < 0:
            raise ValueError(f"kv_load_weight must be at least 0, got {self.kv_load_weight}")
        if self.kv_home_weight < 0:
            raise ValueError(f"kv_home_weight must be at least 0, got {self.kv_home_weight}")
        if self.kv_adapter_weight < 0:
            raise ValueError(f"kv_adapter_weight must be at least 0, got {self.kv_adapter_weight}")
        if not 0.0 <= self.kv_full_usage <= 1.0:
            raise ValueError(f"kv_full_usage must be between 0 (off) and 1, got {self.kv_full_usage}")


def _bounded(t: Tuning, *placement: Filter) -> list[Filter]:
    return [*_eligible(t.stale_after_s), *placement, BoundedLoadFilter(epsilon=t.load_bound - 1.0)]


# The one place policies are named.
POLICIES: dict[str, Callable[[Tuning], Policy]] = {
    "round-robin": lambda t: Policy("round-robin", _eligible(t.stale_after_s), [], RoundRobinPicker()),
    "random": lambda t: Policy("random", _eligible(t.stale_after_s), [], RandomPicker()),
    "least-load": lambda t: Policy(
        "least-load", _eligible(t.stale_after_s), [(LeastLoadScorer(), 1.0)], MaxScorePicker()
    ),
    "power-of-two": lambda t: Policy(
        "power-of-two", _eligible(t.stale_after_s), [(LeastLoadScorer(), 1.0)], PowerOfTwoPicker()
    ),
    # Affinity decides among the workers under the load bound; load only breaks the tie when
    # the request has no prompt.
    "prefix-affinity": lambda t: Policy(
        "prefix-affinity", _bounded(t),
        [(PrefixAffinityScorer(prefix_chars=256), 1.0), (LeastLoadScorer(), 0.1)], MaxScorePicker(),
    ),
    # The blocks each engine really holds (its KV events), weighed against load, among the
    # workers under the load bound so one hot prefix cannot pile onto one engine.
    # A prompt no engine holds goes to its text hash's home (kv_home_weight), so a prefix
    # evicted everywhere is computed again where it was, not wherever load points. A holder whose
    # KV cache is kv_full_usage full while it queues requests gets credit for the share it runs.
    # A request on a LoRA adapter prefers a worker whose slots hold it, then one with a free slot
    # (kv_adapter_weight): loading an adapter stalls a step, and a worker whose slots run other
    # adapters queues it.
    "kv-aware": lambda t: Policy(
        "kv-aware", _bounded(t, AdapterPlacementFilter(epsilon=t.load_bound - 1.0)),
        [(KvAwareScorer(unheld=PrefixAffinityScorer(prefix_chars=256, homes=2), full=t.kv_full_usage), 1.0),
         (LeastLoadScorer(), t.kv_load_weight), (PrefixAffinityScorer(prefix_chars=256), t.kv_home_weight),
         (AdapterSlotScorer(), t.kv_adapter_weight)],
        MaxScorePicker(), prefix_view="kv",
    ),
    # The same over the router's own record of the prompts it sent to each worker (SGLang's
    # approximate tree), for when engines do not report KV events.
    "approx-prefix": lambda t: Policy(
        "approx-prefix", _bounded(t), [(KvAwareScorer(), 1.0), (LeastLoadScorer(), t.kv_load_weight)],
        MaxScorePicker(), prefix_view="approx",
    ),
    "session-affinity": lambda t: Policy(
        "session-affinity", _bounded(t), [(SessionAffinityScorer(), 1.0), (LeastLoadScorer(), 0.1)],
        MaxScorePicker(),
    ),
}

assert tuple(POLICIES) == ROUTING_POLICIES, "services.config.ROUTING_POLICIES names these policies"


def build_policy(name: str, stale_after_s: float = RoutingConfig.stale_after_s, **knobs: float) -> Policy:
    """The named policy, with ``knobs`` (``Tuning``'s fields) over ``Tuning``'s defaults; raises
    ValueError naming the valid choices or the bad knob."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown routing policy {name!r}; choose one of: {', '.join(POLICIES)}") from None
    return factory(Tuning(stale_after_s, **knobs))
