"""A prompt as an engine sees it: token ids (chat messages through the chat template) and the
hash chain of its full KV-cache blocks.

The worker and the router both use this module, so the router's "worker W holds the first K
blocks of this prompt" is computed exactly as the worker's engine tokenizes the prompt. A block's
chain hash covers its parent's hash and its own token ids; workers translate their engine's
KV-cache events into these hashes (the events carry each block's token ids), so the router never
needs the engine's own hash function or seed.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import re
import zlib
from collections.abc import Collection, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
import jinja2.sandbox

from meshserve.services.validation import TEMPLATE_OWN

# -- the simulator's stand-in tokenizer and chat template ----------------------------------------

SIM_TOKENIZER = "sim"
SIM_VOCAB_SIZE = 32000
_PIECE = re.compile(r" ?\S{1,4}|\s")


class _SimIds(dict[str, int]):
    """The sim's token id of each piece, computed on first sight and kept (up to ``limit``
    pieces): a router hashing every prompt at a fleet's pick rate looks most of them up."""

    limit = 1 << 18

    def __missing__(self, piece: str) -> int:
        token_id = zlib.crc32(piece.encode()) % SIM_VOCAB_SIZE
        if len(self) < self.limit:
            self[piece] = token_id
        return token_id


_SIM_IDS = _SimIds()


def sim_token_id(piece: str) -> int:
    return _SIM_IDS[piece]


def sim_tokenize(text: str) -> list[int]:
    """The simulator's tokenizer: deterministic, pieces of up to 4 characters with their leading
    space (~4 characters per token, like BPE on English)."""
    return list(map(_SIM_IDS.__getitem__, _PIECE.findall(text)))


class TemplateCall(NamedTuple):
    """How a chat's template is called (vLLM's request fields): the assistant's turn opened, or
    the final message left open for the model to continue (not both)."""

    add_generation_prompt: bool = True
    continue_final_message: bool = False


OPEN_TURN = TemplateCall()  # a chat completion's: the assistant's turn opened for the model

# The variables the sim's stand-in template reads (as a reasoning model's template reads its
# thinking switches): of a request's chat_template_kwargs, only these reach it.
SIM_TEMPLATE_VARIABLES = frozenset({"enable_thinking", "thinking_budget", "reasoning_effort"})


def allowed_kwargs(template_kwargs: Mapping[str, Any] | None, variables: Collection[str]) -> dict[str, Any]:
    """Of a request's chat_template_kwargs, those its template reads (``variables``): an allow list,
    as vLLM's (resolve_chat_template_kwargs drops the others), so that no request sets anything but
    the template's own variables in what renders it."""
    return {k: v for k, v in (template_kwargs or {}).items() if k in variables}


