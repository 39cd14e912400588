"""Kubernetes discovery: the real router against a fake API server that speaks the EndpointSlice
list/watch protocol as the real one does, and fake workers (tests/service/test_router.py) on
loopback addresses of their own, so that one slice with one port lists several of them."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from aiohttp import web
from lightkube import KubeConfig

from meshserve.router.discovery import Slice, own_namespace, slice_addresses
from meshserve.router.policies import build_policy
from meshserve.router.server import Router, set_workers, start_router
from meshserve.router.state import WorkerTable
from meshserve.router.watcher import Watcher
from meshserve.services.config import RouterConfig
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import Running, insecure_channel
from tests.conftest import free_port
from tests.integration.helpers import wait_until
from tests.service.test_router import FakeWorker, pick, wait_for_workers

NAMESPACE, SERVICE, TOKEN = "mesh", "workers", "router-token"
ENDPOINTSLICES = "/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"


# -- the pure parts ------------------------------------------------------------------------------

def _slice(endpoints: list[dict[str, Any]], ports: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"addressType": "IPv4", "endpoints": endpoints,
            "ports": [{"name": "grpc", "port": 50061}] if ports is None else ports}


@pytest.mark.parametrize(("endpoint_slice", "expected"), [
    (_slice([{"addresses": ["10.0.0.1"], "conditions": {"ready": True}}]), ["10.0.0.1:50061"]),
    (_slice([{"addresses": ["10.0.0.1"], "conditions": {"ready": False}}]), []),
    (_slice([{"addresses": ["10.0.0.1"], "conditions": {}}]), ["10.0.0.1:50061"]),  # unknown: ready
    (_slice([{"addresses": ["10.0.0.1"]}]), ["10.0.0.1:50061"]),
    (_slice([{"addresses": ["10.0.0.1"], "conditions": {"ready": None}}]), ["10.0.0.1:50061"]),
    (_slice([{"addresses": ["10.0.0.1"], "conditions": {"ready": False, "serving": True}},
             {"addresses": ["10.0.0.2"], "conditions": {"ready": True}}]), ["10.0.0.2:50061"]),
    (_slice([{"addresses": ["fd00::1"]}]), ["[fd00::1]:50061"]),
    (_slice([{"addresses": ["10.0.0.1"]}], [{"name": "metrics", "port": 9400}, {"name": "grpc", "port": 70}]),
     ["10.0.0.1:70"]),
    (_slice([{"addresses": ["10.0.0.1"]}], [{"name": "metrics", "port": 9400}]), []),  # no grpc port
    (_slice([{"addresses": ["10.0.0.1"]}], [{"name": "grpc"}]), []),  # a port with no number
    (_slice([]), []),
    ({"addressType": "IPv4", "endpoints": None, "ports": None}, []),  # how the API sends an empty slice
])
def test_a_slice_gives_its_ready_endpoints_on_the_named_port(
    endpoint_slice: Slice, expected: list[str]
) -> None:
    assert slice_addresses(endpoint_slice, "grpc") == expected


def test_the_port_name_is_configurable_and_may_be_empty() -> None:
    unnamed = _slice([{"addresses": ["10.0.0.1"]}], [{"port": 8000}])
    assert slice_addresses(unnamed, "") == ["10.0.0.1:8000"]
    assert slice_addresses(unnamed, "grpc") == []


def test_the_namespace_is_the_pods_own_else_default(tmp_path: Path) -> None:
    (tmp_path / "namespace").write_text("serving\n")
    assert own_namespace(tmp_path / "namespace") == "serving"
    assert own_namespace(tmp_path / "absent") == "default"


async def test_set_workers_applies_the_difference_and_forgets_the_workers_that_left() -> None:
    # Nothing listens on these: the watcher keeps retrying them, which is all this test needs.
    a, b, c = (f"127.0.0.1:{free_port()}" for _ in range(3))
    table = WorkerTable([])
    router = Router(table, build_policy("approx-prefix", 30.0), stale_after_s=30.0)
    watcher = Watcher(table, stale_after_s=30.0, lost_after_s=60.0)
    try:
        await set_workers(router, watcher, [a, b])
        assert table.addresses() == [a, b] and _watch_tasks() == {a, b}
        router.approx.stored(a, [1, 2])
        router.pending.stored(a, [3], at=0.0)
        table.on_assigned(a)
        task_b = _task(b)

        await set_workers(router, watcher, [b, c])
        assert table.addresses() == [b, c] and _watch_tasks() == {b, c}
        assert a not in router.approx.workers() and a not in router.pending.workers()
        assert _task(b) is task_b  # a worker that stays keeps its stream

        await set_workers(router, watcher, [c, b, c])  # the same set: nothing changes
        assert table.addresses() == [b, c] and _task(b) is task_b

        await set_workers(router, watcher, [a])  # back: a new worker, nothing remembered
        assert [(v.address, v.assigned_unreported) for v in table.snapshot()] == [(a, 0)]
    finally:
        await watcher.close()
    assert not _watch_tasks()


def _watch_tasks() -> set[str]:
    names = [t.get_name() for t in asyncio.all_tasks()]
    return {name.removeprefix("watch ") for name in names if name.startswith("watch ")}


def _task(address: str) -> asyncio.Task:
    return next(t for t in asyncio.all_tasks() if t.get_name() == f"watch {address}")


# -- a fake API server -----------------------------------------------------------------------------

def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeKubeApi:
    """The EndpointSlice list and watch of a Kubernetes API server, answered as the real one does:
    every change takes the next resourceVersion; a list answers the slices and the current version;
    a watch from version N replays the changes after N, then streams them (bookmarks on request);
    a watch from a version older than the history kept gets an ERROR event with a 410 Status."""

    def __init__(self) -> None:
        self.version = 100
        self.oldest = 100  # the history up to here is forgotten: a watch from before it is 410 Gone
        self.slices: dict[tuple[str, str], dict[str, Any]] = {}  # by (namespace, name)
        self.history: list[tuple[int, str, dict[str, Any]]] = []  # (version, event type, slice)
        self.requests: list[dict[str, str]] = []  # the query of every request, in order
        self.held = False  # open watches send nothing: a slow watcher falling behind
        self.gone_as_http = False  # answer an expired version with an HTTP 410, not an ERROR event
        self.bookmarks_sent = 0
        self._bookmarks = 0  # bookmarks asked for
        self._ends = 0  # end_watches calls
        self._drop = False
        self._changed = asyncio.Condition()
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, port: int = 0) -> None:
        app = web.Application()
        app.router.add_get(ENDPOINTSLICES, self._endpointslices)
        self._runner = web.AppRunner(app, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def stop(self) -> None:
        await self.end_watches()
        if self._runner is not None:
            await self._runner.cleanup()

    def kube_config(self, url: str | None = None) -> KubeConfig:
        """A kubeconfig with this server's URL and a bearer token."""
        return KubeConfig.from_dict({
            "clusters": [{"name": "fake", "cluster": {"server": url or self.url}}],
            "users": [{"name": "router", "user": {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "router"}}],
            "current-context": "fake",
        })

    def watches(self) -> list[dict[str, str]]:
        return [q for q in self.requests if q.get("watch") == "true"]

    def lists(self) -> list[dict[str, str]]:
        return [q for q in self.requests if q.get("watch") != "true"]

    async def put(self, name: str, workers: list[FakeWorker], ready: list[bool | None] | None = None,
                  service: str = SERVICE) -> None:
        """Creates or replaces the slice ``name`` of ``service``: ``workers`` on their common port,
        each ready or not as ``ready`` says (None: the condition left out)."""
        ready = ready or [True] * len(workers)
        endpoints = [{"addresses": [w.host], "conditions": {} if r is None else {"ready": r},
                      "targetRef": {"kind": "Pod", "name": w.worker_id}} for w, r in zip(workers, ready)]
        obj = {
            "kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
            "metadata": {"name": name, "namespace": NAMESPACE,
                         "labels": {"kubernetes.io/service-name": service}},
            "addressType": "IPv4", "endpoints": endpoints or None,
            "ports": [{"name": "grpc", "port": workers[0].port if workers else 1, "protocol": "TCP"}],
        }
        await self._change("MODIFIED" if (NAMESPACE, name) in self.slices else "ADDED", obj)

    async def delete(self, name: str) -> None:
        await self._change("DELETED", self.slices[NAMESPACE, name])

    def compact(self) -> None:
        self.oldest = self.version

    async def bookmark(self) -> None:
        async with self._changed:
            self._bookmarks += 1
            self._changed.notify_all()

    async def end_watches(self, drop: bool = False) -> None:
        """Ends every open watch, cleanly or (``drop``) by closing its connection, at once."""
        async with self._changed:
            self._ends += 1
            self._drop = drop
            self._changed.notify_all()

    async def _change(self, kind: str, obj: dict[str, Any]) -> None:
        async with self._changed:
            self.version += 1
            obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": str(self.version)}}
            if kind == "DELETED":
                del self.slices[NAMESPACE, obj["metadata"]["name"]]
            else:
                self.slices[NAMESPACE, obj["metadata"]["name"]] = obj
            self.history.append((self.version, kind, obj))
            self._changed.notify_all()

    async def _endpointslices(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return web.json_response(_status(401, "Unauthorized", "Unauthorized"), status=401)
        query = dict(request.query)
        self.requests.append(query)
        key, _, value = query.get("labelSelector", "").partition("=")
        namespace = request.match_info["namespace"]

        def selected(obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            return meta["namespace"] == namespace and (not key or meta["labels"].get(key) == value)

        if query.get("watch") != "true":
            return web.json_response({
                "kind": "EndpointSliceList", "apiVersion": "discovery.k8s.io/v1",
                "metadata": {"resourceVersion": str(self.version)},
                "items": [s for s in self.slices.values() if selected(s)],
            })
        position = int(query["resourceVersion"])
        if position < self.oldest:
            status = _status(410, "Expired", f"too old resource version: {position} ({self.oldest})")
            if self.gone_as_http:
                return web.json_response(status, status=410)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(kind: str, obj: dict[str, Any]) -> None:
            await response.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")

        if position < self.oldest:
            await send("ERROR", status)
            return response
        ends, bookmarks = self._ends, self._bookmarks
        while True:
            async with self._changed:
                await self._changed.wait_for(lambda: self._ends != ends or self._bookmarks != bookmarks
                                             or (not self.held and self.version > position))
            if self._ends != ends:  # before sending anything more: what was held stays unsent
                if self._drop:
                    assert request.transport is not None
                    request.transport.close()
                return response
            if not self.held:
                for version, kind, obj in self.history:
                    if version > position and selected(obj):
                        await send(kind, obj)
                position = self.version
            if self._bookmarks != bookmarks and query.get("allowWatchBookmarks") == "true":
                await send("BOOKMARK", {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1",
                                        "metadata": {"resourceVersion": str(position)}})
                self.bookmarks_sent += 1
            bookmarks = self._bookmarks


# -- the router against it --------------------------------------------------------------------------

StartRouter = Callable[[KubeConfig], Awaitable[pb_grpc.RouterStub]]


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeApi]:
    api = FakeKubeApi()
    yield api
    await api.stop()


@pytest.fixture
async def workers() -> AsyncIterator[list[FakeWorker]]:
    """Four fake workers, each on its own loopback address, all on one port (as a Service's pods)."""
    port = free_port()
    started = [FakeWorker(f"w{i}", host=f"127.0.0.{10 + i}") for i in range(4)]
    for worker in started:
        worker.port = port
        await worker.start()
    yield started
    for worker in started:
        await worker.stop()


@pytest.fixture
async def start(api: FakeKubeApi) -> AsyncIterator[StartRouter]:
    routers: list[Running] = []
    channels: list[grpc.aio.Channel] = []

    async def start(kube_config: KubeConfig) -> pb_grpc.RouterStub:
        cfg = RouterConfig(
            port=0, metrics_port=-1, grace_seconds=0.5, stale_after_s=30.0, lost_after_s=60.0,
            routing="least-load",
            discovery="kubernetes", kubernetes_service=SERVICE, kubernetes_namespace=NAMESPACE,
        )
        routers.append(await start_router(cfg, kube_config=kube_config))
        channels.append(insecure_channel(f"127.0.0.1:{routers[-1].port}"))
        return pb_grpc.RouterStub(channels[-1])

    yield start
    for channel in channels:
        await channel.close()
    for running in routers:
        await running.shutdown()
    leaked = [t for t in asyncio.all_tasks() if t.get_name().startswith(("watch ", "discovery "))]
    assert not leaked, f"tasks left running: {leaked}"


def connected(*ids: str) -> Callable[[dict[str, pb.WorkerState]], bool]:
    """Exactly these workers are listed, each connected and reporting."""
    return lambda ws: sorted(ws) == sorted(ids) and all(w.healthy for w in ws.values())


async def picked(stub: pb_grpc.RouterStub, n: int = 20) -> set[str]:
    return {(await pick(stub)).worker_id for _ in range(n)}


async def test_the_ready_endpoints_of_the_service_are_the_workers(
    api: FakeKubeApi, workers: list[FakeWorker], start: StartRouter
) -> None:
    w0, w1, w2, _ = workers
    await api.put("workers-abc", [w0, w1])
    await api.put("others-xyz", [w2], service="others")  # another Service's slice in the namespace
    await api.start()
    stub = await start(api.kube_config())

    await wait_for_workers(stub, connected("w0", "w1"))
    assert await picked(stub) == {"w0", "w1"}
    [listed] = api.lists()
    assert listed["labelSelector"] == f"kubernetes.io/service-name={SERVICE}"
    await wait_until(lambda: bool(api.watches()), 5, "a watch")
    watch = api.watches()[0]
    assert (watch["resourceVersion"], watch["allowWatchBookmarks"]) == (str(api.version), "true")


async def test_a_worker_added_live_is_picked_up(
    api: FakeKubeApi, workers: list[FakeWorker], start: StartRouter
) -> None:
    w0, w1, w2, _ = workers
    await api.put("workers-abc", [w0, w1])
    await api.start()
    stub = await start(api.kube_config())
    await wait_for_workers(stub, connected("w0", "w1"))

    await api.put("workers-def", [w2])  # a second slice: ADDED
    await wait_for_workers(stub, connected("w0", "w1", "w2"))
    assert (await pick(stub, "w0", "w1")).worker_id == "w2"
    assert len(api.lists()) == 1  # seen through the watch


@pytest.mark.parametrize("how", ["not ready", "removed", "slice deleted"])
async def test_a_worker_that_leaves_is_forgotten_within_a_second(
    api: FakeKubeApi, workers: list[FakeWorker], start: StartRouter, how: str
) -> None:
    w0, w1, w2, _ = workers
    await api.put("workers-abc", [w0, w1])
    await api.put("workers-def", [w2], ready=[None])  # readiness unknown: ready
    await api.start()
    stub = await start(api.kube_config())
    await wait_for_workers(stub, connected("w0", "w1", "w2"))

    if how == "not ready":
        await api.put("workers-def", [w2], ready=[False])
    elif how == "removed":
        await api.put("workers-def", [])
    else:
        await api.delete("workers-def")
    await wait_for_workers(stub, connected("w0", "w1"), timeout=1.0)
    assert await picked(stub) == {"w0", "w1"}
    assert not [t for t in asyncio.all_tasks() if t.get_name() == f"watch {w2.address}"]


async def watching_two(api: FakeKubeApi, workers: list[FakeWorker], start: StartRouter) -> pb_grpc.RouterStub:
    """A router that found w0 and w1 in one slice and is watching for changes."""
    await api.put("workers-abc", workers[:2])
    await api.start()
    stub = await start(api.kube_config())
    await wait_for_workers(stub, connected("w0", "w1"))
    await wait_until(lambda: bool(api.watches()), 5, "a watch")
    return stub


@pytest.mark.parametrize("drop", [False, True], ids=["ended", "dropped"])
async def test_a_broken_watch_resumes_from_the_last_resource_version(
    api: FakeKubeApi, workers: list[FakeWorker], start: StartRouter, drop: bool
) -> None:
    w0, w1, w2, _ = workers
    stub = await watching_two(api, workers, start)

    # Another Service's change moves the version on; only a bookmark tells the router.
    await api.put("others-xyz", [w2], service="others")
    await api.bookmark()
    await wait_until(lambda: api.bookmarks_sent == 1, 5, "the bookmark")
    bookmarked = api.version
    await api.end_watches(drop=drop)
    await wait_until(lambda: len(api.watches()) == 2, 5, "the watch resumed")
    assert api.watches()[1]["resourceVersion"] == str(bookmarked)
    assert len(api.lists()) == 1  # resumed, not relisted

    await api.put("workers-abc", [w0, w1, w2])
    await wait_for_workers(stub, connected("w0", "w1", "w2"))


@pytest.mark.parametrize("as_http", [False, True], ids=["error event", "http"])
async def test_an_expired_resource_version_relists(
    api: FakeKubeApi, workers: list[FakeWorker], start: StartRouter, as_http: bool
) -> None:
    w0, w1, w2, _ = workers
    stub = await watching_two(api, workers, start)

    # The router's watch falls behind, the server forgets the changes it missed, the watch ends.
    api.held, api.gone_as_http = True, as_http
    await api.put("workers-abc", [w1])
    await api.put("workers-def", [w2])
    api.compact()
    await api.end_watches()
    api.held = False
    await wait_for_workers(stub, connected("w1", "w2"))
    assert len(api.lists()) == 2
    assert api.requests[-2:] == [api.lists()[-1], api.watches()[-1]]  # relisted, then watched from there
    assert api.watches()[-1]["resourceVersion"] == str(api.version)


async def test_the_router_serves_without_the_api_and_finds_the_workers_when_it_comes_up(
    api: FakeKubeApi, workers: list[FakeWorker], start: StartRouter, caplog: pytest.LogCaptureFixture
) -> None:
    w0, w1, _, _ = workers
    port = free_port()
    stub = await start(api.kube_config(f"http://127.0.0.1:{port}"))  # nothing listens there yet

    with pytest.raises(grpc.aio.AioRpcError) as refused:
        await pick(stub)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE and "no worker" in refused.value.details()
    await wait_until(lambda: any(r.name == "meshserve.router.discovery" and r.levelno == logging.WARNING
                                 and "ConnectError" in r.getMessage() for r in caplog.records), 5, "a warning")

    await api.put("workers-abc", [w0, w1])
    await api.start(port)
    await wait_for_workers(stub, connected("w0", "w1"))
