"""Whether a stored prompt's answer answers a new prompt: the semantic cache's matching rule.

With ``--semantic-judge`` the learned judge decides (``cache_service.judge``): the certain guards
refuse, then a logistic regression over the cosine and how the prompts' words differ. By default,
two checks, cheapest first: no guard of ``cache_service.guards`` tells the prompts apart, and
their embeddings' cosine reaches the threshold for how their content words differ
(``guards.difference``): the lowest when they are the same words (another order, other function
words, typos), a higher one when one prompt adds words, the highest when each has a word the
other lacks, which is how most near misses look ("boil" / "poach an egg", "leading" / "trailing
zeros"). The thresholds are chosen on the tuning half of ``tests/data/semantic_eval_*.jsonl``.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshserve.cache_service import guards
from meshserve.cache_service.judge import Judge, shipped
from meshserve.services.config import CacheConfig

SIMILARITY = "similarity"  # the refusal of a pair below its threshold


@dataclass(frozen=True)
class Matcher:
    same: float      # cosine a hit needs when the content words are the same
    added: float     # ... when one prompt has content words the other lacks
    swapped: float   # ... when each has content words the other lacks
    judge: Judge | None = None  # when set, it decides instead of the three thresholds

    @property
    def threshold(self) -> float:
        """The lowest similarity any hit needs: candidates below it are not looked at."""
        return self.judge.floor if self.judge else min(self.same, self.added, self.swapped)

    def warm_up(self) -> None:
        """Reads the guards' word lists (WordNet's opposites and synonyms: ~0.2 s) now, not on
        the first lookup's path, where it would stall every lookup behind it."""
        self.refusal("How do I warm up?", "how to warm up", 1.0)

    def refusal(self, query: str, stored: str, similarity: float) -> str:
        """"" when ``stored``'s answer answers ``query``; else what refuses it: SIMILARITY or the
        name of a guard."""
        if similarity < self.threshold:
            return SIMILARITY
        if self.judge:
            return self.judge.refusal(query, stored, similarity)
        guard = guards.differs(query, stored)
        if guard:
            return guard
        needed = {guards.SAME: self.same, guards.ADDED: self.added, guards.SWAPPED: self.swapped}
        return "" if similarity >= needed[guards.difference(query, stored)] else SIMILARITY


def matcher_for(cfg: CacheConfig) -> Matcher:
    """The rule at the cache service's settings."""
    return Matcher(cfg.semantic_threshold, cfg.semantic_threshold_added, cfg.semantic_threshold_swapped,
                   shipped() if cfg.semantic_judge else None)


def default_matcher() -> Matcher:
    """The rule at the cache service's default settings."""
    return Matcher(CacheConfig.semantic_threshold, CacheConfig.semantic_threshold_added,
                   CacheConfig.semantic_threshold_swapped, shipped() if CacheConfig.semantic_judge else None)
