"""``meshserve health``: ask a service's standard gRPC health service whether it serves; exit 0
if it does, 1 if not. The container image's HEALTHCHECK and the compose file run it, and the
chart's probes when the mesh runs mutual TLS (Kubernetes' own gRPC probes cannot present a
certificate)."""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meshserve.services.mesh_tls import add_mesh_tls_argument, blocking_channel

ADDRESS_ENV = "MESHSERVE_HEALTH_ADDRESS"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("address", nargs="?", default=os.environ.get(ADDRESS_ENV, "127.0.0.1:50051"),
                        help=f"HOST:PORT of the service (default: ${ADDRESS_ENV}, else 127.0.0.1:50051)")
    parser.add_argument("--service", default="", help="the gRPC service to ask about ('': the whole server)")
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds to wait for the answer")
    add_mesh_tls_argument(parser)
    parser.add_argument("--peer", default="", help="with --mesh-tls-dir: the identity the service's certificate "
                        "carries (meshserve-worker, ...; a pod probing itself by 127.0.0.1); default: the address's host")


def main(args: argparse.Namespace) -> int:
    with blocking_channel(args.address, args.mesh_tls_dir, args.peer) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
        except grpc.RpcError as e:
            print(f"{args.address}: {e.code().name}: {e.details()}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{args.address}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1
