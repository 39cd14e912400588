"""The gateway's channels: one to the router (with one PickBatches stream on it for every pick,
and the fleet view's WatchFleet stream), one to the cache (and a Redis client for its exact
entries), one per worker address (with one Session stream on it that all requests to that worker
share). With ``--router embedded`` the router's picks and fleet view are in this process."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import grpc

from meshserve.gateway.entries import ExactEntries
from meshserve.gateway.picks import LocalPicks, Picks, PickStream, RouterInProcess
from meshserve.gateway.relay import WorkerSession
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.config import SERVICE_IDENTITIES
from meshserve.services.mesh_tls import MeshTls
from meshserve.services.server import mesh_channel, stall_options


class Clients:
    """Opens the router and cache channels once and keeps one channel per worker address.

    A worker whose session closed (it died, or left: Kubernetes scales the workers in and out)
    and holds none of this gateway's requests loses its channel when a new session opens, so
    the pool follows the fleet instead of growing with every address the router ever named.

    ``router`` is the router service's address, or the router itself when the gateway picks in
    its own process (``--router embedded``). ``tls``: mutual TLS on every channel (each peer's
    certificate must name its service).
    """

    def __init__(
        self, router: str | RouterInProcess, cache: str, stall_timeout_s: float = 0.0,
        entries: ExactEntries | None = None, tls: MeshTls | None = None,
    ) -> None:
        self._tls = tls
        self._router_channel: grpc.aio.Channel | None = None
        self.picks: Picks
        self.watch_fleet: Callable[[], AsyncIterator[pb.FleetUpdate]]
        if isinstance(router, str):
            self._router_channel = mesh_channel(router, tls, SERVICE_IDENTITIES["router"])
            stub = pb_grpc.RouterStub(self._router_channel)
            self.picks = PickStream(stub)
            self.watch_fleet = lambda: aiter(stub.WatchFleet(pb.WatchFleetRequest()))
        else:
            self.picks = LocalPicks(router)
            self.watch_fleet = router.fleet_updates
        self._cache_channel: grpc.aio.Channel | None = (mesh_channel(cache, tls, SERVICE_IDENTITIES["cache"])
                                                        if cache else None)
        self.cache = pb_grpc.CacheStub(self._cache_channel) if self._cache_channel else None
        self.entries = entries  # exact entries read from the cache's Redis, when the gateway has its URL
        self._workers: dict[str, tuple[grpc.aio.Channel, pb_grpc.WorkerStub]] = {}
        self._sessions: dict[str, WorkerSession] = {}
        self._worker_options = stall_options(stall_timeout_s) if stall_timeout_s > 0 else []
        self._closing: set[asyncio.Task[None]] = set()  # channels of gone workers, closing

    def worker(self, address: str) -> pb_grpc.WorkerStub:
        if address not in self._workers:
            channel = mesh_channel(address, self._tls, SERVICE_IDENTITIES["worker"], self._worker_options)
            self._workers[address] = (channel, pb_grpc.WorkerStub(channel))
        return self._workers[address][1]

    def session(self, address: str) -> WorkerSession:
        """The open Session stream to the worker at ``address`` (a new one if it has none)."""
        session = self._sessions.get(address)
        if session is None or session.closed:
            self._sweep(keep=address)
            session = self._sessions[address] = WorkerSession(self.worker(address), address)
        return session

    def failed(self, address: str) -> bool:
        """Whether this gateway's last session to the worker at ``address`` closed (it died, was
        frozen or left); False before the first session."""
        session = self._sessions.get(address)
        return session is not None and session.closed

    def in_flight(self, address: str) -> int:
        """This gateway's requests on the worker at ``address`` now."""
        session = self._sessions.get(address)
        return 0 if session is None else session.in_flight

    def addresses(self) -> list[str]:
        """The workers this gateway holds a channel to."""
        return list(self._workers)

    def _sweep(self, keep: str) -> None:
        """Closes the channels of workers whose session is closed and idle (none of this
        gateway's requests is on it)."""
        gone = [a for a, s in self._sessions.items() if a != keep and s.closed and not s.in_flight]
        for address in gone:
            del self._sessions[address]
            channel, _ = self._workers.pop(address, (None, None))
            if channel is not None:
                task = asyncio.get_running_loop().create_task(channel.close())
                self._closing.add(task)
                task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        await self.picks.close()
        for session in self._sessions.values():
            await session.close()
        self._sessions.clear()
        channels = [c for c, _ in self._workers.values()]
        if self._router_channel is not None:
            channels.append(self._router_channel)
        if self._cache_channel is not None:
            channels.append(self._cache_channel)
        self._workers.clear()
        for channel in channels:
            await channel.close()
        if self.entries is not None:
            await self.entries.close()
        await asyncio.gather(*self._closing, return_exceptions=True)
