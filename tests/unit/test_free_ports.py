"""The tests' port allocator: blocks and single ports never share a port, also after its count
wraps (CI: a router was handed worker-1's port, and every two-worker mesh after it refused to start)."""

from __future__ import annotations

import itertools

import pytest

from tests import conftest


def test_blocks_and_single_ports_never_overlap_across_the_wrap(monkeypatch: pytest.MonkeyPatch) -> None:
    span = conftest._HIGH - conftest._LOW
    monkeypatch.setattr(conftest, "_handed", itertools.count(span - 7))  # a few counts before the wrap
    monkeypatch.setattr(conftest, "_bindable", lambda port: True)  # the arithmetic, not the machine
    handed: list[int] = []
    for _ in range(20):  # as mesh_spec does: redis, a block of 2 workers, then the router, ...
        handed.append(conftest.free_port())
        first = conftest.free_port_block(2)
        handed += [first, first + 1]
        handed.append(conftest.free_port())
    assert len(handed) == len(set(handed)), sorted(p for p in handed if handed.count(p) > 1)
    assert all(conftest._LOW <= p < conftest._HIGH for p in handed)
