"""gRPC servers and channels with the project's limits, and TLS when the config turns it on.

Messages over ``transport.max_message_mb`` travel in chunks (vflnet/wire/chunking.py): every server
made here and every channel opened here do that on their own.

Plaintext is allowed on loopback; to any other address it needs ``transport.allow_plaintext_remote``
and logs a warning, because everything on such a channel can be read and rewritten by anyone on the path.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from collections.abc import Iterable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from vflnet.config import TransportConfig
from vflnet.wire.chunking import (
    ChunkingChannel,
    ChunkingInterceptor,
    ClientHook,
    Limits,
    ServerHook,
    payload_error,
)

log = logging.getLogger(__name__)


def grpc_options(transport: TransportConfig) -> list[tuple[str, int]]:
    limit = int(transport.max_message_mb * 1024 * 1024)
    return [
        ("grpc.max_send_message_length", limit),
        ("grpc.max_receive_message_length", limit),
        ("grpc.so_reuseport", 0),
    ]


# A step command is retried, with backoff, when the party was briefly unreachable (UNAVAILABLE: a
# dropped connection, a proxy restarting): RunStep is idempotent, because a party answers a repeated
# step header from its stored report of that step (vflnet/roles/party.py) instead of running it again.
RETRIES = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "vflnet.v1.Party", "method": "RunStep"}],
                "retryPolicy": {
                    "maxAttempts": 3,
                    "initialBackoff": "0.1s",
                    "maxBackoff": "1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


def channel_options(transport: TransportConfig) -> list[tuple[str, int | str]]:
    return [*grpc_options(transport), ("grpc.service_config", RETRIES), ("grpc.enable_retries", 1)]


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host in ("localhost", ""):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _tls_files(transport: TransportConfig, name: str) -> tuple[bytes, bytes, bytes]:
    tls = transport.tls
    paths = [Path(tls.ca), Path(tls.cert.format(name=name)), Path(tls.key.format(name=name))]
    for label, path in zip(("ca", "cert", "key"), paths, strict=True):
        if not path.is_file():
            raise FileNotFoundError(
                f"transport.tls.{label}: {path} does not exist (make certificates with `vflnet certs`)"
            )
    return paths[0].read_bytes(), paths[1].read_bytes(), paths[2].read_bytes()


MAX_STREAMS = 8  # chunked calls one server reads at once, at most


def make_server(
    transport: TransportConfig, name: str, max_workers: int | None = None, hook: ServerHook | None = None
) -> grpc.Server:
    """``hook`` (a party's mod chain) runs in the chunking layer on every vflnet call, after the role
    check: no interceptor layer of its own. The chunking layer resolves each method's handler once,
    so no interceptor here may choose a handler by anything but the method's name.

    ``max_workers`` threads (default: ``transport.max_concurrent_rpcs``, so every call the server admits
    has a thread: a call that waits for others, a join for the roster or embeddings for the step, never
    holds the last thread the calls it waits for need; threads start as calls come); a quarter of
    them, at most ``MAX_STREAMS``, read chunked streams."""
    threads = transport.max_concurrent_rpcs if max_workers is None else max_workers
    chain: list[grpc.ServerInterceptor] = []
    authorize = None
    if transport.tls.enabled:
        from vflnet.wire.tls import RoleAuthorizer

        authorizer = RoleAuthorizer()  # vflnet's permissions, every built-in protocol's included
        chain.insert(0, authorizer)  # identity first, before any tap or attack
        authorize = authorizer.check
    # outermost: the rest sees whole messages; it runs the role check itself before reading a stream
    chunking = ChunkingInterceptor(
        Limits.of(transport), authorize, max_streams=max(1, min(threads // 4, MAX_STREAMS)), hook=hook
    )
    chain.insert(0, chunking)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"{name}-rpc"),
        interceptors=chain,
        maximum_concurrent_rpcs=transport.max_concurrent_rpcs,
        # no SO_REUSEPORT (gRPC's default): a second process binding a party's port would silently
        # share, and so receive some of, that party's traffic
        options=[*grpc_options(transport), ("grpc.so_reuseport", 0)],
    )
    server.health_servicer = add_standard_services(server)  # type: ignore[attr-defined]
    server.chunking = chunking  # type: ignore[attr-defined]
    server.served_services = set()  # type: ignore[attr-defined]  # filled by add_handlers
    return server


def add_standard_services(server: grpc.Server) -> Any:
    """gRPC health checking (grpc_health_probe, `vflnet health`); returns the health servicer, which
    ``vflnet.interceptors.bridge.add_handlers`` marks SERVING for every service it registers."""
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    return health_servicer


def enable_reflection(server: grpc.Server, services: Iterable[str]) -> None:
    """Server reflection (grpcurl) listing the services this server serves, under v1alpha and v1
    (grpcio-reflection implements v1alpha; v1's messages are the same on the wire)."""
    from grpc_health.v1 import health
    from grpc_reflection.v1alpha import reflection, reflection_pb2

    v1 = "grpc.reflection.v1.ServerReflection"
    servicer = reflection.ReflectionServicer([*services, health.SERVICE_NAME, reflection.SERVICE_NAME, v1])
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    for name in (reflection.SERVICE_NAME, v1):
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(name, {"ServerReflectionInfo": handler}),)
        )


