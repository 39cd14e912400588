"""Fixtures shared by the service tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.server import Running, insecure_channel
from meshserve.worker.server import WorkerServicer


@pytest.fixture
async def stub(worker: tuple[Running, WorkerServicer]) -> AsyncIterator[pb_grpc.WorkerStub]:
    """A stub on the module's ``worker`` fixture (each worker test module starts its own)."""
    async with insecure_channel(f"127.0.0.1:{worker[0].port}") as channel:
        yield pb_grpc.WorkerStub(channel)
