"""The in-memory transport: every role in one process, every message still through protobuf.

A ``LoopbackServer`` stands in for ``grpc.Server`` and a ``LoopbackChannel`` for ``grpc.Channel``,
with the surface the roles and the generated stubs use (unary-unary calls, blocking, ``with_call``
and ``future``; generic and registered method handlers; server interceptors). A call serializes the
request with the stub's serializer, the server deserializes it with its handler's deserializer, runs
its interceptors (the same mod chain as over gRPC: taps, rewrites, traces) and the handler on its
own thread pool, and the reply goes back the same way. Deadlines, ``wait_for_ready``, aborts with a
status and refusals behave as over gRPC, so role code cannot tell the two apart; only sockets,
HTTP/2, TLS and chunking are missing (there is no size limit to chunk under).
"""

from __future__ import annotations

import functools
import heapq
import itertools
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc

from vflnet.wire.calls import FailedCall, SettledCall

SCHEME = "loopback:"


class _Abort(Exception):
    """Raised by ``LoopbackContext.abort``: the handler ends the call with this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code, self.details = code, details


@dataclass(frozen=True)
class _HandlerCallDetails(grpc.HandlerCallDetails):
    method: str
    invocation_metadata: tuple = ()


class LoopbackContext:
    """The part of ``grpc.ServicerContext`` vflnet handlers use."""

    def __init__(self, peer: str, deadline: float | None) -> None:
        self._peer, self._deadline = peer, deadline
        self._code: grpc.StatusCode | None = None
        self._details = ""

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise _Abort(code, details)

    def peer(self) -> str:
        return self._peer

    def invocation_metadata(self) -> tuple:
        return ()

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def peer_identities(self) -> None:
        return None

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else max(0.0, self._deadline - time.monotonic())

    def is_active(self) -> bool:
        return self._deadline is None or time.monotonic() < self._deadline

    def set_code(self, code: grpc.StatusCode) -> None:
        self._code = code

    def set_details(self, details: str) -> None:
        self._details = details

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass

    def add_callback(self, callback: Callable[[], None]) -> bool:
        return False


class LoopbackServer:
    """A server on a ``LoopbackHub``: handlers by full method name, interceptors in list order."""

    def __init__(
        self,
        hub: LoopbackHub,
        name: str,
        interceptors: Sequence[grpc.ServerInterceptor] = (),
        max_workers: int = 32,
    ) -> None:
        self.hub, self.name = hub, name
        self.interceptors = list(interceptors)
        self._generic: list[grpc.GenericRpcHandler] = []
        self._registered: dict[str, grpc.RpcMethodHandler] = {}
        self._pool = futures.ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix=f"{name}-loop", initializer=hub.thread_init
        )
        self.address = ""
        self._stopped = threading.Event()

    # ---------------------------------------------------------------- grpc.Server surface
    def add_generic_rpc_handlers(self, handlers: Sequence[grpc.GenericRpcHandler]) -> None:
        self._generic.extend(handlers)

    def add_registered_method_handlers(
        self, service: str, handlers: dict[str, grpc.RpcMethodHandler]
    ) -> None:
        for method, handler in handlers.items():
            self._registered[f"/{service}/{method}"] = handler

    def bind(self) -> str:
        self.address = self.hub.register(self)
        return self.address

    def start(self) -> None:
        pass

    def stop(self, grace: float | None) -> threading.Event:
        self.hub.unregister(self.address)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._stopped.set()
        return self._stopped

    def wait_for_termination(self, timeout: float | None = None) -> bool:
        return self._stopped.wait(timeout)

    # ------------------------------------------------------------------------- calls
    def _find(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        handler = self._registered.get(details.method)
        if handler is not None:
            return handler
        for generic in self._generic:
            handler = generic.service(details)
            if handler is not None:
                return handler
        return None

    def _handler(self, method: str) -> grpc.RpcMethodHandler | None:
        details = _HandlerCallDetails(method)

        def at(index: int) -> Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None]:
            if index == len(self.interceptors):
                return self._find
            return lambda d: self.interceptors[index].intercept_service(at(index + 1), d)

        return at(0)(details)

    def handle(self, method: str, data: bytes, peer: str, deadline: float | None) -> bytes:
        """One unary call: bytes in, bytes out, or an _Abort with the status the caller gets."""
        handler = self._handler(method)
        if handler is None or handler.unary_unary is None:
            raise _Abort(grpc.StatusCode.UNIMPLEMENTED, f"Method not found: {method}")
        request = handler.request_deserializer(data) if handler.request_deserializer else data
        context = LoopbackContext(peer, deadline)
        try:
            response = handler.unary_unary(request, context)
        except _Abort:
            raise
        except Exception as exc:  # as grpc does: an uncaught handler error is UNKNOWN
            raise _Abort(grpc.StatusCode.UNKNOWN, f"Exception calling application: {exc}") from exc
        if context._code not in (None, grpc.StatusCode.OK):
            raise _Abort(context._code, context._details)
        return handler.response_serializer(response) if handler.response_serializer else response

    def submit(self, fn: Callable[[], bytes]) -> futures.Future[bytes]:
        return self._pool.submit(fn)


class LoopbackHub:
    """The in-process network: loopback servers by address, and one timer for every call deadline.

    ``thread_init`` runs first on every thread that serves calls: per-thread runtime settings a party
    process would have set once (OpenMP's thread count is per thread, and it decides float reductions)."""

    def __init__(self, thread_init: Callable[[], None] | None = None, server_threads: int = 32) -> None:
        self.thread_init = thread_init
        self.server_threads = server_threads  # per server: calls_at_once of the roster (vflnet.config)
        self._servers: dict[str, LoopbackServer] = {}
        self._cond = threading.Condition()
        self._deadlines: list[tuple[float, int, weakref.ref[SettledCall]]] = []
        self._seq = itertools.count()
        self._timer: threading.Thread | None = None

    def register(self, server: LoopbackServer) -> str:
        with self._cond:
            address = f"{SCHEME}{server.name}"
            if address in self._servers:
                raise OSError(f"cannot bind {address}: already in use")
            self._servers[address] = server
            self._cond.notify_all()
        return address

    def unregister(self, address: str) -> None:
        with self._cond:
            self._servers.pop(address, None)

    def lookup(self, address: str, wait_until: float | None) -> LoopbackServer | None:
        """The server at ``address``; with ``wait_until``, wait for it to bind until then (wait_for_ready)."""
        with self._cond:
            while address not in self._servers and wait_until is not None:
                left = wait_until - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            return self._servers.get(address)

    def server(self, name: str, interceptors: Sequence[grpc.ServerInterceptor] = ()) -> LoopbackServer:
        return LoopbackServer(self, name, interceptors, self.server_threads)

    def channel(self, address: str, caller: str) -> LoopbackChannel:
        return LoopbackChannel(self, address, caller)

    # ---------------------------------------------------------------------- deadlines
    def expire_at(self, deadline: float, call: SettledCall) -> None:
        with self._cond:
            heapq.heappush(
                self._deadlines, (deadline, next(self._seq), weakref.ref(call))
            )  # a settled call is not kept alive
            if self._timer is None:
                self._timer = threading.Thread(
                    target=self._expire_loop, name="loopback-deadlines", daemon=True
                )
                self._timer.start()
            self._cond.notify_all()

    def _expire_loop(self) -> None:
        while True:
            with self._cond:
                while not self._deadlines or self._deadlines[0][0] > time.monotonic():
                    timeout = self._deadlines[0][0] - time.monotonic() if self._deadlines else None
                    self._cond.wait(timeout)
                _, _, ref = heapq.heappop(self._deadlines)
            call = ref()
            if call is not None:
                call.settle(error=FailedCall(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"))


def _finish(
    call: SettledCall, deserialize: Callable[[bytes], Any] | None, outcome: futures.Future[bytes]
) -> None:
    """The server's future is done: settle ``call`` with its decoded reply or its status."""
    if outcome.cancelled():
        call.settle(error=FailedCall(grpc.StatusCode.CANCELLED, "the server stopped"))
        return
    exc = outcome.exception()
    if isinstance(exc, _Abort):
        call.settle(error=FailedCall(exc.code, exc.details))
    elif exc is not None:
        call.settle(error=FailedCall(grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}"))
    else:
        data = outcome.result()
        try:
            reply = deserialize(data) if deserialize else data
        except Exception as err:  # a reply that does not parse, as grpc reports it
            call.settle(error=FailedCall(grpc.StatusCode.INTERNAL, f"cannot deserialize the response: {err}"))
        else:
            call.settle(reply)


class _UnaryUnary:
    def __init__(
        self,
        channel: LoopbackChannel,
        method: str,
        serializer: Callable[[Any], bytes] | None,
        deserializer: Callable[[bytes], Any] | None,
    ) -> None:
        self.channel, self.method = channel, method
        self.serializer, self.deserializer = serializer, deserializer

    def future(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> SettledCall | FailedCall:
        hub = self.channel.hub
        deadline = None if timeout is None else time.monotonic() + timeout
        server = hub.lookup(self.channel.address, deadline if wait_for_ready else None)
        if server is None:
            return FailedCall(grpc.StatusCode.UNAVAILABLE, f"no loopback server at {self.channel.address}")
        data = self.serializer(request) if self.serializer else request
        peer = f"{SCHEME}{self.channel.caller}"
        try:
            outcome = server.submit(lambda: server.handle(self.method, data, peer, deadline))
        except RuntimeError:  # the server's pool is shut down
            return FailedCall(
                grpc.StatusCode.UNAVAILABLE, f"loopback server at {self.channel.address} stopped"
            )
        call = SettledCall()  # cancel() settles it with CANCELLED (the handler still runs, as over gRPC)
        if deadline is not None:
            hub.expire_at(deadline, call)
        outcome.add_done_callback(functools.partial(_finish, call, self.deserializer))
        return call

    def with_call(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> tuple[Any, SettledCall | FailedCall]:
        call = self.future(request, timeout, metadata, credentials, wait_for_ready, compression)
        return call.result(), call

    def __call__(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> Any:
        return self.with_call(request, timeout, metadata, credentials, wait_for_ready, compression)[0]


class LoopbackChannel(grpc.Channel):
    """A channel to one loopback address; ``caller`` names the dialling party (the server's peer)."""

    def __init__(self, hub: LoopbackHub, address: str, caller: str) -> None:
        self.hub, self.address, self.caller = hub, address, caller

    def unary_unary(
        self,
        method: str,
        request_serializer: Any = None,
        response_deserializer: Any = None,
        _registered_method: bool | None = False,
    ) -> _UnaryUnary:
        return _UnaryUnary(self, method, request_serializer, response_deserializer)

    def unary_stream(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("the loopback transport carries unary calls only")

    stream_unary = stream_stream = unary_stream

    def subscribe(self, callback: Any, try_to_connect: bool = False) -> None:
        pass

    def unsubscribe(self, callback: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> LoopbackChannel:
        return self

    def __exit__(self, *exc: object) -> None:
        pass
