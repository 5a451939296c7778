"""Messages over ``transport.max_message_mb`` travel in chunks, unseen by the code above the channel.

Client (:class:`ChunkingChannel`, with the party's mod chain as its ``hook``, run on whole
messages before they are split and after they are joined, so taps see whole messages): a call
whose serialized request is over the limit goes over the ``Chunks/Call`` stream as ``Chunk``
messages, with the real method in the ``vflnet-method`` metadata; the reply comes back on that
stream. A plain unary call whose *reply* is over the limit fails on the server with
RESOURCE_EXHAUSTED and a ``vflnet-reply-ticket`` trailer; the channel then fetches the parked reply
once with ``Chunks/FetchReply``. Messages that fit travel as plain unary calls, as without chunking.

Server (:class:`ChunkingInterceptor`, first of the server's interceptors): for ``Chunks/Call`` it
takes the named method's full handler from the rest of the pipeline (role check, servicer), runs the
role check, reassembles the request, calls that handler with the mod chain (``hook``) around it and
streams the reply back; for a unary vflnet method it runs the role check and the hook the same way
(the role check runs again in the handler: the hook's mods must see only requests the caller's role
may send) and parks a reply over the limit. ``Chunks`` is never registered as a servicer: gRPC
then resolves the named method through the generic handlers, which honour the name we pass.
No logical message may exceed ``transport.max_payload_mb``, chunked or not.
"""

from __future__ import annotations

import functools
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import grpc
from google.protobuf.message import DecodeError

from vflnet.config import TransportConfig
from vflnet.v1 import messages_pb2, services_pb2
from vflnet.wire.calls import FailedCall, SettledCall
from vflnet.wire.decoding import Undecodable, lenient_parser

MIB = 1024 * 1024
CHUNK_OVERHEAD = 24  # bytes of a Chunk around its data: three field tags, a length and two varints
METHOD_KEY = "vflnet-method"  # metadata of a Chunks/Call: the unary method it stands for
TICKET_KEY = "vflnet-reply-ticket"  # trailer of a unary call whose reply waits to be fetched
CALL_METHOD = "/vflnet.v1.Chunks/Call"
FETCH_METHOD = "/vflnet.v1.Chunks/FetchReply"
MAX_CACHED_CALLABLES = 256  # per channel (ChunkingChannel._callables): far above the methods vflnet has


def _unary_methods(service: Any) -> set[str]:
    """The full names of a protobuf ServiceDescriptor's unary methods."""
    return {
        f"/{service.full_name}/{m.name}"
        for m in service.methods
        if not (m.client_streaming or m.server_streaming)
    }


# Every unary vflnet method: each may travel in chunks, and a party's hook (its mod chain) runs on
# it. A plug-in protocol's methods join through register_chunkable (vflnet/sdk/contract.py).
CHUNKABLE: set[str] = set().union(
    *(_unary_methods(service) for service in services_pb2.DESCRIPTOR.services_by_name.values())
)


def register_chunkable(service: Any) -> None:
    """Add a plug-in protocol's unary methods (a protobuf ServiceDescriptor) to ``CHUNKABLE``."""
    CHUNKABLE.update(_unary_methods(service))


class ServerHook(Protocol):
    """Runs on every whole request a server receives and every reply it sends (a party's mod chain,
    vflnet/interceptors/grpc_adapters.py); raises :class:`FailedCall` to refuse one with its status.
    ``data`` is the message's bytes on the wire when known; a hook returns the message to go on (the
    same object when it did not rewrite it)."""

    def request(self, method: str, message: Any, peer: str, data: bytes | None = None) -> Any: ...
    def response(self, method: str, message: Any, peer: str, data: bytes | None = None) -> Any: ...
    def skips(self, request: Any) -> bool:
        """Whether the call of ``request`` is served as if there were no hook (a benchmark's A/B)."""
        ...


class ClientHook(Protocol):
    """Runs on every whole request a channel sends and every reply it gets; raises
    :class:`FailedCall` to refuse one (the caller sees the call fail with its status)."""

    def request(self, method: str, message: Any, data: bytes | None = None) -> Any: ...
    def response(self, method: str, message: Any, data: bytes | None = None) -> Any: ...