def stop_server(server: Any, grace: float) -> None:
    """Stop serving, waiting at most ``grace`` + 5 s: a stream stuck in a handler (undecodable
    reflection requests did this) must never keep a finished role from exiting."""
    if not server.stop(grace).wait(grace + 5.0):
        log.warning("the server did not stop within %.0f s; leaving its stuck calls behind", grace + 5.0)


def bind(server: grpc.Server, address: str, transport: TransportConfig, name: str) -> int:
    """Bind ``host:port`` (port 0 = any free port) and return the port actually bound."""
    try:
        if transport.tls.enabled:
            from vflnet.wire.tls import server_credentials

            port = server.add_secure_port(address, server_credentials(*_tls_files(transport, name)))
        else:
            if not is_loopback(address):
                _check_plaintext_allowed(address, transport)
            port = server.add_insecure_port(address)
    except RuntimeError:  # grpc's "Failed to bind"
        port = 0
    if port == 0:
        raise BindError(
            f"{name} cannot listen on {address}: the port is in use or the address is not this machine's"
        )
    return port


class BindError(OSError):
    pass


def _check_plaintext_allowed(address: str, transport: TransportConfig) -> None:
    if not transport.allow_plaintext_remote:
        raise PlaintextRefused(
            f"plaintext gRPC on non-loopback address {address}: enable transport.tls or set "
            "transport.allow_plaintext_remote: true"
        )
    log.warning("PLAINTEXT gRPC on %s: anyone on the network path can read and alter this traffic", address)


def open_channel(
    address: str, transport: TransportConfig, name: str, peer: str = "", hook: ClientHook | None = None
) -> grpc.Channel:
    """A channel from party ``name`` to ``address``, with ``hook`` (its mod chain) on every vflnet call.
    Under TLS with ``peer`` (a roster name) the server must present that party's certificate: every
    party certificate names its party in its SANs, and all of them also hold localhost, so checking
    the dialled host alone would accept any party."""
    if transport.tls.enabled:
        from vflnet.wire.tls import channel_credentials

        options = channel_options(transport)
        if peer:
            options.append(("grpc.ssl_target_name_override", peer))
        channel = grpc.secure_channel(
            address, channel_credentials(*_tls_files(transport, name)), options=options
        )
    else:
        if not is_loopback(address):
            _check_plaintext_allowed(address, transport)
        channel = grpc.insecure_channel(address, options=channel_options(transport))
    return ChunkingChannel(channel, Limits.of(transport), hook)


def check_message_size(msg: Message, transport: TransportConfig, what: str) -> int:
    """Fail before sending a message over ``transport.max_payload_mb``, with an error that names the
    setting (a message over ``max_message_mb`` but under this travels in chunks); returns its size,
    which the meter takes instead of serializing the message again."""
    size = msg.ByteSize()
    error = payload_error(size, Limits.of(transport), what)
    if error:
        raise MessageTooLarge(f"{error} (or use a smaller batch)")
    return size


class PlaintextRefused(PermissionError):
    pass


class MessageTooLarge(ValueError):
    pass
