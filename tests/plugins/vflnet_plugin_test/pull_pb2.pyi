from vflnet.v1 import messages_pb2 as _messages_pb2
from vflnet.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PullRequest(_message.Message):
    __slots__ = ("header", "sample_ids")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    sample_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[_messages_pb2.Header, _Mapping]] = ..., sample_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class PullReply(_message.Message):
    __slots__ = ("header", "values")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    values: _tensor_pb2.Tensor
    def __init__(self, header: _Optional[_Union[_messages_pb2.Header, _Mapping]] = ..., values: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class PushGradient(_message.Message):
    __slots__ = ("header", "values")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    values: _tensor_pb2.Tensor
    def __init__(self, header: _Optional[_Union[_messages_pb2.Header, _Mapping]] = ..., values: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class PushAck(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    def __init__(self, header: _Optional[_Union[_messages_pb2.Header, _Mapping]] = ...) -> None: ...
