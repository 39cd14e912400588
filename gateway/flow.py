"""Flow control: while the fleet is saturated, requests wait in the gateway, not in the engines.

A generation takes one of the gateway's places on the fleet before it is sent to a worker: as
many as the serving workers run sequences (their ``max_num_seqs``, from the fleet view), times
this gateway's share of the fleet (``--flow-fleet-share``: 1/N of N gateways), and a little
headroom (``--flow-headroom``), so an engine's batch stays full between one request's end and the
next one's arrival.
While every place is taken, requests wait here in priority bands (lower value first) and, within
a band, in one queue per tenant, served by weighted fair queuing over tokens (start-time fair
queuing: each request's start tag is its tenant's previous finish tag, or the band's virtual
time if that is later, and its finish tag adds prompt + max_tokens over the tenant's weight; the
queue head with the lowest start tag goes first). A tenant that asks for long answers therefore
does not crowd out one that asks short questions, and an idle tenant does not bank credit.

A new request can only start when a running sequence ends, and on a fleet full of streams of one
length those end together, a batch at a time: a short question would wait for the next batch to
end (seconds). So a few of the running places (3%, at least one) are kept free, and the headroom
held back, from requests that would queue behind them in the engines:
- when the keys file gives some tenant a more urgent priority than others', from the less urgent
  bands (vLLM's priority scheduling preempts for KV blocks, not for a batch slot);
- within a band, from a tenant with requests waiting here (a backlogged one) while another tenant
  has asked for a place in the last ``LIGHT_TENANT_S`` seconds and has none waiting (a light one,
  say interactive users beside a batch job): the light tenant's next request starts at once.
Tenants that are all backlogged (two batch jobs) or a lone tenant keep every place and the
headroom.

Waiting is bounded: past ``--flow-max-queued`` queued requests, or when a request's estimated
wait (the requests ahead of it in dispatch order over the recent dispatch rate) is longer than
``--flow-max-wait-s``, it is refused at once with RESOURCE_EXHAUSTED and a retry hint; one that
does wait that long is refused then. Cache hits and coalesced requests take no place.

Across several gateways: each orders its own queue; the fleet's places are split by the share
each gateway is given, not by tenant.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import prometheus_client

from meshserve.gateway.errors import GatewayError, overloaded

QUEUED = prometheus_client.Gauge("meshserve_gateway_flow_queued", "Requests waiting for a place on the fleet, by tenant",
                                 ["tenant"])
WAIT = prometheus_client.Histogram(
    "meshserve_gateway_flow_wait_seconds", "Time a generation waited for a place on the fleet, by tenant", ["tenant"],
    buckets=[0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0])
REFUSED = prometheus_client.Counter(
    "meshserve_gateway_flow_refused_total",
    "Requests refused by flow control, by tenant and reason (queue_full, wait_too_long, waited_too_long)",
    ["tenant", "reason"])
DISPATCHED = prometheus_client.Gauge("meshserve_gateway_flow_dispatched", "Generations holding a place on the fleet")
PLACES = prometheus_client.Gauge("meshserve_gateway_flow_places", "Places this gateway may hold on the fleet now "
                                 "(0: not known, nothing is held back)")

RATE_HALF_LIFE_S = 5.0  # of the dispatch-rate estimate a wait is estimated with
LIGHT_TENANT_S = 10.0   # a tenant that asked for a place this recently, none waiting, has places kept free


@dataclass(eq=False)
class _Waiter:
    tenant: str
    priority: int
    cost: float
    start: float
    since: float
    ready: asyncio.Future[None]


@dataclass
class _Band:
    """One priority's queues: a FIFO per tenant, and the band's virtual time."""

    clock: float = 0.0
    queues: dict[str, deque[_Waiter]] = field(default_factory=dict)
    finish: dict[str, float] = field(default_factory=dict)  # each tenant's last finish tag

    def tag(self, tenant: str, cost: float, weight: float) -> float:
        """A new request's start tag; advances the tenant's finish tag past it."""
        start = max(self.clock, self.finish.get(tenant, 0.0))
        self.finish[tenant] = start + cost / weight
        return start

    def head(self) -> _Waiter | None:
        """The waiter to dispatch next: the lowest start tag among the tenants' first waiters."""
        heads = [q[0] for q in self.queues.values() if q]
        return min(heads, key=lambda w: w.start) if heads else None


