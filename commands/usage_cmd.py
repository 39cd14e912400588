"""``meshserve usage``: the usage ledger per tenant (what the clients were sent, by how it was
answered), as a gateway reads it from the mesh's Redis, summed across the gateways."""

from __future__ import annotations

import argparse
import json
import sys

import grpc

from meshserve.services.gen import meshserve_pb2 as pb
from meshserve.services.gen import meshserve_pb2_grpc as pb_grpc
from meshserve.services.mesh_tls import add_mesh_tls_argument, blocking_channel

KINDS = ("requests", "prompt_tokens", "completion_tokens", "cached_prompt_tokens")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default="127.0.0.1:50051",
                        help="a gateway's gRPC address HOST:PORT (its own port, not Envoy's; default: 127.0.0.1:50051)")
    parser.add_argument("--tenant", default="", help="only this tenant")
    parser.add_argument("--json", action="store_true", help="print JSON (tenant -> how answered -> counts) for scripts")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for the gateway")
    add_mesh_tls_argument(parser)


def as_json(report: pb.UsageReport) -> dict[str, object]:
    tenants: dict[str, dict[str, dict[str, int]]] = {}
    for row in report.usage:
        tenants.setdefault(row.tenant, {})[row.answered] = {kind: getattr(row, kind) for kind in KINDS}
    return {"shared": report.shared, "tenants": tenants}


def table(report: pb.UsageReport) -> str:
    """One line per tenant and way of answering, then the tenant's total."""
    head = ("tenant", "answered", "requests", "prompt", "completion", "cached prompt")
    rows: list[tuple[str, ...]] = []
    by_tenant: dict[str, list[pb.TenantUsage]] = {}
    for row in report.usage:
        by_tenant.setdefault(row.tenant, []).append(row)
    for tenant, usage in by_tenant.items():
        for row in usage:
            rows.append((tenant or "-", row.answered, *(str(getattr(row, k)) for k in KINDS)))
        rows.append((tenant or "-", "total", *(str(sum(getattr(r, k) for r in usage)) for k in KINDS)))
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in [head, *rows]]
    where = "summed across the gateways" if report.shared else "this gateway's alone (it has no Redis)"
    return "\n".join([*lines, f"({where})"])


def main(args: argparse.Namespace) -> int:
    with blocking_channel(args.target, args.mesh_tls_dir) as channel:
        try:
            report = pb_grpc.GatewayAdminStub(channel).Usage(pb.UsageRequest(tenant=args.tenant), timeout=args.timeout)
        except grpc.RpcError as e:
            print(f"{args.target}: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    print(json.dumps(as_json(report), indent=2) if args.json else table(report))
    return 0
