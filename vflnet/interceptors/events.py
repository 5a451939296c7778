"""What a mod sees: one protobuf message crossing the wire, with where and when it crossed.

A ``WireEvent`` is built by an adapter (gRPC client or server interceptor, the proxy, or a trace
reader) and handed to every mod of a chain. It decodes lazily: a tap that only counts messages never
pays for turning tensor bytes into arrays.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass, field
from time import time as _now
from typing import Any, Literal, NamedTuple

import numpy as np
from google.protobuf import message_factory
from google.protobuf.message import Message

from vflnet.v1 import messages_pb2, services_pb2, tensor_pb2

Direction = Literal["request", "response"]
Side = Literal["client", "server", "proxy"]
DIRECTIONS: tuple[str, ...] = ("request", "response")
SIDES: tuple[str, ...] = ("client", "server", "proxy")
PARTY_SIDES: tuple[str, ...] = ("client", "server")  # a party's own channels (a proxy is no party)


def _method_table() -> dict[str, tuple[type[Message], type[Message]]]:
    table: dict[str, tuple[type[Message], type[Message]]] = {}
    for service in services_pb2.DESCRIPTOR.services_by_name.values():
        for method in service.methods:
            if method.client_streaming or method.server_streaming:
                continue  # the chunk transport (vflnet/wire/chunking.py): it carries the logical messages
            table[f"/{service.full_name}/{method.name}"] = (
                message_factory.GetMessageClass(method.input_type),
                message_factory.GetMessageClass(method.output_type),
            )
    return table


# Full gRPC method name -> (request class, response class), for every unary vflnet method.
METHODS: dict[str, tuple[type[Message], type[Message]]] = _method_table()


def register_service(service: Any) -> None:
    """Add a plug-in protocol's unary methods (a protobuf ServiceDescriptor) to ``METHODS``, so taps,
    traces, the proxy and ``vflnet.interceptors.bridge.add_handlers`` know their messages."""
    for method in service.methods:
        if not (method.client_streaming or method.server_streaming):
            METHODS[f"/{service.full_name}/{method.name}"] = (
                message_factory.GetMessageClass(method.input_type),
                message_factory.GetMessageClass(method.output_type),
            )


def method_short_names() -> frozenset[str]:
    """The short names of every registered unary method: what an attack's taps may name."""
    return frozenset(short_name(m) for m in METHODS)


def short_name(method: str) -> str:
    """``/vflnet.v1.Active/ExchangeEmbeddings`` -> ``ExchangeEmbeddings``."""
    return method.rsplit("/", 1)[-1]


def message_class(method: str, direction: str) -> type[Message] | None:
    """The class of ``method``'s request or response; None for a method vflnet does not define."""
    pair = METHODS.get(method)
    if pair is None:
        return None
    return pair[0] if direction == "request" else pair[1]


def walk_messages(msg: Message, kind: type[Message]) -> Iterator[tuple[str, Message]]:
    """Every nested message of class ``kind`` in ``msg``, with its dotted field path."""
    return _walk(msg, "", kind)


def _walk(msg: Message, prefix: str, kind: type[Message]) -> Iterator[tuple[str, Message]]:
    """Every nested message of class ``kind`` with its dotted field path (maps by key, lists by index)."""
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        path = f"{prefix}{fd.name}"
        if fd.message_type.GetOptions().map_entry:
            items: Any = ((f"{path}.{k}", v) for k, v in sorted(value.items()) if isinstance(v, Message))
        elif fd.is_repeated:
            items = ((f"{path}.{i}", v) for i, v in enumerate(value))
        else:
            items = ((path, value),)
        for sub_path, sub in items:
            if isinstance(sub, kind):
                yield sub_path, sub
            else:
                yield from _walk(sub, f"{sub_path}.", kind)


@functools.cache  # one entry per message type: a tap asks for every message it sees
def _has_header(descriptor: Any) -> bool:
    fd = descriptor.fields_by_name.get("header")
    return fd is not None and fd.message_type is messages_pb2.Header.DESCRIPTOR


def header_of(message: Message) -> messages_pb2.Header | None:
    """``message``'s ``Header``; None for messages without one (Join, Shutdown)."""
    if not _has_header(message.DESCRIPTOR):
        return None
    return message.header  # type: ignore[attr-defined]


class WireRecord(NamedTuple):
    """One message as it crossed the wire, as a trace records it: the one place a record's fields are
    written out. A trace tap alone in a chain (``chain.Recorder``) is handed one, built once by the hook
    that saw the message (a tuple: cheaper than an event), and passes that same object on to
    ``TraceWriter.write_record`` and ``trace.record_parts``; an event gives one with
    :meth:`WireEvent.as_record`."""

    direction: str
    side: str
    method: str
    party: str
    peer: str
    message: Message
    # the message's bytes as they crossed the wire, when known (None: serialize the message)
    data: bytes | None
    time: float  # when it was seen


