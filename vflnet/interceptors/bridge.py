"""How roles reach each other: a ``Bridge`` makes servers, binds them and opens channels.

Two implementations with one surface, so no role or protocol knows which one it runs on:

- ``GrpcBridge``: real gRPC between processes (TLS and chunking from the transport config);
- ``LoopbackBridge``: every role in one process (vflnet/wire/loopback.py), messages still serialized
  through protobuf and through the same interceptor chains.

Either way a party's mod chain (trace tap, attacks) sits on its server and on every channel it opens.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import grpc
from grpc_health.v1 import health_pb2

from vflnet.config import TransportConfig
from vflnet.interceptors.chain import Chain
from vflnet.interceptors.events import METHODS
from vflnet.interceptors.grpc_adapters import (
    ClientChainHook,
    ServerChainHook,
    ServerChainInterceptor,
    intercept_channel,
)
from vflnet.wire.channels import bind as grpc_bind
from vflnet.wire.channels import enable_reflection
from vflnet.wire.channels import make_server as grpc_server
from vflnet.wire.channels import open_channel as grpc_channel
from vflnet.wire.decoding import lenient_parser
from vflnet.wire.errors import handle_errors
from vflnet.wire.loopback import LoopbackHub

Handler = Callable[[Any, Any], Any]  # (request, context) -> response


class Server(Protocol):
    def add_generic_rpc_handlers(self, handlers: Any) -> None: ...
    def start(self) -> None: ...
    def stop(self, grace: float | None) -> Any: ...


class Bridge(Protocol):
    def make_server(self, name: str, chain: Chain) -> Server: ...

    def bind(self, server: Server, name: str, listen: str, advertise: str = "") -> str:
        """Bind ``server`` of party ``name`` and return the address peers dial."""
        ...

    def open_channel(self, address: str, name: str, chain: Chain, peer: str = "") -> grpc.Channel:
        """A channel from party ``name`` to ``address``; under TLS, ``peer`` (a roster name) is the
        identity the server's certificate must carry."""
        ...


def add_handlers(server: Server, handlers: dict[str, Handler]) -> None:
    """Serve unary methods by full name (``/vflnet.v1.Active/ExchangeEmbeddings``): each handler's
    message classes come from the method table (vflnet/interceptors/events.py), and its errors become
    gRPC statuses (vflnet/wire/errors.py), so a bad message fails one call and the server keeps serving."""
    by_service: dict[str, dict[str, grpc.RpcMethodHandler]] = {}
    for method, fn in handlers.items():
        if method not in METHODS:
            raise KeyError(f"unknown method {method}: not in any registered service")
        request_cls, response_cls = METHODS[method]
        service, name = method.lstrip("/").rsplit("/", 1)
        by_service.setdefault(service, {})[name] = grpc.unary_unary_rpc_method_handler(
            handle_errors(fn, name),
            request_deserializer=lenient_parser(request_cls),
            response_serializer=response_cls.SerializeToString,
        )
    health = getattr(server, "health_servicer", None)
    for service, methods in by_service.items():
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, methods),))
        if health is not None:  # per-service health (and reflection) for what this server really serves
            health.set(service, health_pb2.HealthCheckResponse.SERVING)
            server.served_services.add(service)


def allow_step_deadline(server: Server, seconds: float) -> None:
    """Let chunked calls to ``server`` ask for the run's step deadline (known on admission); a
    loopback server chunks nothing."""
    chunking = getattr(server, "chunking", None)
    if chunking is not None:
        chunking.allow_deadline(seconds)


def unary(channel: grpc.Channel, method: str) -> grpc.UnaryUnaryMultiCallable:
    """A client callable for a unary method by full name, its message classes from the method table."""
    request_cls, response_cls = METHODS[method]
    return channel.unary_unary(
        method,
        request_serializer=request_cls.SerializeToString,
        response_deserializer=response_cls.FromString,
    )


class GrpcBridge:
    def __init__(self, transport: TransportConfig) -> None:
        self.transport = transport

    def make_server(self, name: str, chain: Chain) -> grpc.Server:
        # the chain runs inside the chunking layer that wraps every call anyway (no layer of its own)
        return grpc_server(self.transport, name, hook=ServerChainHook(chain, name) if len(chain) else None)

    def bind(self, server: grpc.Server, name: str, listen: str, advertise: str = "") -> str:
        if self.transport.reflection:  # every service is registered by now, and the server not started
            enable_reflection(server, sorted(server.served_services))
        port = grpc_bind(server, listen, self.transport, name)
        if advertise and not advertise.endswith(":0"):
            return advertise
        host = (advertise or listen).rsplit(":", 1)[0]
        if host in ("0.0.0.0", "[::]", ""):
            host = "127.0.0.1"
        return f"{host}:{port}"

    def open_channel(self, address: str, name: str, chain: Chain, peer: str = "") -> grpc.Channel:
        hook = ClientChainHook(chain, name, address) if len(chain) else None
        return grpc_channel(address, self.transport, name, peer, hook)


class LoopbackBridge:
    def __init__(self, hub: LoopbackHub | None = None) -> None:
        self.hub = hub or LoopbackHub()

    def make_server(self, name: str, chain: Chain) -> Any:
        return self.hub.server(name, [ServerChainInterceptor(chain, name)] if len(chain) else [])

    def bind(self, server: Any, name: str, listen: str, advertise: str = "") -> str:
        return server.bind()

    def open_channel(self, address: str, name: str, chain: Chain, peer: str = "") -> grpc.Channel:
        return intercept_channel(self.hub.channel(address, name), chain, name, address)
