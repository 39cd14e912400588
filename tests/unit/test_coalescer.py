"""The gateway's coalescing stage: identical requests in flight share one answer; a cache read
before any flight answers a hit without one; a flight that came and landed during that read is
read again, not generated again; a generation's chunks are held while a lookup by meaning may
still replace them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from meshserve.gateway.coalescer import COALESCED, Coalescer, generate_while
from meshserve.gateway.flights import Flight
from meshserve.services.gen import meshserve_pb2 as pb


def chunk(text: str, token: int, last: bool = False) -> pb.GenerateResponse:
    return pb.GenerateResponse(text=text, token_ids=[token], finish_reason="length" if last else "", worker="A")


async def collect(stream: AsyncIterator[pb.GenerateResponse]) -> list[pb.GenerateResponse]:
    return [c async for c in stream]


async def test_identical_requests_read_one_flight() -> None:
    coalescer = Coalescer()
    release = asyncio.Event()
    flights: list[bool] = []

    async def fly(flight: Flight, missed: bool) -> None:
        flights.append(missed)
        flight.push(chunk("Hel", 1))
        await release.wait()
        flight.push(chunk("lo", 2, last=True))
        flight.finish()

    first = asyncio.ensure_future(collect(coalescer.answer(pb.GenerateRequest(request_id="1"), "k", None, fly)))
    second = asyncio.ensure_future(collect(coalescer.answer(pb.GenerateRequest(request_id="2"), "k", None, fly)))
    await asyncio.sleep(0.01)
    release.set()
    a, b = await first, await second
    assert flights == [False]  # one flight, which read the cache itself (no read came before)
    assert "".join(c.text for c in a) == "".join(c.text for c in b) == "Hello"
    assert {c.request_id for c in b} == {"2"} and {c.cache_kind for c in b} == {COALESCED}
    assert len(coalescer) == 0


async def test_a_hit_read_before_any_flight_needs_none() -> None:
    coalescer = Coalescer()

    async def read() -> pb.LookupResponse | None:
        return pb.LookupResponse(hit=True, kind="exact", chunks=[chunk("Hi", 1, last=True)], age_s=2.0)

    async def fly(flight: Flight, missed: bool) -> None:
        raise AssertionError("no flight for a hit")

    (answer,) = await collect(coalescer.answer(pb.GenerateRequest(request_id="r"), "k", read, fly))
    assert (answer.text, answer.cached, answer.cache_kind, answer.request_id) == ("Hi", True, "exact", "r")


async def test_a_flight_that_landed_during_the_read_is_read_again_not_generated() -> None:
    coalescer = Coalescer()
    reading, go_on = asyncio.Event(), asyncio.Event()
    missed_by_flight: list[bool] = []

    async def slow_miss() -> pb.LookupResponse | None:
        reading.set()
        await go_on.wait()
        return None

    async def fly(flight: Flight, missed: bool) -> None:
        missed_by_flight.append(missed)
        flight.push(chunk("x", 1, last=True))
        flight.finish()
        coalescer.landed(flight)  # its answer is stored

    late = asyncio.ensure_future(collect(coalescer.answer(pb.GenerateRequest(request_id="late"), "k", slow_miss, fly)))
    await reading.wait()
    await collect(coalescer.answer(pb.GenerateRequest(request_id="first"), "k", None, fly))  # came and landed
    go_on.set()
    await late
    assert missed_by_flight == [False, False]  # the late request's flight read the cache again

    await collect(coalescer.answer(pb.GenerateRequest(request_id="third"), "k", slow_miss, fly))
    assert missed_by_flight[-1] is True  # nothing landed meanwhile: its read stands, no second read


async def test_chunks_are_held_until_the_lookup_by_meaning_misses() -> None:
    flight = Flight("k", "r")
    lookup_done = asyncio.Event()

    async def generation() -> AsyncIterator[pb.GenerateResponse]:
        yield chunk("a", 1)
        await lookup_done.wait()
        yield chunk("b", 2, last=True)

    async def miss() -> pb.LookupResponse | None:
        await asyncio.sleep(0.01)
        assert flight.chunks == []  # held back while the lookup may still answer
        lookup_done.set()
        return None

    assert await generate_while(flight, generation(), miss()) is None
    assert [c.text for c in flight.chunks] == ["a", "b"]


async def test_a_hit_by_meaning_cancels_the_generation_and_drops_what_it_held() -> None:
    flight = Flight("k", "r")
    cancelled = asyncio.Event()

    async def generation() -> AsyncIterator[pb.GenerateResponse]:
        try:
            yield chunk("a", 1)
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    async def hit() -> pb.LookupResponse | None:
        await asyncio.sleep(0.01)
        return pb.LookupResponse(hit=True, kind="semantic", chunks=[chunk("cached", 9, last=True)])

    answer = await generate_while(flight, generation(), hit())
    assert answer is not None and answer.kind == "semantic"
    assert cancelled.is_set() and flight.chunks == []
    flight.push(chunk("next", 3))
    assert [c.text for c in flight.chunks] == ["next"]  # nothing held any more
