"""Counts what a party sends, per RPC: serialized bytes on the wire and the raw tensor bytes inside."""

from __future__ import annotations

import threading
from collections import defaultdict
from typing import Any

from google.protobuf.message import Message

from vflnet.v1 import tensor_pb2

GRPC_FRAME_PREFIX = 5  # gRPC's length-prefixed framing: 1 flag byte + 4 length bytes per message


_SINGLE, _REPEATED, _MAP = 1, 2, 3
# per message field: how it may hold tensors (none: 0), worked out once per field, not per message
_FIELD_KIND: dict[Any, int] = {}


def _kind(fd: Any) -> int:
    kind = _FIELD_KIND.get(fd)
    if kind is None:
        if fd.message_type is None:
            kind = 0
        elif fd.message_type.GetOptions().map_entry:
            kind = _MAP if fd.message_type.fields_by_name["value"].message_type is not None else 0
        else:
            kind = _REPEATED if fd.is_repeated else _SINGLE
        _FIELD_KIND[fd] = kind
    return kind


def tensor_payload_bytes(msg: Message) -> int:
    """Sum of the raw data bytes of every Tensor / CipherTensor nested in ``msg``."""
    if isinstance(msg, tensor_pb2.Tensor | tensor_pb2.CipherTensor):
        return len(msg.data)
    total = 0
    for fd, value in msg.ListFields():
        kind = _kind(fd)
        if kind == _SINGLE:
            total += tensor_payload_bytes(value)
        elif kind == _REPEATED:
            total += sum(tensor_payload_bytes(v) for v in value)
        elif kind == _MAP:
            total += sum(tensor_payload_bytes(v) for v in value.values())
    return total


class Meter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: dict[str, int] = defaultdict(int)
        self._payload: dict[str, int] = defaultdict(int)

    def record(self, method: str, msg: Message, size: int | None = None) -> None:
        """Count ``msg`` as sent by ``method``; ``size``: its ``ByteSize()``, where the caller has it."""
        wire = (msg.ByteSize() if size is None else size) + GRPC_FRAME_PREFIX
        payload = tensor_payload_bytes(msg)
        with self._lock:
            self._bytes[method] += wire
            self._payload[method] += payload

    def take(self) -> tuple[dict[str, int], dict[str, int]]:
        """Counters since the last call, then reset."""
        with self._lock:
            out = dict(self._bytes), dict(self._payload)
            self._bytes.clear()
            self._payload.clear()
        return out
