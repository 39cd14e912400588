"""vLLM's KV-cache events into the worker's ``KvCacheView``, in the mesh's block hashes.

vLLM's engine core publishes ``KVEventBatch``es (msgpack) on a ZMQ PUB socket
(``KVEventsConfig``). The worker binds a SUB socket on a free loopback port *before* the engine
starts and gives vLLM that address: with an endpoint without ``*`` vLLM's publisher connects,
so no event is lost to a late subscription and two workers on one host never clash on a port.

``BlockStored`` names each block by vLLM's hash (sha256 of its parent's hash, its tokens and
extra keys, seeded per process) and carries the blocks' token ids and the parent's vLLM hash;
the translator re-hashes each block with ``services.prompts.block_hash`` from the parent's mesh
hash and the tokens, so the router can compute the same chain from a prompt's tokens. A chain on
a LoRA adapter starts from the adapter's own root (``chain_root``), as vLLM's hashes name it. vLLM can
announce one hash twice (a block recomputed while a copy is cached), so blocks are counted and
a block leaves the view when its last copy is removed.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from meshserve.services.prompts import block_hash, chain_root
from meshserve.worker.kv_events import KvCacheView

log = logging.getLogger(__name__)

TOPIC = "kv"
DEVICE_MEDIUM = "GPU"  # vLLM's name for the accelerator tier (CPU platform included)


class KvEventTranslator:
    """Applies decoded vLLM KV events to a view."""

    def __init__(self, view: KvCacheView) -> None:
        self.view = view
        self._mesh: dict[int, int] = {}    # vLLM block hash -> mesh block hash
        self._copies: dict[int, int] = {}  # vLLM block hash -> copies cached
        self.unknown_parents = 0

    def apply(self, events: list[Any]) -> None:
        from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored

        for event in events:
            if getattr(event, "medium", DEVICE_MEDIUM) not in (None, DEVICE_MEDIUM):
                continue  # an offload tier: not what the engine's prefix cache reuses first
            if isinstance(event, BlockStored):
                self._stored(event)
            elif isinstance(event, BlockRemoved):
                self._removed(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                self._mesh.clear()
                self._copies.clear()
                self.view.cleared()

    def _stored(self, event: Any) -> None:
        if event.parent_block_hash is None:  # a prompt's first block: on the base model, or an adapter's
            parent = chain_root(getattr(event, "lora_name", None))
        elif event.parent_block_hash in self._mesh:
            parent = self._mesh[event.parent_block_hash]
        else:
            # Its parent was stored before we listened, or evicted meanwhile: without it this
            # chain cannot be placed, and a prompt can only reuse a chain from its start.
            self.unknown_parents += 1
            return
        size = event.block_size
        stored = []
        for i, vllm_hash in enumerate(event.block_hashes):
            parent = block_hash(parent, event.token_ids[i * size : (i + 1) * size])
            copies = self._copies.get(vllm_hash, 0)
            self._copies[vllm_hash] = copies + 1
            if not copies:
                self._mesh[vllm_hash] = parent
                stored.append(parent)
        self.view.stored(stored)

    def _removed(self, hashes: list[int]) -> None:
        removed = []
        for vllm_hash in hashes:
            copies = self._copies.get(vllm_hash, 0)
            if copies > 1:
                self._copies[vllm_hash] = copies - 1
            elif copies == 1:
                del self._copies[vllm_hash]
                removed.append(self._mesh.pop(vllm_hash))
        self.view.removed(removed)


class VllmKvEvents:
    """The SUB socket and the task that feeds the translator."""

    def __init__(self, view: KvCacheView) -> None:
        import zmq
        import zmq.asyncio

        self._ctx = zmq.asyncio.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt_string(zmq.SUBSCRIBE, TOPIC)
        self._sock.bind("tcp://127.0.0.1:*")
        self.endpoint: str = self._sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self.translator = KvEventTranslator(view)
        self._task: asyncio.Task[None] | None = None
        self._last_sequence: int | None = None
        self.gaps = 0

    def config(self) -> Any:
        """The engine's ``kv_events_config``: publish to our socket."""
        from vllm.config import KVEventsConfig

        return KVEventsConfig(enable_kv_cache_events=True, publisher="zmq", endpoint=self.endpoint, topic=TOPIC)

    def start(self) -> None:
        self._task = asyncio.create_task(self._read(), name="vllm kv events")

    async def _read(self) -> None:
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        while True:
            _, seq_bytes, payload = await self._sock.recv_multipart()
            sequence = int.from_bytes(seq_bytes, "big", signed=True)
            if self._last_sequence is not None and sequence != self._last_sequence + 1:
                # Lost batches (the publisher's queue overflowed): the view may be wrong until
                # the blocks concerned turn over; say so rather than pretend.
                self.gaps += 1
                log.warning("KV events %d..%d lost; the router's view of this worker may lag",
                            self._last_sequence + 1, sequence - 1)
            self._last_sequence = sequence
            try:
                self.translator.apply(decoder.decode(payload).events)
            except Exception:  # noqa: BLE001 - one bad batch must not stop the stream
                log.exception("could not apply a KV event batch")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        self._sock.close(linger=0)
        self._ctx.term()