@dataclass(frozen=True, init=False)
class WireEvent:
    """One message seen by a tap: ``message`` is the live protobuf object; mods must not mutate it
    (a rewrite returns a changed copy instead)."""

    direction: Direction
    side: Side
    method: str
    party: str
    peer: str
    message: Message
    time: float  # when the event was built, unless given
    # the message's bytes as they crossed (or will cross) the wire, when the adapter has them: a trace
    # records them as they are instead of serializing the message again; None after a rewrite
    data: bytes | None = field(default=None, repr=False, compare=False)

    def __init__(
        self,
        direction: Direction,
        side: Side,
        method: str,
        party: str,
        peer: str,
        message: Message,
        time: float | None = None,
        data: bytes | None = None,
    ) -> None:
        # one update of the frozen instance's attributes, not a setattr call per field: a traced party
        # builds an event for every message it sends or receives
        self.__dict__.update(
            direction=direction,
            side=side,
            method=method,
            party=party,
            peer=peer,
            message=message,
            time=_now() if time is None else time,
            data=data,
        )

    def as_record(self) -> WireRecord:
        """The record a trace holds of this event."""
        return WireRecord(
            self.direction, self.side, self.method, self.party, self.peer, self.message, self.data, self.time
        )

    def serialized(self) -> bytes:
        """The message's bytes: those on the wire when known, else protobuf's serialization."""
        return self.data if self.data is not None else self.message.SerializeToString()

    @property
    def short_method(self) -> str:
        return short_name(self.method)

    # ------------------------------------------------------------------ header
    @property
    def header(self) -> messages_pb2.Header | None:
        """The message's ``Header``; None for messages without one (Join, Shutdown)."""
        return header_of(self.message)

    def _header_field(self, name: str) -> Any:
        h = self.header
        return None if h is None else getattr(h, name)

    @property
    def run_id(self) -> str | None:
        return self._header_field("run_id")

    @property
    def step(self) -> int | None:
        return self._header_field("step")

    @property
    def batch_id(self) -> int | None:
        return self._header_field("batch_id")

    @property
    def sender(self) -> str | None:
        return self._header_field("sender")

    @property
    def model_version(self) -> int | None:
        return self._header_field("model_version")

    @property
    def epoch(self) -> int | None:
        return self._header_field("epoch")

    @property
    def phase(self) -> int | None:
        """``messages_pb2.TRAIN`` / ``EVAL`` / ``PREDICT`` (an int), or None."""
        return self._header_field("phase")

    # ------------------------------------------------------------------ payload
    @property
    def sample_ids(self) -> np.ndarray | None:
        """The message's ``sample_ids`` as int64 (empty when the field is empty); None when it has none."""
        if "sample_ids" not in self.message.DESCRIPTOR.fields_by_name:
            return None
        return np.asarray(self.message.sample_ids, dtype=np.int64)  # type: ignore[attr-defined]

    def tensor_protos(self) -> dict[str, tensor_pb2.Tensor]:
        """Every plaintext ``Tensor`` in the message by field path (e.g. ``values``), still encoded."""
        return dict(_walk(self.message, "", tensor_pb2.Tensor))

    def tensors(self) -> dict[str, np.ndarray]:
        """Every plaintext ``Tensor`` decoded to numpy. NaN/Inf are kept (a tap records what was sent);
        a malformed tensor raises ``vflnet.wire.tensors.PayloadError``."""
        from vflnet.wire import tensors as tensor_codec  # imports torch: not for `vflnet trace --help`

        return {
            path: tensor_codec.from_proto(t, require_finite=False, what=f"{self.short_method} {path}")
            for path, t in self.tensor_protos().items()
        }

    def ciphertexts(self, public_key: Any = None) -> dict[str, Any]:
        """Every ``CipherTensor`` by field path: the raw protos, or with ``public_key`` (a
        ``vflnet.crypto.cipher.PublicKey``) decoded to ``CipherArray`` (ValueError if key or layout mismatch)."""
        raw = dict(_walk(self.message, "", tensor_pb2.CipherTensor))
        if public_key is None:
            return raw
        from vflnet.crypto.wire import cipher_from_proto  # the crypto stack is heavy; only HE taps need it

        return {path: cipher_from_proto(c, public_key) for path, c in raw.items()}

    def describe(self) -> str:
        """One line for logs: method, direction, step, sender and payload shapes."""
        parts = [f"{self.side} {self.direction} {self.short_method}"]
        if self.step is not None:
            parts.append(f"step={self.step} sender={self.sender}")
        ids = self.sample_ids
        if ids is not None:
            parts.append(f"samples={len(ids)}")
        for path, t in self.tensor_protos().items():
            parts.append(f"{path}={t.dtype}{list(t.shape)}")
        for path, c in _walk(self.message, "", tensor_pb2.CipherTensor):
            parts.append(f"{path}=cipher{list(c.shape)}")
        return " ".join(parts)
