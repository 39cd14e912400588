"""The router's KV index: which worker holds how many leading blocks of a prompt's chain."""

from __future__ import annotations

import pytest

from meshserve.router.kv_index import KvIndex


def index(**held: list[int]) -> KvIndex:
    kv = KvIndex()
    for worker, hashes in held.items():
        kv.stored(worker, hashes)
    return kv


@pytest.mark.parametrize(
    ("held", "chain", "expected"),
    [
        ({"a": [1, 2, 3], "b": [1, 2]}, [1, 2, 3, 4], {"a": 3, "b": 2}),
        # A block held without its predecessors is of no use: an engine reuses a prefix only.
        ({"a": [2, 3], "b": [1]}, [1, 2, 3], {"b": 1}),
        ({"a": [1, 3]}, [1, 2, 3], {"a": 1}),
        ({"a": [5]}, [1, 2], {}),
        ({"a": [1]}, [], {}),
        ({"a": [1, 2], "b": [1, 2], "c": [1, 2, 3]}, [1, 2, 3], {"a": 2, "b": 2, "c": 3}),
    ],
)
def test_match_counts_leading_blocks(held: dict[str, list[int]], chain: list[int], expected: dict[str, int]) -> None:
    assert index(**held).match(chain) == expected


@pytest.mark.parametrize(
    ("held", "chain", "expected"),
    [
        ({"a": [1, 2, 3], "b": [1, 2]}, [1, 2, 3, 4], {"a": 3, "b": 2}),
        ({"a": [2, 3], "b": [1]}, [1, 2, 3], {"b": 1}),
        ({"a": [5]}, [1, 2], {}),
        ({"a": [1, 2], "b": [1, 2], "c": [1, 2, 3]}, [1, 2, 3], {"a": 2, "b": 2, "c": 3}),
    ],
)
def test_held_is_match_as_a_column_over_the_rows(
    held: dict[str, list[int]], chain: list[int], expected: dict[str, int]
) -> None:
    kv = index(**held)
    rows = {"z": 0, "c": 1, "b": 2, "a": 3}  # a worker the index never heard of, the others shuffled
    column = kv.held(chain, rows)
    assert dict(column) == expected
    assert column.counts.tolist() == [expected.get(w, 0) for w in rows]


def test_held_follows_workers_that_come_and_go() -> None:
    kv = index(a=[1, 2])
    rows = {"a": 0, "b": 1, "c": 2}
    assert dict(kv.held([1, 2], rows)) == {"a": 2}
    kv.stored("b", [1])  # a new worker (slot) after the index answered for these rows
    assert dict(kv.held([1, 2], rows)) == {"a": 2, "b": 1}
    kv.drop("a")
    kv.stored("c", [1, 2])  # takes the slot a gave up
    assert dict(kv.held([1, 2], rows)) == {"b": 1, "c": 2}
    assert dict(kv.held([1, 2], {"c": 0})) == {"c": 2}  # rows without b: b is left out


def test_removed_and_dropped_blocks_no_longer_match() -> None:
    kv = index(a=[1, 2, 3], b=[1, 2, 3])
    kv.removed("a", [2])
    assert kv.match([1, 2, 3]) == {"a": 1, "b": 3}
    kv.drop("b")
    assert kv.match([1, 2, 3]) == {"a": 1}
    assert kv.workers() == ["a"]
    assert len(kv) == 2  # blocks 1 and 3, both a's


def test_removing_a_block_never_stored_is_counted_not_trusted() -> None:
    kv = index(a=[1])
    kv.removed("a", [99, 1])
    kv.removed("nobody", [1])
    assert kv.ignored == 1
    assert kv.match([1]) == {}


def test_reset_replaces_what_a_worker_held() -> None:
    kv = index(a=[1, 2], b=[1])
    kv.reset("a", [7])
    assert kv.match([1, 2]) == {"b": 1}
    assert kv.match([7]) == {"a": 1}


def test_a_freed_slot_is_reused_without_mixing_workers() -> None:
    kv = index(a=[1], b=[1])
    kv.drop("a")
    kv.stored("c", [2])
    assert kv.match([1]) == {"b": 1}
    assert kv.match([2]) == {"c": 1}


def test_evict_oldest_keeps_the_most_recently_stored() -> None:
    kv = index(a=[1, 2, 3])
    kv.stored("a", [1])  # used again: now the newest
    kv.evict_oldest("a", keep=2)
    assert kv.num_blocks("a") == 2
    assert kv.match([1]) == {"a": 1}
    assert kv.match([2]) == {}


def test_many_workers() -> None:
    kv = KvIndex()
    for i in range(300):
        kv.stored(f"w{i}", list(range(i % 7 + 1)))
    counts = kv.match(list(range(10)))
    assert len(counts) == 300
    assert all(n == int(w[1:]) % 7 + 1 for w, n in counts.items())