class FlowController:
    """``places()``: the fleet's sequences this gateway may keep running (0: not known);
    ``headroom`` the fraction more the most urgent band may hold, waiting in the engines;
    ``weight(tenant)`` its share; ``best_priority`` the most urgent priority any tenant has."""

    def __init__(self, places: Callable[[], int], weight: Callable[[str], float], best_priority: int,
                 max_queued: int, max_wait_s: float, clock: Callable[[], float] = time.monotonic,
                 headroom: float = 0.0) -> None:
        self._places = places
        self._headroom = headroom
        self._weight = weight
        self._best_priority = best_priority
        self._max_queued = max_queued
        self._max_wait_s = max_wait_s
        self._clock = clock
        self._bands: dict[int, _Band] = {}
        self._waiting: Counter[str] = Counter()  # tenant -> its requests queued here
        self._asked: dict[str, float] = {}        # tenant -> when it last asked for a place
        self.dispatched = 0
        self.queued = 0
        self._dispatches = 0.0    # places given, decayed with RATE_HALF_LIFE_S: the recent dispatch rate
        self._counted_at = self._since = clock()

    @asynccontextmanager
    async def place(self, tenant: str, priority: int, prompt_tokens: int, max_tokens: int
                    ) -> AsyncIterator[Callable[[int], None]]:
        """Holds a place on the fleet for one generation (waiting for one if need be: GatewayError
        RESOURCE_EXHAUSTED when that would take too long), reckoned at ``prompt_tokens`` +
        ``max_tokens``. Yields a function to call with the tokens it generated: the tenant's share
        is settled to what it really used."""
        band = self._bands.setdefault(priority, _Band())
        weight = self._weight(tenant)
        cost = prompt_tokens + max_tokens
        start = band.tag(tenant, cost, weight)
        self._asked[tenant] = self._clock()
        if not self.queued and self._room(priority, tenant):
            self._dispatch(band, start)
        else:
            await self._wait(_Waiter(tenant, priority, cost, start, self._clock(),
                                     asyncio.get_running_loop().create_future()), band)

        def settle(generated: int) -> None:
            band.finish[tenant] = band.finish.get(tenant, 0.0) + (prompt_tokens + generated - cost) / weight

        try:
            yield settle
        finally:
            self.dispatched -= 1
            DISPATCHED.set(self.dispatched)
            self.pump()

    def pump(self) -> None:
        """Dispatches the waiters there is room for now (a place freed, the fleet grew)."""
        while self.queued:
            priority = min(p for p, b in self._bands.items() if any(b.queues.values()))
            band = self._bands[priority]
            waiter = band.head()
            assert waiter is not None
            if not self._room(priority, waiter.tenant):
                return
            self._dequeue(band, waiter)
            self._dispatch(band, waiter.start)
            WAIT.labels(waiter.tenant or "-").observe(self._clock() - waiter.since)
            waiter.ready.set_result(None)

    def _room(self, priority: int, tenant: str) -> bool:
        places = self._places()
        if places <= 0:
            PLACES.set(0)
            return True  # the fleet's size is not known (yet): nothing is held back
        most = math.ceil(places * (1 + self._headroom))
        PLACES.set(most)
        if priority <= self._best_priority and not (self._waiting[tenant] and self._light_besides(tenant)):
            return self.dispatched < most
        # Running sequences only, a few kept free: for the more urgent, or for a light tenant.
        return self.dispatched < places - (max(1, math.ceil(places * 0.03)) if places > 1 else 0)

    def _light_besides(self, tenant: str) -> bool:
        """Whether a tenant other than ``tenant`` asked for a place lately and has none waiting."""
        recent = self._clock() - LIGHT_TENANT_S
        for other, asked in list(self._asked.items()):
            if asked < recent:
                del self._asked[other]  # forgotten until it asks again
            elif other != tenant and not self._waiting[other]:
                return True
        return False

    def _dispatch(self, band: _Band, start: float) -> None:
        band.clock = max(band.clock, start)
        self.dispatched += 1
        DISPATCHED.set(self.dispatched)
        self._dispatches = self._decayed() + 1
        self._counted_at = self._clock()

    def _decayed(self) -> float:
        return self._dispatches * 0.5 ** ((self._clock() - self._counted_at) / RATE_HALF_LIFE_S)

    def _rate(self) -> float | None:
        """Places given a second lately; None until there is a half-life's worth of history."""
        if self._clock() - self._since < RATE_HALF_LIFE_S:
            return None
        return self._decayed() * math.log(2) / RATE_HALF_LIFE_S

    async def _wait(self, waiter: _Waiter, band: _Band) -> None:
        label = waiter.tenant or "-"
        if self.queued >= self._max_queued:
            REFUSED.labels(label, "queue_full").inc()
            raise overloaded(f"gateway queue full ({self.queued} requests waiting for a place on the fleet)")
        rate = self._rate()
        if rate and (wait := self._ahead(waiter) / rate) > self._max_wait_s:
            REFUSED.labels(label, "wait_too_long").inc()
            raise self._too_long(wait)
        band.queues.setdefault(waiter.tenant, deque()).append(waiter)
        self.queued += 1
        self._waiting[waiter.tenant] += 1
        QUEUED.labels(label).inc()
        self.pump()  # a more urgent band's request may go at once (a place kept for it)
        try:
            async with asyncio.timeout(self._max_wait_s):
                await asyncio.shield(waiter.ready)
        except (TimeoutError, asyncio.CancelledError) as e:
            if waiter.ready.done():  # dispatched as it gave up: the place is its own to return
                self.dispatched -= 1
                DISPATCHED.set(self.dispatched)
                self.pump()
            else:
                self._dequeue(band, waiter)
                waiter.ready.cancel()
            if isinstance(e, TimeoutError):
                REFUSED.labels(label, "waited_too_long").inc()
                raise self._too_long(self._max_wait_s) from None
            raise

    def _dequeue(self, band: _Band, waiter: _Waiter) -> None:
        band.queues[waiter.tenant].remove(waiter)
        self.queued -= 1
        self._waiting[waiter.tenant] -= 1
        if not self._waiting[waiter.tenant]:
            del self._waiting[waiter.tenant]
        QUEUED.labels(waiter.tenant or "-").dec()

    def _ahead(self, waiter: _Waiter) -> int:
        """Queued requests that go before ``waiter``: all of the more urgent bands', and those of
        its band with an earlier start tag."""
        return sum(1 for p, b in self._bands.items() if p <= waiter.priority
                   for q in b.queues.values() for w in q if p < waiter.priority or w.start <= waiter.start)

    def _too_long(self, wait_s: float) -> GatewayError:
        return overloaded(f"the fleet is saturated: a place would take about {wait_s:.0f}s "
                          f"(more than --flow-max-wait-s {self._max_wait_s:g}s)")

