"""The proxy role: a man-in-the-middle process between two parties, for network-level demos.

``--mode grpc`` (default) terminates gRPC: it serves *any* unary method as raw bytes, decodes the
vflnet ones only to run the mod chain (taps, rewrites, refusals; a rewrite is re-serialized, an
untouched message is forwarded byte for byte), and forwards the call upstream with the caller's
deadline and metadata; the upstream's status code and details come back to the caller unchanged.
Messages over ``transport.max_message_mb`` (``--config``) are reassembled before the chain and
re-chunked towards the other side (vflnet/wire/chunking.py), so mods see whole messages there too.
It holds no certificate the parties trust, so between parties that use mutual TLS it is refused:
a TLS client cannot handshake with it, and the TLS upstream rejects its plaintext connection.

``--mode tcp`` relays raw TCP bytes (threads + sockets, a bounded number of connections). It counts
the bytes and looks for vflnet messages in the stream (HTTP/2 DATA frames carrying gRPC messages).
On plaintext it finds them; under TLS it sees only ciphertext, and flipping a relayed bit makes the
TLS record fail authentication, so the call fails instead of carrying altered data.
"""

from __future__ import annotations

import argparse
import dataclasses
import faulthandler
import functools
import logging
import os
import signal
import socket
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import grpc
from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError, Message

from vflnet.config import TLSConfig, TransportConfig
from vflnet.interceptors.chain import Chain, Refused
from vflnet.interceptors.events import METHODS, WireEvent, message_class
from vflnet.interceptors.trace import TraceWriter
from vflnet.wire.channels import bind, grpc_options, make_server, open_channel, stop_server
from vflnet.wire.chunking import METHOD_KEY, ChunkingChannel, Limits

log = logging.getLogger("vflnet.proxy")

MODES = ("grpc", "tcp")
# Metadata gRPC (or vflnet's chunking) sets itself on every call; forwarding it again would be
# refused or duplicated.
_TRANSPORT_METADATA = ("user-agent", "grpc-", METHOD_KEY)


def _plaintext(transport: TransportConfig) -> TransportConfig:
    """The transport settings without TLS: the proxy has no party certificate to present."""
    return dataclasses.replace(transport, tls=TLSConfig(enabled=False))


