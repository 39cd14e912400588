"""A prompt's block-hash chain as the workers' engine computes it: the tokenizer each worker
reports (``WorkerInfo.tokenizer``) and its block size, through ``services.prompts``."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from services.prompts import PromptTokenizer, block_hashes, cacheable_blocks, load_tokenizer

log = logging.getLogger(__name__)


class PromptBlocks:
    """Hashes prompts once the workers said how (all workers of a router serve one model)."""

    def __init__(self) -> None:
        self.tokenizer_name = ""
        self.block_size = 0
        self._tokenize: PromptTokenizer | None = None
        self._failed: set[str] = set()

    @property
    def ready(self) -> bool:
        return self._tokenize is not None

    def configure(self, tokenizer: str, block_size: int) -> None:
        """Takes a worker's tokenizer and block size; loads the tokenizer on first sight. One that
        cannot be loaded here (a path only the workers see) leaves the router without a prefix
        view: its prefix policies fall back to the text hash, and the log says why, once."""
        if not tokenizer or block_size <= 0 or tokenizer in self._failed:
            return
        if tokenizer == self.tokenizer_name and block_size == self.block_size:
            return
        if self._tokenize is not None:
            log.warning("workers disagree on their tokenizer or block size (%s/%d vs %s/%d); "
                        "keeping the first", tokenizer, block_size, self.tokenizer_name, self.block_size)
            return
        try:
            self._tokenize = load_tokenizer(tokenizer)
        except Exception as e:  # noqa: BLE001 - any loading failure means no prefix view
            self._failed.add(tokenizer)
            log.warning("cannot load the workers' tokenizer %r (%s); prefix routing falls back to "
                        "the prompt's text hash", tokenizer, e)
            return
        self.tokenizer_name, self.block_size = tokenizer, block_size
        log.info("prefix view: tokenizer %s, blocks of %d tokens", tokenizer, block_size)

    def chain(self, prompt: str, messages: Sequence[Mapping[str, str]] | None) -> tuple[int, ...]:
        """The hashes of the prompt's blocks an engine could take from its cache ((): not ready)."""
        if self._tokenize is None:
            return ()
        ids = self._tokenize(prompt, messages)
        return tuple(block_hashes(ids, self.block_size, limit=cacheable_blocks(len(ids), self.block_size)))
