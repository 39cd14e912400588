"""Block hashes the worker and the router compute alike, in any process."""

from __future__ import annotations

import os
import subprocess
import sys

from meshserve.services.prompts import block_hashes, cacheable_blocks, sim_tokenize


def test_chain_hashes_depend_on_every_earlier_block() -> None:
    a = block_hashes(list(range(64)), 16)
    b = block_hashes([99, *range(1, 64)], 16)
    assert len(a) == 4 and len(set(a)) == 4
    assert all(x != y for x, y in zip(a, b))  # one token changed in block 0 changes every hash
    assert block_hashes(list(range(70)), 16) == a  # the partial block is not hashed
    assert block_hashes(list(range(64)), 16, limit=2) == a[:2]
    assert all(0 <= h < 2**64 for h in a)


def test_hashes_are_the_same_in_another_process_whatever_its_hash_seed() -> None:
    ids = sim_tokenize("the same system prompt in two processes " * 10)
    code = ("from meshserve.services.prompts import block_hashes, sim_tokenize; "
            "print(block_hashes(sim_tokenize('the same system prompt in two processes ' * 10), 16))")
    for seed in ("1", "12345"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={**os.environ, "PYTHONHASHSEED": seed})
        assert out.stdout.strip() == str(block_hashes(ids, 16))


def test_an_engine_reuses_full_blocks_and_computes_at_least_one_token() -> None:
    assert [cacheable_blocks(n, 16) for n in (0, 1, 16, 17, 32, 33)] == [0, 0, 0, 1, 1, 2]
