"""Bind a mod chain to real gRPC: the hooks the chunking layers run on every call, and interceptors.

``ServerChainHook`` and ``ClientChainHook`` are a party's chain bound to its name; they turn a mod's
refusal into a failed call (:class:`RefusedCall`) with its status. A party's own servers and channels
run them inside the chunking layer that already wraps every vflnet call (vflnet/wire/chunking.py,
``hook=``), so a non-empty chain adds no gRPC interceptor layer of its own: measured, the two layers
cost ~0.14 ms of CPU per round trip (docs/performance.md). ``ServerChainInterceptor`` and
``intercept_channel`` put the same hooks on any gRPC server or channel (and the loopback bridge's).

Server side: the request event runs before the servicer, so a rewrite changes what the servicer
receives; the response event runs on the servicer's reply, so a rewrite changes what the caller gets.
Client side: the request event runs before sending and the response event on the reply, as soon as it
arrives; the caller's stub returns the rewritten reply (blocking calls, ``with_call`` and ``future``).

Errors from the real call pass through unchanged. A mod raising :class:`Refused` fails the call with
its status code; on the client side the caller sees a ``grpc.RpcError`` like any other failed call.
Only unary-unary methods run through the chain (every logical vflnet RPC is); other arities are left
alone. Mods always see whole messages: chunks are split below the client hook and joined above the
server hook.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from time import time as _now
from typing import Any

import grpc
from google.protobuf.message import Message

from vflnet.interceptors.chain import Chain, Refused
from vflnet.interceptors.events import Direction, Side, WireEvent, WireRecord
from vflnet.wire.calls import FailedCall, SettledCall
from vflnet.wire.chunking import serve_with_hook

# gRPC health checks (heartbeats, `vflnet health`, probes) pass no mod: taps and attacks see the run's
# messages only, and a traced run holds the same messages whatever the heartbeat interval
HEALTH_METHODS = "/grpc.health.v1.Health/"


def _method_name(method: str | bytes) -> str:
    return method.decode() if isinstance(method, bytes) else method


class RefusedCall(FailedCall):
    """A call a local mod refused: a finished, failed call with the refusal's status."""


class _ChainHook:
    """A party's chain bound to its name. Each message is passed on untouched when the chain's gate
    lets it by (before an event is built), handed to the chain's lone recorder (the trace tap: no
    event to build), or run through the chain as an event."""

    def __init__(self, chain: Chain, party: str) -> None:
        self.chain = chain
        self.party = party
        self.passes = chain.passes
        self.record = None if chain.recorder is None else chain.recorder.record

    def skips(self, message: Message) -> bool:
        """Whether the chain's gate lets ``message`` by (the chunking layer then serves a request's call
        as a server without a hook does)."""
        return self.passes is not None and self.passes(message)

    def _run(
        self, direction: Direction, side: Side, method: str, peer: str, message: Message, data: bytes | None
    ) -> Message:
        if self.skips(message):
            return message
        if self.record is not None:
            self.record(WireRecord(direction, side, method, self.party, peer, message, data, _now()))
            return message
        try:
            return self.chain(WireEvent(direction, side, method, self.party, peer, message, data=data))
        except Refused as exc:
            whose = "its own" if side == "client" and direction == "request" else "the"
            raise RefusedCall(
                exc.code, f"{self.party} refused {whose} {method} {direction}: {exc.reason}"
            ) from exc


class ServerChainHook(_ChainHook):
    """``chain`` on what party ``party``'s server receives and answers (side "server"). Raises
    :class:`RefusedCall` for a refused message; the server answers the call with its status."""

    def request(self, method: str, message: Message, peer: str, data: bytes | None = None) -> Message:
        return self._run("request", "server", method, peer, message, data)

    def response(self, method: str, message: Message, peer: str, data: bytes | None = None) -> Message:
        return self._run("response", "server", method, peer, message, data)


class ClientChainHook(_ChainHook):
    """``chain`` on what party ``party`` sends to ``target`` and gets back (side "client"). Raises
    :class:`RefusedCall` for a refused message; the caller sees it as the call's error."""

    def __init__(self, chain: Chain, party: str, target: str) -> None:
        super().__init__(chain, party)
        self.target = target

    def request(self, method: str, message: Message, data: bytes | None = None) -> Message:
        return self._run("request", "client", method, self.target, message, data)

    def response(self, method: str, message: Message, data: bytes | None = None) -> Message:
        return self._run("response", "client", method, self.target, message, data)


class ServerChainInterceptor(grpc.ServerInterceptor):
    """Runs ``chain`` on every unary-unary request and response this server handles (side "server");
    for a server whose chunking layer does not run the hook itself (the loopback bridge's)."""

    def __init__(self, chain: Chain, party: str) -> None:
        self.chain = chain
        self.hook = ServerChainHook(chain, party)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None or handler.unary_unary is None or not len(self.chain):
            return handler
        method = _method_name(handler_call_details.method)
        if method.startswith(HEALTH_METHODS):  # the transport's heartbeats, not a message of the run
            return handler
        return grpc.unary_unary_rpc_method_handler(
            functools.partial(serve_with_hook, self.hook, method, handler.unary_unary),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _intercepted(inner: Any, on_response: Callable[[Message], Message]) -> SettledCall:
    """The real call ``inner``, settled once with its reply after the response chain, as soon as the
    reply arrives (so a response tap runs even if the caller never reads the result), or with the real
    call's error unchanged (the same object). A mod's refusal (:class:`RefusedCall`) fails the call
    with its status; a mod's own bug is re-raised as is by result() and the call's code is UNKNOWN."""

    def outcome() -> Message:
        try:
            error = inner.exception()
        except grpc.FutureCancelledError:  # a cancelled gRPC future has no error of its own
            error = FailedCall(inner.code(), inner.details())
        if error is not None:
            raise error
        return on_response(inner.result())

    def wait(timeout: float | None) -> None:
        try:
            inner.exception(timeout)  # raises grpc.FutureTimeoutError
        except grpc.FutureCancelledError:
            pass
        call.settle_with(outcome)  # the caller settles it without waiting for the callback thread

    call = SettledCall(cancel=inner.cancel, wait=wait)
    inner.add_done_callback(lambda _: call.settle_with(outcome))  # at once if the call is done already
    return call


class ClientChainInterceptor(grpc.UnaryUnaryClientInterceptor):
    """Runs ``chain`` on every request this channel sends and every reply it gets (side "client").

    Install with ``grpc.intercept_channel(channel, ClientChainInterceptor(chain, party, target))``;
    ``target`` is the address the channel dials, recorded as the events' peer.
    """

    def __init__(self, chain: Chain, party: str, target: str) -> None:
        self.chain = chain
        self.hook = ClientChainHook(chain, party, target)

    def intercept_unary_unary(
        self,
        continuation: Callable[[grpc.ClientCallDetails, Any], Any],
        client_call_details: grpc.ClientCallDetails,
        request: Any,
    ) -> Any:
        if not len(self.chain):
            return continuation(client_call_details, request)
        method = _method_name(client_call_details.method)
        try:
            request = self.hook.request(method, request)
        except RefusedCall as exc:
            return exc
        return _intercepted(
            continuation(client_call_details, request), functools.partial(self.hook.response, method)
        )


def intercept_channel(channel: grpc.Channel, chain: Chain, party: str, target: str) -> grpc.Channel:
    """``channel`` with ``chain`` on it; the channel itself is returned unchanged when the chain is empty."""
    if not len(chain):
        return channel
    return grpc.intercept_channel(channel, ClientChainInterceptor(chain, party, target))