class ForwardingHandler(grpc.GenericRpcHandler):
    """Serves every unary method by forwarding its bytes to ``upstream``, running ``chain`` on the way."""

    def __init__(self, channel: grpc.Channel, upstream: str, chain: Chain, name: str) -> None:
        self.channel = channel
        self.upstream = upstream
        self.chain = chain
        self.name = name
        self._lock = threading.Lock()
        self._callables: dict[str, grpc.UnaryUnaryMultiCallable] = {}
        self.forwarded: Counter[str] = Counter()

    def service(self, handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        method = handler_call_details.method
        method = method.decode() if isinstance(method, bytes) else method
        return grpc.unary_unary_rpc_method_handler(functools.partial(self._forward, method))

    def _upstream_call(self, method: str) -> grpc.UnaryUnaryMultiCallable:
        with self._lock:
            if method not in self._callables:
                self._callables[method] = self.channel.unary_unary(method)  # bytes in, bytes out
            return self._callables[method]

    def _run_chain(
        self, method: str, direction: str, data: bytes, peer: str, context: grpc.ServicerContext
    ) -> bytes:
        cls = message_class(method, direction)
        if cls is None or not len(self.chain):
            return data
        try:
            message = cls.FromString(data)
        except DecodeError as exc:
            log.warning(
                "%s %s does not decode as %s (%s); forwarded as is", method, direction, cls.__name__, exc
            )
            return data
        try:
            out = self.chain(WireEvent(direction, "proxy", method, self.name, peer, message, data=data))  # type: ignore[arg-type]
        except Refused as exc:
            context.abort(exc.code, f"proxy {self.name} refused the {method} {direction}: {exc.reason}")
        return data if out is message else out.SerializeToString()

    def _forward(self, method: str, data: bytes, context: grpc.ServicerContext) -> bytes:
        data = self._run_chain(method, "request", data, context.peer(), context)
        metadata = tuple(
            (k, v) for k, v in context.invocation_metadata() if not k.startswith(_TRANSPORT_METADATA)
        )
        try:
            reply, _ = self._upstream_call(method).with_call(
                data, timeout=context.time_remaining(), metadata=metadata
            )
        except grpc.RpcError as exc:
            code, details = exc.code(), exc.details()  # type: ignore[attr-defined]
            log.info("%s from %s failed upstream: %s: %s", method, context.peer(), code.name, details)
            context.abort(code, details or "")
        with self._lock:
            self.forwarded[method] += 1
        return self._run_chain(method, "response", reply, self.upstream, context)


def run_proxy(
    listen: str,
    upstream: str,
    chain: Chain,
    transport_cfg: TransportConfig,
    *,
    name: str = "proxy",
    listen_credentials: grpc.ServerCredentials | None = None,
    upstream_credentials: grpc.ChannelCredentials | None = None,
) -> tuple[grpc.Server, int]:
    """Start a gRPC-level proxy from ``listen`` to ``upstream``; returns the started server and its port.

    Plaintext on both ends unless credentials are given (the proxy's *own* certificate, which parties
    of a TLS run do not trust: tests use it to show a TLS-terminating proxy is refused).
    The server's ``forwarding`` attribute is the :class:`ForwardingHandler` (per-method counts).
    """
    plain = _plaintext(transport_cfg)
    if upstream_credentials is None:
        channel = open_channel(upstream, plain, name)
    else:
        channel = ChunkingChannel(
            grpc.secure_channel(upstream, upstream_credentials, options=grpc_options(plain)), Limits.of(plain)
        )
    handler = ForwardingHandler(channel, upstream, chain, name)
    server = make_server(plain, name)
    server.add_generic_rpc_handlers((handler,))
    if listen_credentials is None:
        port = bind(server, listen, plain, name)
    else:
        port = server.add_secure_port(listen, listen_credentials)
        if port == 0:
            raise OSError(f"cannot bind {listen}")
    server.forwarding = handler  # type: ignore[attr-defined]
    server.start()
    log.info("proxy %s: port %d -> %s (%d mods)", name, port, upstream, len(chain))
    return server, port


# ---------------------------------------------------------------------------------------- tcp mode
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_H2_DATA, _H2_SETTINGS = 0x0, 0x4
_H2_END_STREAM, _H2_PADDED = 0x1, 0x8
_SNIFF_LIMIT = 64 * 1024 * 1024  # stop inspecting a stream that buffers more than this


def _no_unknown_fields(msg: Message) -> bool:
    if len(unknown_fields.UnknownFieldSet(msg)):
        return False
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        if fd.message_type.GetOptions().map_entry:
            subs = [v for v in value.values() if isinstance(v, Message)]
        else:
            subs = list(value) if fd.is_repeated else [value]
        if not all(_no_unknown_fields(s) for s in subs):
            return False
    return True


def _candidates(direction: str) -> list[type[Message]]:
    """Message classes that may travel this way; those with a Header first (they are the most specific)."""
    index = 0 if direction == "up" else 1
    classes = [pair[index] for pair in METHODS.values()]
    return sorted(classes, key=lambda c: "header" not in c.DESCRIPTOR.fields_by_name)


def sniff_message(data: bytes, direction: str) -> Message | None:
    """Best guess at the vflnet message in one gRPC payload (``direction`` "up" = requests, "down" =
    replies): the first type that parses with no unknown field and carries a run id; None if none.
    Heuristic (the method name is HPACK-coded in HEADERS frames, which this does not decode); messages
    with the same wire layout (EmbeddingGradients and DecryptReply) may be named as either."""
    for cls in _candidates(direction):
        try:
            msg = cls.FromString(data)
        except DecodeError:
            continue
        fields = cls.DESCRIPTOR.fields_by_name
        run_id = msg.header.run_id if "header" in fields else getattr(msg, "run_id", "")  # type: ignore[attr-defined]
        if run_id and _no_unknown_fields(msg):
            return msg
    return None


class GrpcSniffer:
    """Follows one direction of an h2c (plaintext HTTP/2) connection and yields the vflnet messages in
    its DATA frames. Anything that is not HTTP/2 (e.g. a TLS handshake) makes it give up for good."""

    def __init__(self, direction: str) -> None:
        self.direction = direction
        self.opaque = False
        self._buf = bytearray()
        self._need_preface = direction == "up"
        self._first_frame = True
        self._streams: dict[int, bytearray] = {}

    def _give_up(self) -> list[Message]:
        self.opaque = True
        self._buf.clear()
        self._streams.clear()
        return []

    def feed(self, data: bytes) -> list[Message]:
        if self.opaque:
            return []
        self._buf += data
        if self._need_preface:
            if len(self._buf) < len(_H2_PREFACE):
                return [] if _H2_PREFACE.startswith(bytes(self._buf)) else self._give_up()
            if not self._buf.startswith(_H2_PREFACE):
                return self._give_up()
            del self._buf[: len(_H2_PREFACE)]
            self._need_preface = False
        found: list[Message] = []
        while len(self._buf) >= 9:
            length = int.from_bytes(self._buf[0:3], "big")
            ftype, flags = self._buf[3], self._buf[4]
            stream_id = int.from_bytes(self._buf[5:9], "big") & 0x7FFFFFFF
            if self._first_frame and (ftype != _H2_SETTINGS or stream_id != 0):
                return self._give_up()  # every HTTP/2 endpoint opens with SETTINGS on stream 0
            self._first_frame = False
            if len(self._buf) < 9 + length:
                break
            payload = bytes(self._buf[9 : 9 + length])
            del self._buf[: 9 + length]
            if ftype != _H2_DATA:
                continue
            if flags & _H2_PADDED and payload:
                payload = payload[1 : len(payload) - payload[0]]
            pending = self._streams.setdefault(stream_id, bytearray())
            pending += payload
            found.extend(self._drain(pending))
            if flags & _H2_END_STREAM:
                self._streams.pop(stream_id, None)
        if len(self._buf) > _SNIFF_LIMIT or sum(map(len, self._streams.values())) > _SNIFF_LIMIT:
            return found + self._give_up()
        return found

    def _drain(self, pending: bytearray) -> Iterator[Message]:
        """gRPC length-prefixed messages: 1 compressed flag byte, 4 length bytes, the message."""
        while len(pending) >= 5:
            size = int.from_bytes(pending[1:5], "big")
            if len(pending) < 5 + size:
                return
            compressed, body = pending[0], bytes(pending[5 : 5 + size])
            del pending[: 5 + size]
            msg = None if compressed else sniff_message(body, self.direction)
            if msg is not None:
                yield msg


ByteMod = Callable[[bytes, str], bytes]  # (chunk, "up" | "down") -> chunk to relay


@dataclasses.dataclass
class RelayStats:
    connections: int = 0
    refused_connections: int = 0
    bytes_up: int = 0  # client -> upstream
    bytes_down: int = 0  # upstream -> client
    messages: Counter[str] = dataclasses.field(default_factory=Counter)  # vflnet messages seen, by type

    @property
    def messages_seen(self) -> int:
        return sum(self.messages.values())


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host.strip("[]") or "0.0.0.0", int(port)


class TcpRelay:
    """A plain TCP forwarder from ``listen`` to ``upstream`` with an optional byte rewrite.

    ``rewrite`` is called once per connection and returns that connection's :data:`ByteMod` (so a
    rewrite can follow the stream's framing). At most ``max_connections`` client connections at a time (more are closed at once and counted).
    """

    def __init__(
        self,
        listen: str,
        upstream: str,
        *,
        rewrite: Callable[[], ByteMod] | None = None,
        max_connections: int = 32,
        chunk_bytes: int = 64 * 1024,
        connect_timeout_s: float = 5.0,
    ) -> None:
        if max_connections < 1:
            raise ValueError(f"max_connections must be >= 1, got {max_connections}")
        self.listen = listen
        self.upstream = _split_address(upstream)
        self.rewrite = rewrite
        self.max_connections = max_connections
        self.chunk_bytes = chunk_bytes
        self.connect_timeout_s = connect_timeout_s
        self.stats = RelayStats()
        self._lock = threading.Lock()
        self._active = 0
        self._stopping = threading.Event()
        self._sockets: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._accept_thread: threading.Thread | None = None

    def start(self) -> int:
        """Bind and start accepting; returns the bound port."""
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(_split_address(self.listen))
        listener.listen(self.max_connections)
        self._listener = listener
        self._accept_thread = threading.Thread(target=self._accept_loop, name="tcp-relay-accept", daemon=True)
        self._accept_thread.start()
        port = listener.getsockname()[1]
        log.info("tcp relay: port %d -> %s:%d", port, *self.upstream)
        return port

    def stop(self) -> None:
        """Stop accepting and close every relayed connection."""
        self._stopping.set()
        if self._listener is not None:
            _close(self._listener)  # shutdown() wakes the blocked accept(); close() alone does not
        with self._lock:
            sockets = list(self._sockets)
        for s in sockets:
            _close(s)
        if self._accept_thread is not None:
            self._accept_thread.join(timeout=5)

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # listener closed by stop()
            with self._lock:
                full = self._active >= self.max_connections
                if full:
                    self.stats.refused_connections += 1
                else:
                    self._active += 1
                    self.stats.connections += 1
            if full:
                log.warning("tcp relay: %d connections open; refusing a new one", self.max_connections)
                _close(client)
                continue
            threading.Thread(target=self._serve, args=(client,), name="tcp-relay-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection(self.upstream, timeout=self.connect_timeout_s)
            upstream.settimeout(None)
        except OSError as exc:
            log.warning("tcp relay: cannot reach %s:%d: %s", *self.upstream, exc)
            _close(client)
            with self._lock:
                self._active -= 1
            return
        with self._lock:
            self._sockets.update((client, upstream))
        mod = self.rewrite() if self.rewrite is not None else None
        pumps = [
            threading.Thread(target=self._pump, args=(client, upstream, "up", mod), daemon=True),
            threading.Thread(target=self._pump, args=(upstream, client, "down", mod), daemon=True),
        ]
        for t in pumps:
            t.start()
        for t in pumps:
            t.join()
        for s in (client, upstream):
            _close(s)
        with self._lock:
            self._sockets.difference_update((client, upstream))
            self._active -= 1

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str, mod: ByteMod | None) -> None:
        sniffer = GrpcSniffer(direction)
        try:
            while True:
                data = src.recv(self.chunk_bytes)
                if not data:
                    break
                if mod is not None:
                    data = mod(data, direction)
                seen = sniffer.feed(data)
                with self._lock:
                    if direction == "up":
                        self.stats.bytes_up += len(data)
                    else:
                        self.stats.bytes_down += len(data)
                    self.stats.messages.update(m.DESCRIPTOR.name for m in seen)
                dst.sendall(data)
        except OSError:
            pass  # the other pump or stop() closed the sockets
        finally:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    s.close()


# ---------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vflnet proxy", description="A man-in-the-middle between two parties (network-level demos)."
    )
    parser.add_argument("--listen", required=True, help="HOST:PORT to accept connections on")
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the party to forward to")
    parser.add_argument(
        "--mode", choices=MODES, default="grpc", help="grpc (decode, tap, rewrite) or tcp (bytes)"
    )
    parser.add_argument("--trace", type=Path, help="grpc mode: append every message to this trace file")
    parser.add_argument("--run-id", default="", help="run id written in the trace header")
    parser.add_argument("--name", default="proxy", help="name of this process in events and traces")
    parser.add_argument(
        "--config", type=Path, help="run config: its transport settings (message size limits...)"
    )
    parser.add_argument(
        "--allow-plaintext-remote",
        action="store_true",
        help="allow a non-loopback --listen/--upstream (the proxy only ever speaks plaintext)",
    )
    parser.add_argument("--max-connections", type=int, default=32, help="tcp mode: concurrent connections")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return parser