def serve_with_hook(
    hook: ServerHook,
    method: str,
    behavior: Callable[[Any, grpc.ServicerContext], Any],
    request: Any,
    context: grpc.ServicerContext,
    data: bytes | None = None,
    serialize: Callable[[Any], bytes] | None = None,
) -> Any:
    """``behavior`` (the servicer) with ``hook`` on its request (``data``: its bytes, when known) and
    reply; a refusal aborts the call with the refusal's status. With ``serialize``, the reply is
    returned serialized, once for the hook and the wire unless the hook rewrote it."""
    peer = context.peer()
    if not isinstance(request, Undecodable):  # no message to show a mod: the servicer refuses it
        try:
            request = hook.request(method, request, peer, data)
        except FailedCall as exc:
            context.abort(exc.code(), exc.details())
    response = behavior(request, context)
    if response is None:  # the servicer aborted or set an error status itself
        return response
    encoded = None if serialize is None else serialize(response)
    try:
        out = hook.response(method, response, peer, encoded)
    except FailedCall as exc:
        context.abort(exc.code(), exc.details())
    if serialize is None:
        return out
    return encoded if out is response else serialize(out)


@dataclass(frozen=True)
class Limits:
    message: int  # bytes of one gRPC message (transport.max_message_mb)
    payload: int  # bytes of one logical message after reassembly (transport.max_payload_mb)
    ticket_ttl_s: float  # how long a parked reply waits for its fetch (transport.rpc_timeout_s)
    # bytes of chunked requests buffered at once over all streams (transport.max_inflight_mb)
    inflight: int = 1 << 62
    # the longest deadline a chunked call may ask for: the longest call's timeout + 5 s
    stream_deadline_s: float = 1e9

    @classmethod
    def of(cls, transport: TransportConfig) -> Limits:
        return cls(
            int(transport.max_message_mb * MIB),
            int(transport.max_payload_mb * MIB),
            transport.rpc_timeout_s,
            int(transport.max_inflight_mb * MIB),
            max(transport.rpc_timeout_s, transport.join_timeout_s) + 5.0,
        )

    @property
    def chunk(self) -> int:
        return max(1, self.message - CHUNK_OVERHEAD)


class ChunkError(ValueError):
    """A chunk stream that does not reassemble; ``code`` is the status to answer with."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def split(data: bytes, limits: Limits) -> Iterator[messages_pb2.Chunk]:
    size = limits.chunk
    count = max(1, -(-len(data) // size))
    for i in range(count):
        yield messages_pb2.Chunk(data=data[i * size : (i + 1) * size], index=i, count=count)


class _Budget:
    """Bytes buffered by all of a server's chunked streams at once."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used = limit, 0
        self._lock = threading.Lock()

    def take(self, n: int) -> bool:
        with self._lock:
            if self.used + n > self.limit:
                return False
            self.used += n
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n


_END = object()


def _paced(chunks: Iterator[messages_pb2.Chunk], idle_s: float, what: str) -> Iterator[messages_pb2.Chunk]:
    """``chunks`` as a helper thread reads them, so that a stream whose sender goes quiet for ``idle_s``
    ends (DEADLINE_EXCEEDED) instead of holding a server worker until its deadline. The helper reads
    at most two chunks ahead and ends with the call."""
    ahead: queue.Queue[Any] = queue.Queue(maxsize=2)
    done = threading.Event()

    def offer(item: Any) -> None:
        while not done.is_set():
            try:
                ahead.put(item, timeout=1.0)
                return
            except queue.Full:
                continue

    def pump() -> None:
        try:
            for c in chunks:
                offer(c)
            offer(_END)
        except Exception as exc:  # the call ended: cancelled, aborted, or past its deadline
            offer(exc)

    threading.Thread(target=pump, name="chunk-reader", daemon=True).start()
    try:
        while True:
            try:
                item = ahead.get(timeout=idle_s)
            except queue.Empty:
                raise ChunkError(
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                    f"{what}: no chunk for {idle_s:g} s (transport.rpc_timeout_s): the stream is dropped",
                ) from None
            if item is _END:
                return
            if isinstance(item, Exception):
                raise item
            yield item
    finally:
        done.set()


