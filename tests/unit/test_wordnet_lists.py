"""The semantic cache's word lists (cache_service/data/) are what WordNet gives, as
`python -m meshserve.commands.wordnet` writes them, and read as the guards expect."""

from __future__ import annotations

from meshserve.cache_service import guards
from meshserve.commands import wordnet


def test_the_committed_lists_are_what_wordnet_gives() -> None:
    assert wordnet.WORDNET.is_dir(), f"{wordnet.WORDNET} is missing: run make install (Debian's wordnet-base)"
    assert wordnet.main(["--check"]) == 0


def test_the_lists_hold_opposites_prefix_swaps_and_synonyms() -> None:
    opposites, swaps = guards._antonyms()
    assert "descending" in opposites["ascending"] and "doubly" in opposites["singly"]
    assert ("", "un") in swaps and ("un", "") in swaps and ("hyper", "hypo") in swaps
    assert "stop" in guards._synonyms("quit") and "hard" in guards._synonyms("difficult")
    # Marked words (a unit, a season, an age) have none: there a near-synonym is a near miss.
    assert not guards._synonyms("minutes") and not guards._synonyms("fall") and not guards._synonyms("kid")
