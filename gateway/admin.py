"""The gateway's operators' service (GatewayAdmin): the usage ledger, read on the gateway's own
port (Envoy does not route it)."""

from __future__ import annotations

import grpc
import redis.exceptions

from meshserve.gateway.ledger import ANSWERS, Ledger
from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["GatewayAdmin"].full_name


class GatewayAdminServicer(pb_grpc.GatewayAdminServicer):
    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    async def Usage(self, request: pb.UsageRequest, context: grpc.aio.ServicerContext) -> pb.UsageReport:
        try:
            ledger = await self._ledger.read()
        except (redis.exceptions.RedisError, OSError, TimeoutError) as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"the usage ledger's Redis did not answer: {e}")
            raise  # unreachable: abort raises
        report = pb.UsageReport(shared=self._ledger.shared)
        order = {answered: i for i, answered in enumerate(ANSWERS)}
        for tenant in sorted(ledger):
            if request.tenant and tenant != request.tenant:
                continue
            for answered, t in sorted(ledger[tenant].items(), key=lambda kv: order.get(kv[0], len(order))):
                report.usage.append(pb.TenantUsage(
                    tenant=tenant, answered=answered, requests=t.requests, prompt_tokens=t.prompt_tokens,
                    completion_tokens=t.completion_tokens, cached_prompt_tokens=t.cached_prompt_tokens))
        return report