def join(
    chunks: Iterable[messages_pb2.Chunk | Undecodable],
    limits: Limits,
    what: str,
    budget: _Budget | None = None,
) -> bytes:
    """Reassemble a whole stream: chunks 0..count-1 in order, none empty unless it is the only one,
    at most ``limits.payload`` bytes in all, and within the server's in-flight ``budget``."""
    parts: list[bytes] = []
    total, count = 0, 0
    try:
        for c in chunks:
            if isinstance(c, Undecodable):
                raise ChunkError(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: a frame is not a Chunk message")
            if budget is not None and not budget.take(len(c.data)):
                raise ChunkError(
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"{what}: the server buffers {limits.inflight} bytes of chunked requests at most "
                    "(transport.max_inflight_mb); try again later",
                )
            total += len(c.data)
            parts.append(c.data)
            _check_chunk(c, parts, count or c.count, total, limits, what)
            count = count or c.count
    finally:
        if budget is not None:
            budget.give(total)
    if not count or len(parts) != count:
        raise ChunkError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{what}: the stream ended after {len(parts)} of {count or '?'} chunks",
        )
    return b"".join(parts)


def _check_chunk(
    c: messages_pb2.Chunk, parts: list[bytes], count: int, total: int, limits: Limits, what: str
) -> None:
    """``c`` (just appended to ``parts``) is the next chunk of a stream of ``count``."""
    index = len(parts) - 1
    if c.count != count or c.index != index or c.index >= count:
        raise ChunkError(
            grpc.StatusCode.INVALID_ARGUMENT,
            f"{what}: got chunk {c.index} of {c.count}, expected chunk {index} of {count or '?'}",
        )
    if not c.data and count > 1:
        raise ChunkError(grpc.StatusCode.INVALID_ARGUMENT, f"{what}: chunk {c.index} of {count} is empty")
    if total > limits.payload:
        raise ChunkError(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"{what} is over transport.max_payload_mb ({limits.payload} bytes)",
        )


def payload_error(size: int, limits: Limits, what: str) -> str | None:
    if size <= limits.payload:
        return None
    return (
        f"{what} is {size / MIB:.1f} MiB, over transport.max_payload_mb = {limits.payload / MIB:g}; messages "
        "over transport.max_message_mb travel in chunks, but none may exceed this: raise it on every party"
    )


# ------------------------------------------------------------------------------------------ server
@dataclass(frozen=True)
class _CallDetails(grpc.HandlerCallDetails):
    method: str
    invocation_metadata: Any


