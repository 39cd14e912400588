"""A prompt's block-hash chain as the workers' engine computes it: the tokenizer each worker
reports (``WorkerInfo.tokenizer``) and its block size, through ``services.prompts``.

Tokenizing is most of a pick's cost on long prompts (a 1,000-word prompt: ~0.4 ms with the sim's
tokenizer, ~1.6-2.1 ms with a Hugging Face one), and the prompts prefix routing is for share long
beginnings. So ``TokenReuse`` keeps the tokens of recent texts and, for a text that begins like one
of them, takes that beginning's tokens and tokenizes only the rest, from a word boundary a few
tokens before the texts part; those few tokens must come out as they did in the earlier text, or
the whole text is tokenized. The ids are the same either way (tests/unit/test_prefix_reuse.py).
"""

from __future__ import annotations

import asyncio
import bisect
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import prometheus_client

from meshserve.services.offload import Offload
from meshserve.services.prompts import (
    ROOT_HASH,
    SIM_TOKENIZER,
    Encoder,
    block_hashes,
    cacheable_blocks,
    chain_root,
    load_encoder,
)

log = logging.getLogger(__name__)

TOKENIZED = prometheus_client.Counter(
    "meshserve_router_prompt_tokenizations_total",
    "Prompts tokenized for the prefix view, by way: whole, reused (the beginning's tokens taken "
    "from an earlier text that began the same), repeated (a text seen whole before), mismatch "
    "(the check failed: tokenized whole)",
    ["way"],
)
_WHOLE, _REUSED, _REPEATED, _MISMATCH = (TOKENIZED.labels(way=way)
                                         for way in ("whole", "reused", "repeated", "mismatch"))

CHUNK_CHARS = 256         # texts are matched with earlier ones this many characters at a time
MIN_SHARED_CHARS = 512    # a shorter shared beginning is not worth the bookkeeping
CHECK_TOKENS = 8          # reused tokens re-read before the split, which must come out the same
WORD_SEARCH_TOKENS = 64   # how far back from the shared end to look for a word boundary
KEEP_TEXTS = 128          # texts remembered (the least recently used go first)
KEEP_TOKENS = 1 << 18     # and their tokens in all (~20 MB of lists; long contexts go first)


@dataclass
class _Seen:
    text: str
    add_special_tokens: bool
    ids: list[int]
    ends: list[int]         # where each token ends in text
    hashes: list[int]       # the chain hashes of ids' full blocks
    chunks: list[int]       # the keys of text's full chunks


