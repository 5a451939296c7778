"""Request deserializers that never raise: bytes that are not the method's message reach the handler
as :class:`Undecodable`, which answers INVALID_ARGUMENT (a raising deserializer makes gRPC answer
INTERNAL and log a full traceback per call)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Undecodable:
    """What the request deserializer hands a handler for bytes that are not the method's message."""

    def __init__(self, error: Exception) -> None:
        self.error = error


def lenient_parser(message_cls: Any) -> Callable[[bytes], Any]:
    """``message_cls.FromString`` that returns Undecodable instead of raising: gRPC logs a raised
    deserializer error with a full traceback per call (log flooding) and answers INTERNAL."""

    def parse(data: bytes) -> Any:
        try:
            return message_cls.FromString(data)
        except Exception as exc:  # DecodeError, or a RuntimeWarning promoted to an error
            return Undecodable(exc)

    return parse
