"""Counts what a party sends, per RPC: serialized bytes on the wire and the raw tensor bytes inside."""

from __future__ import annotations

import threading
from collections import defaultdict

from google.protobuf.message import Message

from vflnet.v1 import tensor_pb2

GRPC_FRAME_PREFIX = 5  # gRPC's length-prefixed framing: 1 flag byte + 4 length bytes per message


def tensor_payload_bytes(msg: Message) -> int:
    """Sum of the raw data bytes of every Tensor / CipherTensor nested in ``msg``."""
    if isinstance(msg, tensor_pb2.Tensor | tensor_pb2.CipherTensor):
        return len(msg.data)
    total = 0
    for fd, value in msg.ListFields():
        if fd.message_type is None:
            continue
        if fd.message_type.GetOptions().map_entry:
            total += sum(tensor_payload_bytes(v) for v in value.values() if isinstance(v, Message))
        elif fd.is_repeated:
            total += sum(tensor_payload_bytes(v) for v in value)
        else:
            total += tensor_payload_bytes(value)
    return total


class Meter:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._bytes: dict[str, int] = defaultdict(int)
        self._payload: dict[str, int] = defaultdict(int)

    def record(self, method: str, msg: Message) -> None:
        wire = msg.ByteSize() + GRPC_FRAME_PREFIX
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
