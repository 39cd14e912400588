"""The gateway's worker channels follow the fleet: a worker whose session closed and that holds
none of this gateway's requests loses its channel when a session to another worker opens; one
with requests still on it keeps it."""

from __future__ import annotations

from meshserve.gateway.clients import Clients


async def test_channels_of_gone_idle_workers_are_closed_when_a_new_session_opens() -> None:
    clients = Clients("127.0.0.1:1", "")
    try:
        gone, busy = clients.session("10.0.0.1:50061"), clients.session("10.0.0.2:50061")
        gone.closed = busy.closed = True  # both workers left (their streams ended)
        busy._requests["r1"] = None  # type: ignore[assignment]  # one of our requests still on it
        assert clients.addresses() == ["10.0.0.1:50061", "10.0.0.2:50061"]
        assert clients.failed("10.0.0.1:50061") and clients.in_flight("10.0.0.2:50061") == 1
        clients.session("10.0.0.3:50061")  # a new worker (a pod scaled out)
        assert clients.addresses() == ["10.0.0.2:50061", "10.0.0.3:50061"]
        assert not clients.failed("10.0.0.1:50061")  # forgotten: no session, so not known to have failed
    finally:
        await clients.close()