class _ReplyStash:
    """Unary replies too large to send, each under a one-time random ticket until fetched or expired."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._lock = threading.Lock()
        self._items: dict[str, tuple[float, bytes]] = {}

    def put(self, data: bytes) -> str:
        now = time.monotonic()
        token = secrets.token_urlsafe(16)
        with self._lock:
            self._items = {k: v for k, v in self._items.items() if v[0] > now}  # drop unfetched ones
            self._items[token] = (now + self.ttl_s, data)
        return token

    def take(self, token: str) -> bytes | None:
        with self._lock:
            item = self._items.pop(token, None)
        return item[1] if item is not None and item[0] > time.monotonic() else None


def _as_is(data: Any) -> Any:
    """The (de)serializer of a method that sends and takes bytes as they are."""
    return data


def _parse(handler: grpc.RpcMethodHandler, data: bytes) -> Any:
    """The request ``handler`` takes, from its bytes (vflnet's handlers parse leniently: bytes that are
    not a message become :class:`Undecodable`, which the servicer refuses)."""
    return handler.request_deserializer(data) if handler.request_deserializer else data


class ChunkingInterceptor(grpc.ServerInterceptor):
    """Serves ``Chunks/Call`` and ``Chunks/FetchReply``; parks unary replies over the limit.

    Place it first: the rest of the pipeline then only ever sees whole logical messages under their
    own method name (the role check of a chunked ExchangeEmbeddings is ExchangeEmbeddings')."""

    def __init__(
        self,
        limits: Limits,
        authorize: Callable[[str, grpc.ServicerContext], None] | None = None,
        max_streams: int = 1 << 30,
        hook: ServerHook | None = None,
    ) -> None:
        self.limits = limits
        self.hook = hook  # the party's mod chain, on whole messages (None: an empty chain)
        self.stream_deadline_s = limits.stream_deadline_s  # raised to the run's step deadline on admission
        self.stash = _ReplyStash(limits.ticket_ttl_s)
        self.budget = _Budget(limits.inflight)
        self.authorize = authorize  # the role check (mutual TLS), run before a stream is read
        # chunked streams being read at once: a stalled stream holds a worker thread until its deadline,
        # so they may take only part of the server's workers and control calls (RunStep) keep the rest
        self.streams = threading.BoundedSemaphore(max_streams)
        self.max_streams = max_streams
        # a unary method's handler, built at its first call: what the rest of the pipeline returns
        # depends on the method name alone (gRPC's generic handlers, the role authorizer), and
        # building it again cost every call of every step ~10 us of Python
        self._unary_handlers: dict[str, grpc.RpcMethodHandler] = {}

    def allow_deadline(self, seconds: float) -> None:
        """Chunked calls may ask for deadlines up to ``seconds`` + 5: the run's step deadline, known once
        the roster is admitted (vflnet/sdk/deadlines.py)."""
        self.stream_deadline_s = max(self.stream_deadline_s, seconds + 5.0)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        method = handler_call_details.method
        method = method.decode() if isinstance(method, bytes) else method
        if method == FETCH_METHOD:
            return grpc.unary_stream_rpc_method_handler(
                self._fetch,
                request_deserializer=lenient_parser(messages_pb2.ReplyTicket),
                response_serializer=messages_pb2.Chunk.SerializeToString,
            )
        if method == CALL_METHOD:
            metadata = handler_call_details.invocation_metadata or ()
            base = next((value for key, value in metadata if key == METHOD_KEY), "")
            handler = continuation(_CallDetails(base, metadata)) if base in CHUNKABLE else None
            if handler is None or handler.unary_unary is None:
                return None  # UNIMPLEMENTED, as for a unary call to a method this server lacks
            return grpc.stream_stream_rpc_method_handler(
                functools.partial(self._serve_chunked, base, handler),
                request_deserializer=lenient_parser(messages_pb2.Chunk),
                response_serializer=messages_pb2.Chunk.SerializeToString,
            )
        cached = self._unary_handlers.get(method)
        if cached is not None:
            return cached
        handler = continuation(handler_call_details)
        if method not in CHUNKABLE or handler is None or handler.unary_unary is None:
            return handler
        wrapped = grpc.unary_unary_rpc_method_handler(
            functools.partial(self._serve_unary, method, handler),
            # with a hook, the request's bytes reach _serve_unary: a tap records them as they are
            request_deserializer=handler.request_deserializer if self.hook is None else None,
        )
        self._unary_handlers[method] = wrapped
        return wrapped

    def _serve(
        self,
        method: str,
        handler: grpc.RpcMethodHandler,
        request: Any,
        context: grpc.ServicerContext,
        hook: ServerHook | None,
        data: bytes | None = None,
    ) -> bytes | None:
        """The logical call: the servicer, with ``hook`` on its request (``data``: its bytes) and
        reply; the reply's bytes (None: the servicer set an error status itself)."""
        serialize = handler.response_serializer or _as_is
        if hook is None:
            reply = handler.unary_unary(request, context)
            encoded = None if reply is None else serialize(reply)
        else:
            encoded = serve_with_hook(hook, method, handler.unary_unary, request, context, data, serialize)
        if encoded is not None:
            error = payload_error(len(encoded), self.limits, f"the {method} reply")
            if error:
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, error)
        return encoded

    def _serve_unary(
        self, method: str, handler: grpc.RpcMethodHandler, request: Any, context: grpc.ServicerContext
    ) -> bytes | None:
        data, hook = None, self.hook
        if hook is not None:
            if self.authorize is not None:
                self.authorize(method, context)  # mods see only requests the caller's role may send
            try:
                data, request = request, _parse(handler, request)
            except DecodeError as exc:  # a deserializer that raises (vflnet's own parse leniently)
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{method} request does not decode: {exc}")
            if hook.skips(request):  # the rest of the call as a server without a hook serves it
                hook = None
        reply = self._serve(method, handler, request, context, hook, data)
        if reply is None:  # the servicer set an error status itself
            return None
        if len(reply) > self.limits.message:
            context.set_trailing_metadata(((TICKET_KEY, self.stash.put(reply)),))
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the {method} reply is {len(reply)} bytes, over transport.max_message_mb "
                f"({self.limits.message} bytes): fetch it with {FETCH_METHOD} and the {TICKET_KEY} trailer",
            )
        return reply

    def _serve_chunked(
        self,
        method: str,
        handler: grpc.RpcMethodHandler,
        chunks: Iterator[messages_pb2.Chunk],
        context: grpc.ServicerContext,
    ) -> Iterator[messages_pb2.Chunk]:
        if self.authorize is not None:
            self.authorize(method, context)  # aborts: a caller's role is known before any chunk is read
        remaining = context.time_remaining()
        if remaining is None or remaining > self.stream_deadline_s:
            # the deadline bounds how long a stream may hold a worker and its buffer
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"a chunked {method} call needs a deadline of at most {self.stream_deadline_s:g} s "
                "(the largest of transport.rpc_timeout_s, join_timeout_s and the run's step deadline, + 5)",
            )
        if not self.streams.acquire(blocking=False):
            context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{self.max_streams} chunked calls are being received already; try again later",
            )
        try:
            what = f"chunked {method} request"
            data = join(_paced(chunks, self.limits.ticket_ttl_s, what), self.limits, what, self.budget)
            request = _parse(handler, data)
        except ChunkError as exc:
            context.abort(exc.code, str(exc))
        except DecodeError as exc:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"chunked {method} request does not decode: {exc}"
            )
        finally:
            self.streams.release()
        hook = None if self.hook is None or self.hook.skips(request) else self.hook
        encoded = self._serve(method, handler, request, context, hook, data)
        if encoded is not None:
            yield from split(encoded, self.limits)

    def _fetch(
        self, ticket: messages_pb2.ReplyTicket | Undecodable, context: grpc.ServicerContext
    ) -> Iterator[messages_pb2.Chunk]:
        if isinstance(ticket, Undecodable):
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"{FETCH_METHOD}: the request is not a ReplyTicket"
            )
        data = self.stash.take(ticket.token)
        if data is None:
            context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"no reply waits under this ticket (fetched already, or older than {self.limits.ticket_ttl_s:g} s)",
            )
        yield from split(data, self.limits)


