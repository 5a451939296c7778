"""``vflnet health ADDR``: ask a vflnet process's standard gRPC health service whether it serves.

Exit 0 when the answer is SERVING, 1 otherwise (unreachable, TLS refused, NOT_SERVING...), so it
can be a Docker HEALTHCHECK, a compose ``healthcheck`` or a Kubernetes exec probe. On a mutual-TLS
deployment pass the checking container's own party certificate with ``--ca/--cert/--key``.
``--wait SECONDS`` keeps asking until the answer is SERVING: a Kubernetes init container uses it to
start a party only once the coordinator serves (Kubernetes has no compose-style depends_on).

Compose and Kubernetes run it every few seconds in every container, so it imports only grpc and
the health stubs (no vflnet.wire.tls, whose cryptography import alone costs more than the check):
docs/performance.md has the figures.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflnet health", description="gRPC health check of one vflnet process."
    )
    parser.add_argument("address", metavar="ADDR", help="HOST:PORT of the process")
    parser.add_argument(
        "--service", default="", help="health service name to ask about (default: whole server)"
    )
    parser.add_argument("--timeout", type=float, default=3.0, help="seconds before giving up (default 3)")
    parser.add_argument(
        "--wait", type=float, default=0.0, help="retry for up to this many seconds (default 0)"
    )
    parser.add_argument("--ca", help="CA certificate (mutual TLS); needs --cert and --key too")
    parser.add_argument("--cert", help="this caller's certificate (mutual TLS)")
    parser.add_argument("--key", help="this caller's private key (mutual TLS)")
    return parser


def check(
    address: str,
    *,
    service: str = "",
    timeout: float = 3.0,
    credentials: grpc.ChannelCredentials | None = None,
) -> str:
    """The health status name reported by ``address`` (e.g. ``SERVING``); raises grpc.RpcError."""
    channel = (
        grpc.insecure_channel(address) if credentials is None else grpc.secure_channel(address, credentials)
    )
    with channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
        )
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    tls_args = (args.ca, args.cert, args.key)
    if any(tls_args) and not all(tls_args):
        parser.error("--ca, --cert and --key go together")
    credentials = None
    if all(tls_args):
        try:
            root, cert, key = (Path(p).read_bytes() for p in tls_args)
        except OSError as exc:
            parser.error(f"cannot read {exc.filename}: {exc.strerror}")
        credentials = grpc.ssl_channel_credentials(
            root_certificates=root, private_key=key, certificate_chain=cert
        )
    give_up = time.monotonic() + args.wait
    while True:
        try:
            status = check(args.address, service=args.service, timeout=args.timeout, credentials=credentials)
            problem = "" if status == "SERVING" else status
        except grpc.RpcError as err:
            problem = f"{err.code().name}: {err.details()}"
        if not problem:
            print(f"{args.address}: SERVING")
            return 0
        if time.monotonic() >= give_up:
            print(f"{args.address}: {problem}", file=sys.stderr)
            return 1
        time.sleep(1.0)


if __name__ == "__main__":
    sys.exit(main())
