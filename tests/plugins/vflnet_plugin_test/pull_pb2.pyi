from collections.abc import Iterable as _Iterable
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar

from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from google.protobuf.internal import containers as _containers

from vflnet.v1 import messages_pb2 as _messages_pb2
from vflnet.v1 import tensor_pb2 as _tensor_pb2

DESCRIPTOR: _descriptor.FileDescriptor

class PullRequest(_message.Message):
    __slots__ = ("header", "sample_ids")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    sample_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _messages_pb2.Header | _Mapping | None = ..., sample_ids: _Iterable[int] | None = ...) -> None: ...

class PullReply(_message.Message):
    __slots__ = ("header", "values")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    values: _tensor_pb2.Tensor
    def __init__(self, header: _messages_pb2.Header | _Mapping | None = ..., values: _tensor_pb2.Tensor | _Mapping | None = ...) -> None: ...

class PushGradient(_message.Message):
    __slots__ = ("header", "values")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    values: _tensor_pb2.Tensor
    def __init__(self, header: _messages_pb2.Header | _Mapping | None = ..., values: _tensor_pb2.Tensor | _Mapping | None = ...) -> None: ...

class PushAck(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    def __init__(self, header: _messages_pb2.Header | _Mapping | None = ...) -> None: ...
