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
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any

import grpc
from google.protobuf.message import Message

from vflnet.interceptors.chain import Chain, Refused
from vflnet.interceptors.events import WireEvent
from vflnet.wire.chunking import FailedCall, serve_with_hook

# gRPC health checks (heartbeats, `vflnet health`, probes) pass no mod: taps and attacks see the run's
# messages only, and a traced run holds the same messages whatever the heartbeat interval
HEALTH_METHODS = "/grpc.health.v1.Health/"


def _method_name(method: str | bytes) -> str:
    return method.decode() if isinstance(method, bytes) else method


class RefusedCall(FailedCall):
    """A call a local mod refused: a finished, failed call with the refusal's status."""


class ServerChainHook:
    """``chain`` on what party ``party``'s server receives and answers (side "server"). Raises
    :class:`RefusedCall` for a refused message; the server answers the call with its status."""

    def __init__(self, chain: Chain, party: str) -> None:
        self.chain = chain
        self.party = party

    def request(self, method: str, message: Message, peer: str) -> Message:
        try:
            return self.chain(WireEvent("request", "server", method, self.party, peer, message))
        except Refused as exc:
            raise RefusedCall(exc.code, f"{self.party} refused the {method} request: {exc.reason}") from exc

    def response(self, method: str, message: Message, peer: str) -> Message:
        try:
            return self.chain(WireEvent("response", "server", method, self.party, peer, message))
        except Refused as exc:
            raise RefusedCall(exc.code, f"{self.party} refused the {method} response: {exc.reason}") from exc


class ClientChainHook:
    """``chain`` on what party ``party`` sends to ``target`` and gets back (side "client"). Raises
    :class:`RefusedCall` for a refused message; the caller sees it as the call's error."""

    def __init__(self, chain: Chain, party: str, target: str) -> None:
        self.chain = chain
        self.party = party
        self.target = target

    def request(self, method: str, message: Message) -> Message:
        try:
            return self.chain(WireEvent("request", "client", method, self.party, self.target, message))
        except Refused as exc:
            raise RefusedCall(
                exc.code, f"{self.party} refused its own {method} request: {exc.reason}"
            ) from exc

    def response(self, method: str, message: Message) -> Message:
        try:
            return self.chain(WireEvent("response", "client", method, self.party, self.target, message))
        except Refused as exc:
            raise RefusedCall(exc.code, f"{self.party} refused the {method} response: {exc.reason}") from exc


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


class _InterceptedCall(grpc.Call, grpc.Future):
    """The real call, with the response chain applied once to its reply (as soon as the reply
    arrives, so a response tap runs even if the caller never reads the result). A failed real
    call is returned unchanged by result()/exception()."""

    def __init__(self, inner: Any, on_response: Callable[[Message], Message]) -> None:
        self._inner = inner
        self._on_response = on_response
        self._lock = threading.Lock()
        self._settled = False
        self._response: Message | None = None
        self._error: BaseException | None = None  # a RefusedCall, or a mod's own bug (re-raised as is)
        inner.add_done_callback(lambda _: self._settle())  # runs at once if the call is already done

    def _settle(self) -> None:
        with self._lock:
            if self._settled:
                return
            self._settled = True
            if self._inner.cancelled() or self._inner.exception() is not None:
                return
            try:
                self._response = self._on_response(self._inner.result())
            except Exception as exc:  # kept for result(): a done-callback must not raise
                self._error = exc

    # grpc.Future
    def result(self, timeout: float | None = None) -> Any:
        self._inner.result(timeout)  # raises the real call's error, timeout or cancellation unchanged
        self._settle()
        if self._error is not None:
            raise self._error
        return self._response

    def exception(self, timeout: float | None = None) -> BaseException | None:
        error = self._inner.exception(timeout)
        if error is not None:
            return error
        self._settle()
        return self._error

    def traceback(self, timeout: float | None = None) -> TracebackType | None:
        error = self.exception(timeout)
        if error is None:
            return None
        return self._inner.traceback(timeout) if self._error is None else error.__traceback__

    def add_done_callback(self, fn: Callable[[Any], None]) -> None:
        self._inner.add_done_callback(lambda _: fn(self))

    def cancel(self) -> bool:
        return self._inner.cancel()

    def cancelled(self) -> bool:
        return self._inner.cancelled()

    def running(self) -> bool:
        return self._inner.running()

    def done(self) -> bool:
        return self._inner.done()

    # grpc.Call / grpc.RpcContext
    def code(self) -> grpc.StatusCode:
        code = self._inner.code()
        if code == grpc.StatusCode.OK:
            self._settle()
            if isinstance(self._error, RefusedCall):
                return self._error.code()
            if self._error is not None:
                return grpc.StatusCode.UNKNOWN
        return code

    def details(self) -> str | None:
        details = self._inner.details()
        if self._inner.code() == grpc.StatusCode.OK:
            self._settle()
            if self._error is not None:
                return self._error.details() if isinstance(self._error, RefusedCall) else repr(self._error)
        return details

    def initial_metadata(self) -> Any:
        return self._inner.initial_metadata()

    def trailing_metadata(self) -> Any:
        return self._inner.trailing_metadata()

    def is_active(self) -> bool:
        return self._inner.is_active()

    def time_remaining(self) -> float | None:
        return self._inner.time_remaining()

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return self._inner.add_callback(callback)


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
        return _InterceptedCall(
            continuation(client_call_details, request), functools.partial(self.hook.response, method)
        )


def intercept_channel(channel: grpc.Channel, chain: Chain, party: str, target: str) -> grpc.Channel:
    """``channel`` with ``chain`` on it; the channel itself is returned unchanged when the chain is empty."""
    if not len(chain):
        return channel
    return grpc.intercept_channel(channel, ClientChainInterceptor(chain, party, target))