class TokenReuse:
    """Token ids and block hashes of texts, reusing the tokens of a recent text that began the same."""

    def __init__(self, encoder: Encoder, block_size: int, keep: int = KEEP_TEXTS,
                 keep_tokens: int = KEEP_TOKENS) -> None:
        self.encoder = encoder
        self._block_size = block_size
        self._keep = keep
        self._keep_tokens = keep_tokens
        self._tokens = 0  # held by the remembered texts
        self._seen: OrderedDict[int, _Seen] = OrderedDict()   # by id(), least recently used first
        self._by_chunk: dict[int, _Seen] = {}                 # chunk key -> latest text holding it
        # Reuse needs the special tokens, if any, in front: the tail of a text is tokenized without.
        ids, _ = encoder.encode("a", True)
        bare, _ = encoder.encode("a", False)
        self._special_tail_ok = ids[len(ids) - len(bare):] == bare

    def tokens(self, text: str, add_special_tokens: bool) -> tuple[int, list[int]]:
        """How many tokens ``text`` has, and the chain hashes of its full blocks. A text shorter
        than MIN_SHARED_CHARS can share too little with any other: tokenized whole, not kept."""
        keys = _chunk_keys(text) if len(text) >= MIN_SHARED_CHARS else []
        earlier = self._earlier(add_special_tokens, keys)
        seen = self._reuse(earlier, text, add_special_tokens, keys) if earlier is not None else None
        if seen is None:
            ids, ends = self.encoder.encode(text, add_special_tokens)
            hashes = block_hashes(ids, self._block_size)
            _WHOLE.inc()
            if ends is None or not keys:  # nothing to reuse it for (or no offsets to reuse it by)
                return len(ids), hashes
            seen = _Seen(text, add_special_tokens, ids, ends, hashes, keys)
        self._remember(seen)
        return len(seen.ids), seen.hashes

    def _earlier(self, add_special_tokens: bool, keys: list[int]) -> _Seen | None:
        """The remembered text sharing the longest run of leading chunks with ``text``."""
        best = None
        for key in keys:
            seen = self._by_chunk.get(key)
            if seen is None or seen.add_special_tokens != add_special_tokens:
                break
            best = seen
        return best

    def _reuse(self, earlier: _Seen, text: str, add_special_tokens: bool, keys: list[int]) -> _Seen | None:
        if earlier.text == text:
            _REPEATED.inc()
            return earlier
        if add_special_tokens and not self._special_tail_ok:
            return None
        shared = _shared_length(earlier.text, text)
        if shared < MIN_SHARED_CHARS:
            return None  # a chunk-key collision, or too little in common
        # The earlier text's tokens that end before the texts part, less a word's worth of margin.
        end = bisect.bisect_right(earlier.ends, shared - 1)
        split = end - CHECK_TOKENS
        stop = max(1, end - WORD_SEARCH_TOKENS)
        while split >= stop and not earlier.text[earlier.ends[split - 1]].isspace():
            split -= 1
        if split < stop:
            return None
        start = earlier.ends[split - 1]
        rest, rest_ends = self.encoder.encode(text[start:], False)
        if rest_ends is None or rest[: end - split] != earlier.ids[split:end]:
            _MISMATCH.inc()
            log.debug("token reuse check failed at character %d; tokenizing the whole text", start)
            return None
        ids = earlier.ids[:split] + rest
        ends = earlier.ends[:split] + [start + e for e in rest_ends]
        kept = split // self._block_size
        parent = earlier.hashes[kept - 1] if kept else ROOT_HASH
        hashes = earlier.hashes[:kept] + block_hashes(ids, self._block_size, start=kept, parent=parent)
        _REUSED.inc()
        return _Seen(text, add_special_tokens, ids, ends, hashes, keys)

    def _remember(self, seen: _Seen) -> None:
        if id(seen) in self._seen:
            self._seen.move_to_end(id(seen))
        else:
            self._seen[id(seen)] = seen
            self._tokens += len(seen.ids)
        for key in seen.chunks:
            self._by_chunk[key] = seen
        while len(self._seen) > self._keep or self._tokens > self._keep_tokens:
            _, old = self._seen.popitem(last=False)
            self._tokens -= len(old.ids)
            for key in old.chunks:
                if self._by_chunk.get(key) is old:
                    del self._by_chunk[key]


def _chunk_keys(text: str) -> list[int]:
    """A key per full chunk of ``text``, chained: equal keys, equal beginnings (but for collisions,
    which the caller's comparison of the texts catches)."""
    keys, key = [], 0
    for i in range(CHUNK_CHARS, len(text) + 1, CHUNK_CHARS):
        key = hash((key, text[i - CHUNK_CHARS : i]))
        keys.append(key)
    return keys


def _shared_length(a: str, b: str) -> int:
    """The length of the longest common beginning of ``a`` and ``b`` (a binary search over slices)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PromptHasher:
    """Hashes prompts as the engines of one tokenizer and block size do.

    A large prompt is hashed off the event loop (``chain_off_loop``, services.offload), so that
    picks for other requests go on meanwhile. The tokens kept for reuse are the thread's and the
    loop's in turn: a prompt hashed on the loop while the thread holds them is tokenized whole."""

    def __init__(self, tokenizer: str, block_size: int, encoder: Encoder, offload: Offload) -> None:
        self.tokenizer_name = tokenizer
        self.block_size = block_size
        self.encoder = encoder
        self._reuse = TokenReuse(encoder, block_size)
        self._offload = offload  # shared by every hasher of the router: one thread
        self._reuse_lock = threading.Lock()  # TokenReuse's memory: the loop's or the thread's

    def chain(self, prompt: str, messages: Sequence[Mapping[str, str]] | None, adapter: str = ""
              ) -> tuple[int, ...]:
        """The hashes of the prompt's blocks an engine could take from its cache, on the LoRA
        ``adapter``'s own chain ("": the base model's), on the event loop: never waits for the
        thread."""
        return self._chain(prompt, messages, False, adapter)

    async def chain_off_loop(self, prompt: str, messages: Sequence[Mapping[str, str]] | None,
                             adapter: str = "") -> tuple[int, ...]:
        """``chain``, in the thread (for a large prompt: ``PromptBlocks.large``)."""
        return await self._offload.in_thread(self._chain, prompt, messages, True, adapter)

    def _chain(self, prompt: str, messages: Sequence[Mapping[str, str]] | None, wait: bool, adapter: str = ""
               ) -> tuple[int, ...]:
        text, special = self.encoder.render(prompt, messages)
        if adapter:
            # An adapter's blocks chain from its own root, as vLLM hashes the adapter into them (the
            # kept tokens' hashes are the base model's chain: the tokens are encoded afresh).
            ids, _ = self.encoder.encode(text, special)
            n, hashes = len(ids), block_hashes(ids, self.block_size, parent=chain_root(adapter))
        elif self._reuse_lock.acquire(blocking=wait):
            try:
                n, hashes = self._reuse.tokens(text, special)
            finally:
                self._reuse_lock.release()
        else:  # the thread is hashing a large prompt: this one whole, without the kept tokens
            ids, _ = self.encoder.encode(text, special)
            n, hashes = len(ids), block_hashes(ids, self.block_size)
        return tuple(hashes[: cacheable_blocks(n, self.block_size)])