class _GenerationTag(jinja2.ext.Extension):
    """transformers' ``{% generation %}`` block (assistant token masks), parsed only: its body
    reads variables like the rest of the template."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


# The functions transformers gives every chat template besides Jinja's own (range, namespace, ...).
_RENDERER_FUNCTIONS = ("raise_exception", "strftime_now")


@functools.lru_cache(maxsize=16)
def template_variables(template: str) -> frozenset[str]:
    """The variables a Jinja chat template reads that it does not set itself, less the functions
    its renderer defines (vLLM's allow list of chat_template_kwargs). Parsed as transformers
    parses templates; none is rendered here."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.globals.update(dict.fromkeys(_RENDERER_FUNCTIONS))
    return frozenset(jinja2.meta.find_undeclared_variables(env.parse(template)))


def sim_render(prompt: str, messages: Sequence[Mapping[str, str]] | None,
               template_kwargs: Mapping[str, Any] | None = None, call: TemplateCall = OPEN_TURN) -> str:
    """The prompt text; chat turns get a simple stand-in for a chat template, which writes the
    template's variables (``template_kwargs``) after the turns, as a real template may write a
    thinking switch: they change the prompt. Continuing the final message leaves it open."""
    if not messages:
        return prompt
    turns = "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages)
    if call.continue_final_message:
        return turns[:-1]  # the final message's text, not closed
    if template_kwargs := allowed_kwargs(template_kwargs, SIM_TEMPLATE_VARIABLES):
        turns += "".join(f"<|{k}={json.dumps(v, sort_keys=True)}|>\n" for k, v in sorted(template_kwargs.items()))
    return turns + "<|assistant|>\n" if call.add_generation_prompt else turns


# -- Hugging Face tokenizers (the vLLM engine's) --------------------------------------------------


def hf_prompt_ids(tokenizer: Any, prompt: str, messages: Sequence[Mapping[str, Any]] | None,
                  tools: list[dict[str, Any]] | None = None,
                  template_kwargs: Mapping[str, Any] | None = None, call: TemplateCall = OPEN_TURN) -> list[int]:
    """The prompt token ids vLLM gets from the worker: chat messages (and ``tools``, for
    templates that render them, and ``template_kwargs``, more variables for the template)
    through the model's chat template (generation prompt added), a plain prompt with the
    tokenizer's special tokens."""
    text, add_special_tokens = hf_render(tokenizer, prompt, messages, tools, template_kwargs, call)
    return hf_encode(tokenizer, text, add_special_tokens)


def hf_render(tokenizer: Any, prompt: str, messages: Sequence[Mapping[str, Any]] | None,
              tools: list[dict[str, Any]] | None = None,
              template_kwargs: Mapping[str, Any] | None = None, call: TemplateCall = OPEN_TURN) -> tuple[str, bool]:
    """The text vLLM's tokenizer gets for a prompt, and whether special tokens are added to it: a
    chat through the template (which writes its own), a plain prompt as it is (with them). Of
    ``template_kwargs``, the template's own variables only reach it (``template_variables``)."""
    if messages:
        if template_kwargs:  # not what the renderer gives the template itself: its call, the special tokens
            supplied = TEMPLATE_OWN | tokenizer.special_tokens_map.keys()
            template_kwargs = allowed_kwargs(
                template_kwargs, template_variables(tokenizer.get_chat_template(tools=tools)) - supplied)
        return tokenizer.apply_chat_template(list(messages), tools=tools, add_generation_prompt=call.add_generation_prompt,
                                             continue_final_message=call.continue_final_message,
                                             tokenize=False, **(template_kwargs or {})), False
    return prompt, True


def _rust_backend(tokenizer: Any) -> Any:
    """The tokenizer's Rust tokenizer when calling it straight gives what transformers would (no
    truncation or padding set on it, special tokens split or not as transformers asks), else None."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or backend.truncation is not None or backend.padding is not None \
            or backend.encode_special_tokens != bool(getattr(tokenizer, "split_special_tokens", False)):
        return None
    return backend


def hf_encode(tokenizer: Any, text: str, add_special_tokens: bool = True) -> list[int]:
    """``tokenizer.encode(text, add_special_tokens=...)``: straight from its Rust tokenizer when
    transformers would change nothing about the call, since transformers' Python around a call
    costs more than encoding a short prompt (~45-65 us of ~70-200 us a call on the tiny model's
    tokenizer). Otherwise, and for tokenizers without a Rust backend, through transformers (which
    also clears a truncation or padding left on the backend, so later calls take the short way)."""
    backend = _rust_backend(tokenizer)
    if backend is None:
        return list(tokenizer.encode(text, add_special_tokens=add_special_tokens))
    return backend.encode(text, add_special_tokens=add_special_tokens).ids


def chat_turns(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """ChatMessages as chat templates take them (OpenAI's message dicts). A call's arguments go
    as an object when they parse, as vLLM gives them to templates."""
    turns: list[dict[str, Any]] = []
    for m in messages:
        turn: dict[str, Any] = {"role": m.role, "content": m.content}
        if m.tool_call_id:
            turn["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            turn["tool_calls"] = [{"id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": _arguments(c.arguments)}}
                                  for c in m.tool_calls]
        if m.reasoning:  # under both names, as vLLM gives an assistant's thinking to templates
            turn["reasoning"] = turn["reasoning_content"] = m.reasoning
        turns.append(turn)
    return turns


def _arguments(text: str) -> Any:
    """A past call's arguments as the template gets them: parsed, or the text itself when it is
    not JSON, or nests deeper than Python's parser recurses."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        return text


class Encoder(Protocol):
    """A prompt's token ids in two steps, the text then its tokens, with where each token ends in
    the text: a caller that saw a text beginning the same way can take that beginning's tokens."""

    def render(self, prompt: str, messages: Sequence[Mapping[str, str]] | None) -> tuple[str, bool]:
        """The text the engine tokenizes, and whether special tokens are added to it."""
        ...

    def encode(self, text: str, add_special_tokens: bool) -> tuple[list[int], list[int] | None]:
        """The token ids of ``text`` and the character offset where each ends (0 for an added
        special token; None when the tokenizer cannot say)."""
        ...


class SimEncoder:
    """The simulator's tokenizer as an Encoder (no special tokens)."""

    def render(self, prompt: str, messages: Sequence[Mapping[str, str]] | None) -> tuple[str, bool]:
        return sim_render(prompt, messages), False

    def encode(self, text: str, add_special_tokens: bool) -> tuple[list[int], list[int] | None]:
        pieces = _PIECE.findall(text)
        return list(map(_SIM_IDS.__getitem__, pieces)), list(itertools.accumulate(map(len, pieces)))


class HfEncoder:
    """A Hugging Face tokenizer as an Encoder: the same ids as ``hf_prompt_ids`` (without tools)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer

    def render(self, prompt: str, messages: Sequence[Mapping[str, str]] | None) -> tuple[str, bool]:
        return hf_render(self._tokenizer, prompt, messages)

    def encode(self, text: str, add_special_tokens: bool) -> tuple[list[int], list[int] | None]:
        backend = _rust_backend(self._tokenizer)
        if backend is None:
            return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens)), None
        encoding = backend.encode(text, add_special_tokens=add_special_tokens)
        return encoding.ids, [end for _, end in encoding.offsets]


def load_encoder(name: str) -> Encoder:
    """The prompt tokenizer a worker reports (``WorkerInfo.tokenizer``): ``sim`` or a path /
    Hugging Face name (loaded offline, from local files only)."""
    if name == SIM_TOKENIZER:
        return SimEncoder()
    from transformers import AutoTokenizer

    return HfEncoder(AutoTokenizer.from_pretrained(name, local_files_only=True))


# -- block hashes -----------------------------------------------------------------------------

U64 = (1 << 64) - 1
ROOT_HASH = 0  # the parent of a prompt's first block


def block_hash(parent: int, token_ids: Sequence[int]) -> int:
    """A full block's chain hash: deterministic across processes (tuples of ints hash the same
    in every Python process; no PYTHONHASHSEED involved), unsigned 64-bit for the wire."""
    return hash((parent, tuple(token_ids))) & U64


def chain_root(adapter: str | None = None) -> int:
    """The parent of a prompt's first block on the LoRA ``adapter`` (None: the base model,
    ``ROOT_HASH``): each adapter's chain is its own, so its blocks never share a hash with the
    same tokens' blocks on the base model or another adapter (vLLM folds the adapter's name into
    its block hashes likewise). A negative id comes before the name: no prompt's tokens are."""
    if not adapter:
        return ROOT_HASH
    name = int.from_bytes(hashlib.blake2b(adapter.encode(), digest_size=8).digest(), "big")
    return block_hash(ROOT_HASH, (-1, name))


def block_hashes(token_ids: Sequence[int], block_size: int, limit: int | None = None,
                 start: int = 0, parent: int = ROOT_HASH) -> list[int]:
    """The chain hashes of the full blocks of ``token_ids`` (at most ``limit`` blocks), from block
    ``start`` on (``parent``: the hash of the block before it)."""
    n = len(token_ids) // block_size
    if limit is not None:
        n = min(n, limit)
    hashes = []
    for i in range(start, n):
        parent = block_hash(parent, token_ids[i * block_size : (i + 1) * block_size])
        hashes.append(parent)
    return hashes


def cacheable_blocks(num_prompt_tokens: int, block_size: int) -> int:
    """How many leading blocks of a prompt an engine can take from its prefix cache: full blocks,
    leaving at least one token to compute (vLLM needs the last token's logits)."""
    return max(0, (num_prompt_tokens - 1) // block_size)
