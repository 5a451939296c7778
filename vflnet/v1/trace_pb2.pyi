from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TraceHeader(_message.Message):
    __slots__ = ("format_version", "run_id", "party", "created")
    FORMAT_VERSION_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    format_version: int
    run_id: str
    party: str
    created: float
    def __init__(self, format_version: _Optional[int] = ..., run_id: _Optional[str] = ..., party: _Optional[str] = ..., created: _Optional[float] = ...) -> None: ...

class TraceRecord(_message.Message):
    __slots__ = ("time", "party", "side", "direction", "method", "peer", "message_type", "message")
    TIME_FIELD_NUMBER: _ClassVar[int]
    PARTY_FIELD_NUMBER: _ClassVar[int]
    SIDE_FIELD_NUMBER: _ClassVar[int]
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_TYPE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    time: float
    party: str
    side: str
    direction: str
    method: str
    peer: str
    message_type: str
    message: bytes
    def __init__(self, time: _Optional[float] = ..., party: _Optional[str] = ..., side: _Optional[str] = ..., direction: _Optional[str] = ..., method: _Optional[str] = ..., peer: _Optional[str] = ..., message_type: _Optional[str] = ..., message: _Optional[bytes] = ...) -> None: ...

class TraceTruncated(_message.Message):
    __slots__ = ("time", "max_bytes", "first_dropped_method")
    TIME_FIELD_NUMBER: _ClassVar[int]
    MAX_BYTES_FIELD_NUMBER: _ClassVar[int]
    FIRST_DROPPED_METHOD_FIELD_NUMBER: _ClassVar[int]
    time: float
    max_bytes: int
    first_dropped_method: str
    def __init__(self, time: _Optional[float] = ..., max_bytes: _Optional[int] = ..., first_dropped_method: _Optional[str] = ...) -> None: ...

class TraceEntry(_message.Message):
    __slots__ = ("header", "record", "truncated")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    header: TraceHeader
    record: TraceRecord
    truncated: TraceTruncated
    def __init__(self, header: _Optional[_Union[TraceHeader, _Mapping]] = ..., record: _Optional[_Union[TraceRecord, _Mapping]] = ..., truncated: _Optional[_Union[TraceTruncated, _Mapping]] = ...) -> None: ...