class PromptBlocks:
    """The router's prompt hashers: one per tokenizer and block size its workers report, and the
    one each base model's workers use (a mesh may serve several models, each with its own
    tokenizer), so a request is hashed as the engines of the model it asks for hash it."""

    def __init__(self) -> None:
        self._hashers: dict[tuple[str, int], PromptHasher] = {}
        self._models: dict[str, tuple[str, int]] = {}  # base model -> its workers' tokenizer and block size
        self._failed: set[str] = set()
        self._loading = asyncio.Lock()  # one tokenizer load at a time, off the event loop
        self._offload = Offload("router-tokenizer")

    @property
    def ready(self) -> bool:
        """Whether every tokenizer the workers reported is loaded (or could not be), one at least."""
        return bool(self._hashers) and all(
            key in self._hashers or key[0] in self._failed for key in self._models.values())

    def hasher(self, model: str) -> PromptHasher | None:
        """The hasher of the base ``model``'s workers (None: not loaded, or it cannot be: prefix
        policies then use the prompt's text hash). A request naming no model (any worker) gets
        the hasher if every worker reported the same, else none."""
        key = self._models.get(model)
        if key is None and not model and len(keys := set(self._models.values())) == 1:
            (key,) = keys
        return self._hashers.get(key) if key is not None else None

    async def configure(self, tokenizer: str, block_size: int, model: str = "") -> None:
        """Takes a worker's tokenizer and block size for its base ``model``; loads the tokenizer on
        first sight (a Hugging Face one in a thread: seconds, during which picks for the model use
        the text hash and load). One that cannot be loaded here (a path only the workers see)
        leaves the model without a prefix view: its prefix policies fall back to the text hash,
        and the log says why, once."""
        if not tokenizer or block_size <= 0:
            return
        key = self._models.setdefault(model, (tokenizer, block_size))
        if key != (tokenizer, block_size):
            log.warning("workers of model %r disagree on their tokenizer or block size (%s/%d vs %s/%d); "
                        "keeping the first", model, tokenizer, block_size, *key)
            return
        async with self._loading:
            if tokenizer in self._failed or key in self._hashers:
                return
            await self._load(tokenizer, block_size)

    async def _load(self, tokenizer: str, block_size: int) -> None:
        encoder = next((h.encoder for h in self._hashers.values() if h.tokenizer_name == tokenizer), None)
        try:
            # The sim's stand-in at once; a Hugging Face tokenizer off the loop.
            if encoder is None:
                encoder = (load_encoder(tokenizer) if tokenizer == SIM_TOKENIZER
                           else await asyncio.to_thread(load_encoder, tokenizer))
            hasher = PromptHasher(tokenizer, block_size, encoder, self._offload)
        except Exception as e:  # noqa: BLE001 - any loading failure means no prefix view
            self._failed.add(tokenizer)
            log.warning("cannot load the workers' tokenizer %r (%s); prefix routing falls back to "
                        "the prompt's text hash", tokenizer, e)
            return
        self._hashers[tokenizer, block_size] = hasher
        log.info("prefix view: tokenizer %s, blocks of %d tokens", tokenizer, block_size)

    def large(self, chars: int) -> bool:
        """Whether a prompt of about ``chars`` characters is hashed off the loop."""
        return self._offload.large(chars)

    def close(self) -> None:
        self._offload.close()
