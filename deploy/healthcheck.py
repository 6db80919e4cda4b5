"""A grpc.health.v1 probe for the Docker HEALTHCHECK: exit 0 when the server answers SERVING.

    python deploy/healthcheck.py                          # 127.0.0.1:50051, the whole server
    python deploy/healthcheck.py --address host:port --service attnserve.v1.AttnServe
    python deploy/healthcheck.py --tls-ca ca.pem          # a server with --tls-cert / --tls-key

Exit codes: 0 SERVING; 1 anything else (NOT_SERVING while the server drains, UNKNOWN,
SERVICE_UNKNOWN, no server, timeout). One line on stdout says which. Needs only grpcio and
grpcio-health-checking (the `serve` extra), so it runs in the serving image.

Kubernetes does not need this script: its native `grpc:` probes speak the same protocol (in
plaintext only: with TLS on, run this script as an exec probe with --tls-ca). Health checks need
no bearer token.
"""

from __future__ import annotations

import argparse
import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

DEFAULT_ADDRESS = os.environ.get("ATTNSERVE_HEALTH_ADDRESS", "127.0.0.1:50051")
DEFAULT_TLS_CA = os.environ.get("ATTNSERVE_HEALTH_TLS_CA")
DEFAULT_TIMEOUT_S = 3.0


def check(
    address: str, service: str = "", timeout: float = DEFAULT_TIMEOUT_S, tls_ca: str | None = None
) -> tuple[bool, str]:
    """Ask ``address`` for the health of ``service`` ("" = the whole server).

    Args:
        address: host:port of the gRPC server.
        service: grpc.health.v1 service name; "" is the server as a whole.
        timeout: seconds for the whole call, connecting included.
        tls_ca: PEM root certificate to trust: probe over TLS (None: plaintext).

    Returns:
        (healthy, what the server said or why there was no answer).
    """
    if tls_ca:
        try:
            with open(tls_ca, "rb") as pem:
                credentials = grpc.ssl_channel_credentials(pem.read())
        except OSError as err:
            return False, f"cannot read --tls-ca {tls_ca}: {err.strerror}"
        channel = grpc.secure_channel(address, credentials)
    else:
        channel = grpc.insecure_channel(address)
    with channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout)
        except grpc.RpcError as err:
            return False, f"{err.code().name}: {err.details()}"
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    return reply.status == health_pb2.HealthCheckResponse.SERVING, status


def main(argv: list[str] | None = None) -> int:
    """Probe once; the exit code is the verdict."""
    parser = argparse.ArgumentParser(description="grpc.health.v1 probe: exit 0 when SERVING")
    parser.add_argument(
        "--address",
        default=DEFAULT_ADDRESS,
        help=f"host:port (default {DEFAULT_ADDRESS}; env ATTNSERVE_HEALTH_ADDRESS)",
    )
    parser.add_argument("--service", default="", help='health service name (default "": all)')
    parser.add_argument(
        "--tls-ca",
        default=DEFAULT_TLS_CA,
        help="PEM root certificate: probe over TLS (env ATTNSERVE_HEALTH_TLS_CA)",
    )
    parser.add_argument(
        "--timeout", type=float, default=DEFAULT_TIMEOUT_S, help="seconds (default 3)"
    )
    args = parser.parse_args(argv)
    healthy, said = check(args.address, args.service, args.timeout, args.tls_ca)
    print(f"{args.address} {args.service or '(server)'}: {said}")
    return 0 if healthy else 1


if __name__ == "__main__":
    sys.exit(main())