class StopSignals:
    """SIGINT and SIGTERM, caught from construction on: construct it before announcing readiness, so a
    signal sent as soon as the process says it serves is never lost nor fatal.

    The handler does nothing in Python; the interpreter writes each signal's number to a pipe
    (``signal.set_wakeup_fd``) and :meth:`wait` reads it. A handler that set a ``threading.Event``
    could deadlock: ``Event.wait`` holds the event's lock for a few bytecodes, and a signal handled
    there blocked forever on that same lock.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self._read, write = os.pipe()
        os.set_blocking(write, False)
        signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        for sig in self.SIGNALS:
            signal.signal(sig, _ignore_signal)
        # `kill -USR1 <pid>` prints every thread's stack to stderr: how a stuck proxy is diagnosed
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    def wait(self) -> int:
        """Block until SIGINT or SIGTERM has arrived (at any time since construction); return it."""
        while True:
            signum = os.read(self._read, 1)[0]
            if signum in self.SIGNALS:
                return signum


def _ignore_signal(signum: int, frame: FrameType | None) -> None:
    """Replaces the default action (exit at once); :class:`StopSignals` sees the signal on its pipe."""


def serve_until_signal(server: grpc.Server, writer: TraceWriter | None, stop: StopSignals) -> None:
    """Serve until SIGINT/SIGTERM, then stop the server and close the trace (durable on close)."""
    signum = stop.wait()
    log.info("%s: stopping", signal.Signals(signum).name)
    stop_server(server, grace=2)
    server.forwarding.channel.close()  # type: ignore[attr-defined]
    if writer is not None:
        writer.close()


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.trace and args.mode == "tcp":
        parser.error("--trace needs --mode grpc (a TCP relay forwards bytes it does not decode)")
    logging.basicConfig(
        level=getattr(logging, args.log_level),
        format=f"%(asctime)s {args.name} %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    transport = TransportConfig()
    run_id = args.run_id
    if args.config:
        from vflnet.validation import load_config

        cfg = load_config(args.config)
        transport, run_id = cfg.transport, run_id or cfg.run.id
    if args.allow_plaintext_remote:
        transport = dataclasses.replace(transport, allow_plaintext_remote=True)
    stop = StopSignals()
    if args.mode == "tcp":
        relay = TcpRelay(args.listen, args.upstream, max_connections=args.max_connections)
        port = relay.start()
        print(f"proxy {args.name} (tcp) on port {port} -> {args.upstream}", flush=True)
        stop.wait()
        relay.stop()
        s = relay.stats
        print(
            f"relayed {s.connections} connections, {s.bytes_up} B up, {s.bytes_down} B down, "
            f"{s.messages_seen} vflnet messages seen"
        )
        return 0
    writer = TraceWriter(args.trace, party=args.name, run_id=run_id) if args.trace else None
    chain = Chain([writer] if writer is not None else [])
    server, port = run_proxy(args.listen, args.upstream, chain, transport, name=args.name)
    print(f"proxy {args.name} (grpc) on port {port} -> {args.upstream}", flush=True)
    serve_until_signal(server, writer, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
