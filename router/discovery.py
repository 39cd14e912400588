"""Kubernetes discovery: the router's workers are the ready endpoints of a headless Service, read
from the Service's EndpointSlices by a list and then a watch from the list's resourceVersion."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import httpx2
from lightkube import KubeConfig
from lightkube.config import client_adapter

log = logging.getLogger(__name__)

SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # set on its slices by the EndpointSlice controller
NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
API_TIMEOUT_S = 10.0
# The server ends each watch after this long (and the watch is resumed); a stream silent for longer
# than that is a dead connection.
WATCH_TIMEOUT_S = 300

Slice = Mapping[str, Any]  # an EndpointSlice, as the API's JSON has it


def own_namespace(path: Path = NAMESPACE_FILE) -> str:
    """The namespace of the pod this runs in (its service account's), else "default"."""
    try:
        return path.read_text().strip() or "default"
    except OSError:
        return "default"


def api_client(config: KubeConfig | None = None) -> httpx2.AsyncClient:
    """An HTTP client of the API server, authenticated by lightkube from ``config``, else from the
    pod's service account, else from $KUBECONFIG or ~/.kube/config."""
    single = (config or KubeConfig.from_env()).get()
    params = client_adapter.ConnectionParams(timeout=httpx2.Timeout(API_TIMEOUT_S))
    return client_adapter.AsyncClient(single, params)


def slice_addresses(endpoint_slice: Slice, port_name: str) -> list[str]:
    """host:port of each ready endpoint of the slice, on its port named ``port_name`` (none when it
    has no such port). Readiness not given counts as ready, as Kubernetes says it should."""
    port = next(
        (p.get("port") for p in endpoint_slice.get("ports") or () if (p.get("name") or "") == port_name), None
    )
    if port is None:
        return []
    addresses = []
    for endpoint in endpoint_slice.get("endpoints") or ():
        if (endpoint.get("conditions") or {}).get("ready") is False:
            continue
        for ip in endpoint.get("addresses") or ():
            addresses.append(f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}")
    return addresses


class Expired(Exception):
    """The API server no longer has the resourceVersion asked for (410 Gone): relist."""


class ApiError(Exception):
    """The API server refused a request, or ended a watch with an error."""


class EndpointSliceDiscovery:
    """Follows the EndpointSlices of one Service and calls ``on_change`` with all the ready worker
    addresses whenever they change.

    It lists the slices, then watches them from the list's resourceVersion. A watch the server
    ends, or that breaks, is resumed from the last resourceVersion it delivered (bookmarks
    included), so no change is missed; a resourceVersion the server has forgotten (410 Gone)
    means a relist. Each restart first waits a backoff that doubles up to ``max_backoff_s`` and
    drops back to ``initial_backoff_s`` once a watch delivers an event: an API server that keeps
    failing is not hammered, a working one is resumed within ``initial_backoff_s``.

    It drives the list and watch itself over lightkube's authenticated HTTP client: lightkube's
    own watch (1.0) fails on an EndpointSlice BOOKMARK (it has no addressType to decode), resumes
    an ended watch unlogged and with no backoff, and, told to retry a 410, watches again with no
    resourceVersion: the server replays what exists as ADDED, never what was deleted meanwhile.
    """

    def __init__(
        self,
        client: httpx2.AsyncClient,
        namespace: str,
        service: str,
        port_name: str,
        on_change: Callable[[list[str]], Awaitable[None]],
        initial_backoff_s: float = 0.2,
        max_backoff_s: float = 10.0,
    ) -> None:
        self._client = client
        self._path = f"apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
        self._selector = f"{SERVICE_NAME_LABEL}={service}"
        self._port_name = port_name
        self._on_change = on_change
        self._initial_backoff_s = initial_backoff_s
        self._max_backoff_s = max_backoff_s
        self._what = f"Service {namespace}/{service}"
        self._slices: dict[str, Slice] = {}  # by name
        self._version = ""  # the last resourceVersion seen; "" lists first
        self._delivered = False  # a watch delivered an event since the last restart
        self._addresses: list[str] | None = None  # as last given to on_change
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"discovery {self._what}")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self._client.aclose()

    async def _run(self) -> None:
        backoff = self._initial_backoff_s
        while True:
            try:
                if not self._version:
                    await self._list()
                started = time.monotonic()
                await self._watch()
                if self._delivered or time.monotonic() - started >= WATCH_TIMEOUT_S / 2:
                    # The API server ends every watch after timeoutSeconds: resume at once, quietly.
                    log.debug("EndpointSlices of %s: the watch ended; resuming from resourceVersion %s",
                              self._what, self._version)
                    backoff, self._delivered = self._initial_backoff_s, False
                    continue
                problem = "the server ended the watch at once, with no event"
            except Expired as e:
                problem = f"resourceVersion {self._version} expired ({e}); relisting"
                self._version = ""
            except (httpx2.HTTPError, ApiError) as e:
                problem = f"{type(e).__name__}: {e}"
            except Exception:  # a malformed object, or a bug: start again from a fresh list
                log.exception("following the EndpointSlices of %s failed", self._what)
                problem = "unexpected failure; relisting"
                self._version = ""
            if self._delivered:
                backoff, self._delivered = self._initial_backoff_s, False
            log.warning("EndpointSlices of %s: %s; retrying in %.1fs from resourceVersion %s",
                        self._what, problem, backoff, self._version or "none (list)")
            await asyncio.sleep(backoff)
            backoff = min(2 * backoff, self._max_backoff_s)

    async def _list(self) -> None:
        response = await self._client.get(self._path, params={"labelSelector": self._selector})
        await _raise_for_status(response)
        body = response.json()
        self._slices = {s["metadata"]["name"]: s for s in body.get("items") or ()}
        self._version = body["metadata"]["resourceVersion"]
        await self._apply()

    async def _watch(self) -> None:
        """Applies the watch's events from ``_version`` on, until the server ends it."""
        params = {
            "labelSelector": self._selector, "watch": "true", "resourceVersion": self._version,
            "allowWatchBookmarks": "true", "timeoutSeconds": str(WATCH_TIMEOUT_S),
        }
        timeout = httpx2.Timeout(API_TIMEOUT_S, read=WATCH_TIMEOUT_S + API_TIMEOUT_S)
        async with self._client.stream("GET", self._path, params=params, timeout=timeout) as response:
            await _raise_for_status(response)
            async for line in response.aiter_lines():
                if line:
                    await self._event(json.loads(line))

    async def _event(self, event: Mapping[str, Any]) -> None:
        kind, obj = event["type"], event["object"]
        if kind == "ERROR":  # the object is a Status
            if obj.get("code") == 410:
                raise Expired(obj.get("message", ""))
            raise ApiError(f"watch error {obj.get('code')}: {obj.get('message', '')}")
        if kind in ("ADDED", "MODIFIED"):
            self._slices[obj["metadata"]["name"]] = obj
        elif kind == "DELETED":
            self._slices.pop(obj["metadata"]["name"], None)
        self._version = obj["metadata"]["resourceVersion"]  # a BOOKMARK carries only this
        self._delivered = True
        await self._apply()

    async def _apply(self) -> None:
        addresses = sorted({a for s in self._slices.values() for a in slice_addresses(s, self._port_name)})
        if addresses != self._addresses:
            self._addresses = addresses
            log.info("%s: %d ready workers: %s", self._what, len(addresses), " ".join(addresses) or "none")
            await self._on_change(addresses)


async def _raise_for_status(response: httpx2.Response) -> None:
    """Raises Expired for 410 Gone, ApiError for any other failure, with the API server's message."""
    if response.is_success:
        return
    await response.aread()
    try:
        message = response.json().get("message", "")
    except ValueError:
        message = response.text[:200]
    if response.status_code == 410:
        raise Expired(message)
    raise ApiError(f"HTTP {response.status_code}: {message}")