# ------------------------------------------------------------------------------------------ client
@dataclass(frozen=True)
class _CallOptions:
    deadline: float | None  # time.monotonic() based
    metadata: Any
    credentials: Any
    wait_for_ready: bool | None
    compression: Any

    def kwargs(self) -> dict[str, Any]:
        timeout = None if self.deadline is None else max(0.0, self.deadline - time.monotonic())
        return {
            "timeout": timeout,
            "metadata": self.metadata,
            "credentials": self.credentials,
            "wait_for_ready": self.wait_for_ready,
            "compression": self.compression,
        }


def _ticket(error: grpc.RpcError) -> str | None:
    """The ticket a failed call's trailer names for a reply the server parked, if any."""
    if not isinstance(error, grpc.Call) or error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
        return None
    return next((value for key, value in error.trailing_metadata() or () if key == TICKET_KEY), None)


class _ChunkingMultiCallable(grpc.UnaryUnaryMultiCallable):
    """One vflnet method: unary when the request fits, ``Chunks/Call`` when not, a ticket fetch
    when the server parked the reply."""

    def __init__(
        self,
        channel: grpc.Channel,
        method: str,
        serializer: Callable | None,
        deserializer: Callable | None,
        limits: Limits,
        hook: ClientHook | None = None,
    ) -> None:
        self.method = method
        self.limits = limits
        self._hook = hook
        self._method_metadata = ((METHOD_KEY, method),)
        self._serialize = serializer or _as_is
        self._deserialize = deserializer or _as_is
        self._unary = channel.unary_unary(method)  # bytes both ways: the sizes are checked here
        chunk = {
            "request_serializer": messages_pb2.Chunk.SerializeToString,
            "response_deserializer": messages_pb2.Chunk.FromString,
        }
        self._stream = channel.stream_stream(CALL_METHOD, **chunk)
        self._fetch = channel.unary_stream(
            FETCH_METHOD,
            request_serializer=messages_pb2.ReplyTicket.SerializeToString,
            response_deserializer=messages_pb2.Chunk.FromString,
        )

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

    def with_call(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> tuple[Any, grpc.Call]:
        options = _CallOptions(
            None if timeout is None else time.monotonic() + timeout,
            metadata,
            credentials,
            wait_for_ready,
            compression,
        )
        return self._invoke(request, options)

    def future(
        self,
        request: Any,
        timeout: float | None = None,
        metadata: Any = None,
        credentials: Any = None,
        wait_for_ready: bool | None = None,
        compression: Any = None,
    ) -> grpc.Future:
        options = _CallOptions(
            None if timeout is None else time.monotonic() + timeout,
            metadata,
            credentials,
            wait_for_ready,
            compression,
        )
        try:
            data = self._encode(request)
        except Exception as exc:  # a refusal or a too-large request: kept for result(), as a failed call's
            refused = SettledCall()
            refused.settle(error=exc)
            return refused
        if len(data) > self.limits.message:  # several gRPC calls in a row: they run on a thread
            future = _ChunkingCall()
            future.run_on_thread(functools.partial(self._call_chunked, data, options))
            return future
        # the common case: gRPC's own future, settled by its callback, with no thread of ours (the
        # coordinator sends every party a RunStep per step this way)
        call = self._unary.future(data, **options.kwargs())
        future = _ChunkingCall(call)
        call.add_done_callback(functools.partial(self._settle, future, options))
        return future

    def _settle(self, future: _ChunkingCall, options: _CallOptions, call: Any) -> None:
        """The one gRPC call of ``future`` ended (on gRPC's callback thread: nothing here may block)."""
        try:
            reply = call.result()
        except grpc.RpcError as exc:  # a failed call raises itself: its trailer may name a parked reply
            ticket = _ticket(exc)
            if ticket is None:
                future.settle(error=exc)
            else:
                future.run_on_thread(functools.partial(self._fetch_parked, ticket, options))
            return
        except grpc.FutureCancelledError:  # only future.cancel() cancels it, having settled it already
            future.settle(error=FailedCall(call.code(), call.details()))
            return
        try:
            response = self._decode(reply)
        except Exception as exc:  # undecodable, refused by a mod, or a mod's own bug: kept for result()
            future.settle(error=exc)
            return
        future.settle(response, call=call)

    def _invoke(self, request: Any, options: _CallOptions) -> tuple[Any, grpc.Call]:
        """The whole call, blocking."""
        data = self._encode(request)
        if len(data) > self.limits.message:
            return self._call_chunked(data, options, None)
        try:  # gRPC's own blocking call: no thread hand-off through a future
            reply, call = self._unary.with_call(data, **options.kwargs())
            return self._decode(reply), call
        except grpc.RpcError as exc:  # a failed call raises itself: its trailer may name a parked reply
            ticket = _ticket(exc)
            if ticket is None:
                raise
        return self._fetch_parked(ticket, options, None)

    def _encode(self, request: Any) -> bytes:
        """The request after the hook, serialized (the hook sees the whole message and its bytes)."""
        data = self._serialize(request)
        if self._hook is not None:
            out = self._hook.request(self.method, request, data)
            if out is not request:  # rewritten by a mod
                data = self._serialize(out)
        error = payload_error(len(data), self.limits, f"the {self.method} request")
        if error:
            raise FailedCall(grpc.StatusCode.RESOURCE_EXHAUSTED, error)
        return data

    def _call_chunked(
        self, data: bytes, options: _CallOptions, track: Callable[[Any], None] | None
    ) -> tuple[Any, grpc.Call]:
        """A request over the message limit: ``Chunks/Call``, whose reply comes back in chunks too."""
        kwargs = options.kwargs()
        kwargs["metadata"] = (*(kwargs["metadata"] or ()), *self._method_metadata)
        return self._join(self._stream(split(data, self.limits), **kwargs), track)

    def _fetch_parked(
        self, ticket: str, options: _CallOptions, track: Callable[[Any], None] | None
    ) -> tuple[Any, grpc.Call]:
        """The reply the server parked under ``ticket`` (it was over the message limit)."""
        return self._join(self._fetch(messages_pb2.ReplyTicket(token=ticket), **options.kwargs()), track)

    def _join(self, responses: Any, track: Callable[[Any], None] | None) -> tuple[Any, grpc.Call]:
        """``track`` is told the call so a future can cancel it (None: a blocking call, which nothing
        cancels)."""
        if track is not None:
            track(responses)
        try:
            reply = join(responses, self.limits, f"the chunked {self.method} reply")
        except ChunkError as exc:
            raise FailedCall(exc.code, str(exc)) from exc
        return self._decode(reply), responses

    def _decode(self, data: bytes) -> Any:
        """The whole reply, parsed, after the hook (it runs once per reply, whichever way it came)."""
        try:
            reply = self._deserialize(data)
        except DecodeError as exc:
            raise FailedCall(
                grpc.StatusCode.INTERNAL, f"the {self.method} reply does not decode: {exc}"
            ) from exc
        return reply if self._hook is None else self._hook.response(self.method, reply, data)


class _ChunkingCall(SettledCall):
    """``future()`` of a chunking call. A request that fits one message is gRPC's own future, settled
    from its callback; a chunked request, or the fetch of a parked reply, runs on a thread of its own
    (several gRPC calls in a row). Done-callbacks (and so a client interceptor's response chain) run
    on the thread that settles it: gRPC's callback thread of this channel for a one-message call.

    cancel() settles it with CANCELLED at once, as gRPC's own future is done at once, then cancels
    whichever gRPC call is in flight, or the next one as it starts (a parked reply's fetch)."""

    def __init__(self, call: Any = None) -> None:
        super().__init__()
        self._in_flight = call  # the gRPC call this one waits on now

    def track(self, call: Any) -> None:
        """``call`` is the gRPC call in flight now; cancelled at once if this one was cancelled (only
        cancel() settles it before its last gRPC call ends)."""
        with self._lock:  # a cancel() either sees this call or is seen here
            self._in_flight = call
            cancelled = self._done
        if cancelled:
            call.cancel()

    def run_on_thread(self, invoke: Callable[[Callable[[Any], None]], tuple[Any, grpc.Call]]) -> None:
        threading.Thread(target=self._run, args=(invoke,), daemon=True).start()

    def _run(self, invoke: Callable[[Callable[[Any], None]], tuple[Any, grpc.Call]]) -> None:
        try:
            response, call = invoke(self.track)
        except Exception as exc:  # an RpcError is the failed call itself; anything else is kept for result()
            self.settle(error=exc)
        else:
            self.settle(response, call=call)

    def cancel(self) -> bool:
        if not super().cancel():  # settled already; else it is now, with CANCELLED
            return False
        call = self._in_flight  # read after settling: a later track() sees the call settled
        if call is not None:
            call.cancel()
        return True


class ChunkingChannel(grpc.Channel):
    """``channel`` with chunking on every unary vflnet method, and ``hook`` (the party's mod chain)
    on each one's whole request and reply; all else passes through."""

    def __init__(self, channel: grpc.Channel, limits: Limits, hook: ClientHook | None = None) -> None:
        self.inner = channel
        self.limits = limits
        self.hook = hook
        # one callable per method and message classes, reused by every call: building one builds three
        # gRPC callables, 14 us a call on a step's path (issue 40); bounded, should a caller pass new
        # serializer functions each time
        self._callables: dict[tuple[str, Callable | None, Callable | None], _ChunkingMultiCallable] = {}

    def unary_unary(
        self,
        method: str,
        request_serializer: Callable | None = None,
        response_deserializer: Callable | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        name = method.decode() if isinstance(method, bytes) else method
        if name not in CHUNKABLE:
            return self.inner.unary_unary(
                method, request_serializer, response_deserializer, _registered_method
            )
        key = (name, request_serializer, response_deserializer)
        callable_ = self._callables.get(key)
        if callable_ is None:
            callable_ = _ChunkingMultiCallable(
                self.inner, name, request_serializer, response_deserializer, self.limits, self.hook
            )
            if len(self._callables) < MAX_CACHED_CALLABLES:
                self._callables[key] = callable_
        return callable_

    def unary_stream(
        self,
        method: str,
        request_serializer: Callable | None = None,
        response_deserializer: Callable | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        return self.inner.unary_stream(method, request_serializer, response_deserializer, _registered_method)

    def stream_unary(
        self,
        method: str,
        request_serializer: Callable | None = None,
        response_deserializer: Callable | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        return self.inner.stream_unary(method, request_serializer, response_deserializer, _registered_method)

    def stream_stream(
        self,
        method: str,
        request_serializer: Callable | None = None,
        response_deserializer: Callable | None = None,
        _registered_method: bool | None = False,
    ) -> Any:
        return self.inner.stream_stream(method, request_serializer, response_deserializer, _registered_method)

    def subscribe(self, callback: Callable, try_to_connect: bool = False) -> None:
        self.inner.subscribe(callback, try_to_connect)

    def unsubscribe(self, callback: Callable) -> None:
        self.inner.unsubscribe(callback)

    def close(self) -> None:
        self.inner.close()

    def __enter__(self) -> ChunkingChannel:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.close()
        return False
