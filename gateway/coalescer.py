"""The gateway's coalescing stage: identical deterministic requests in flight share one answer.

Each key has at most one flight at a time (gateway.flights): its task looks the answer up in the
cache and, on a miss, generates it once; every identical request reads what the flight produces,
live. A gateway that reads exact entries in Redis itself reads first, before any flight: a hit
needs none. Should an identical flight start and land while that read was on its way, the new
flight reads the cache again rather than generating what was just stored.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import aclosing
from typing import Any

from opentelemetry import trace

from meshserve.gateway import metrics
from meshserve.gateway.errors import GatewayError
from meshserve.gateway.flights import Flight, Flights
from meshserve.gateway.relay import merge
from meshserve.gateway.response_cache import hit_chunk
from meshserve.services.gen import meshserve_pb2 as pb

COALESCED = "coalesced"  # cache_kind of a request that streamed an identical one's answer

# Reads the cache before any flight: its answer, or None on a miss.
Read = Callable[[], Awaitable[pb.LookupResponse | None]]
# A flight's task: given the flight, and whether the cache was just read and missed.
Fly = Callable[[Flight, bool], Coroutine[Any, Any, None]]


class Coalescer:
    def __init__(self) -> None:
        self._flights = Flights()

    def __len__(self) -> int:
        return len(self._flights)

    async def answer(self, req: pb.GenerateRequest, key: str, read: Read | None, fly: Fly
                     ) -> AsyncIterator[pb.GenerateResponse]:
        """``req``'s answer: the cache's when ``read`` finds it (no flight), else the flight of
        ``key``'s, joined or started (``fly`` is its task), as this request's chunks."""
        missed = False
        if read is not None and key not in self._flights:
            mark = self._flights.landings
            hit = await read()
            if hit is not None:
                yield hit_chunk(req, hit)
                return
            missed = not self._flights.landed_since(key, mark)
        flight, leader = self._flights.join(key, req.request_id, lambda f: fly(f, missed))
        if not leader:
            metrics.COALESCED.inc()
            trace.get_current_span().set_attribute("meshserve.coalesced_with", flight.leader_request_id)
        try:
            async with aclosing(flight.read()) as batches:
                async for batch in batches:
                    yield _as_reader(req, flight, batch, leader)
        except GatewayError as e:
            raise GatewayError(e.code, e.message, e.trailers) from None  # one copy per reader
        finally:
            self._flights.leave(flight)

    def landed(self, flight: Flight) -> None:
        """``flight``'s answer is stored: identical requests read it in the cache from now on."""
        self._flights.landed(flight)

    async def close(self, timeout_s: float) -> None:
        await self._flights.close(timeout_s)


async def generate_while(flight: Flight, generation: AsyncIterator[pb.GenerateResponse],
                         lookup: Awaitable[pb.LookupResponse | None] | None) -> pb.LookupResponse | None:
    """Generates into ``flight``; with a ``lookup`` (by meaning: an embedding and a call, tens of
    ms) running meanwhile, so a miss costs the slower of the two, not their sum: chunks that come
    before its answer are held back; a hit cancels the generation and is returned (its chunks are
    the answer); a miss lets the held chunks through."""
    if lookup is None:
        await _fill(flight, generation)
        return None
    flight.hold()
    filling = asyncio.ensure_future(_fill(flight, generation))
    try:
        hit = await lookup
        if hit is not None:
            return hit
        flight.release()
        await filling
        return None
    finally:
        if not filling.done():  # a hit, a cancel, or the lookup failed unexpectedly
            filling.cancel()
            await asyncio.gather(filling, return_exceptions=True)  # its error, if any, is moot
        flight.drop_held()


async def _fill(flight: Flight, generation: AsyncIterator[pb.GenerateResponse]) -> None:
    async with aclosing(generation) as chunks:
        async for chunk in chunks:
            flight.push(chunk)


def _as_reader(req: pb.GenerateRequest, flight: Flight, batch: list[pb.GenerateResponse],
               leader: bool) -> pb.GenerateResponse:
    """A flight's batch as one chunk of this request: its own id, and how it was answered."""
    chunk = merge(batch)
    if leader and not flight.cache_kind:
        return chunk  # the leader's own generation, as the worker sent it
    if chunk is batch[0]:
        chunk = pb.GenerateResponse()
        chunk.CopyFrom(batch[0])
    chunk.request_id = req.request_id
    if flight.cache_kind:
        chunk.cached, chunk.worker = True, ""
        chunk.cache_kind, chunk.cache_age_s = flight.cache_kind, flight.cache_age_s
        chunk.cache_similarity = flight.cache_similarity
    else:
        chunk.cache_kind = COALESCED
    return chunk
