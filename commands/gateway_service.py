"""`meshserve serve gateway`: the gateway, and with ``--router embedded`` the router's parts in its
process. The command line puts them together: a service folder imports only itself and the
shared runtime (tests/unit/test_layout.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshserve.gateway import server as gateway
from meshserve.services.config import EMBEDDED_ROUTER, GatewayConfig
from meshserve.services.server import Running

if TYPE_CHECKING:
    from meshserve.router.server import RouterCore


def router_for(cfg: GatewayConfig) -> RouterCore | None:
    """The router's parts the gateway picks with, when ``cfg`` embeds them (imported only then:
    a gateway that asks the router service exports none of the router's metrics)."""
    if cfg.router != EMBEDDED_ROUTER:
        return None
    from meshserve.router.server import RouterCore

    return RouterCore(cfg)


async def start(cfg: GatewayConfig) -> Running:
    """Starts the gateway as `meshserve serve gateway` does (tests run it on port 0)."""
    return await gateway.start_gateway(cfg, router_for(cfg))


async def main(cfg: GatewayConfig) -> None:
    await gateway.main(cfg, router_for(cfg))
