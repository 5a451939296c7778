from vflnet.v1 import messages_pb2 as _messages_pb2
from vflnet.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class TreeStart(_message.Message):
    __slots__ = ("header", "sample_ids", "public_key", "plain", "cipher")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    PLAIN_FIELD_NUMBER: _ClassVar[int]
    CIPHER_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    sample_ids: _containers.RepeatedScalarFieldContainer[int]
    public_key: bytes
    plain: _tensor_pb2.Tensor
    cipher: _tensor_pb2.CipherTensor
    def __init__(self, header: _Optional[_Union[_messages_pb2.Header, _Mapping]] = ..., sample_ids: _Optional[_Iterable[int]] = ..., public_key: _Optional[bytes] = ..., plain: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., cipher: _Optional[_Union[_tensor_pb2.CipherTensor, _Mapping]] = ...) -> None: ...

class TreeStartAck(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    def __init__(self, header: _Optional[_Union[_messages_pb2.Header, _Mapping]] = ...) -> None: ...

class HistogramRequest(_message.Message):
    __slots__ = ("header", "node_of", "nodes")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    NODE_OF_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    node_of: _tensor_pb2.Tensor
    nodes: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[_messages_pb2.Header, _Mapping]] = ..., node_of: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., nodes: _Optional[_Iterable[int]] = ...) -> None: ...

class HistogramReply(_message.Message):
    __slots__ = ("header", "candidates", "plain", "cipher")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CANDIDATES_FIELD_NUMBER: _ClassVar[int]
    PLAIN_FIELD_NUMBER: _ClassVar[int]
    CIPHER_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    candidates: _containers.RepeatedScalarFieldContainer[int]
    plain: _tensor_pb2.Tensor
    cipher: _tensor_pb2.CipherTensor
    def __init__(self, header: _Optional[_Union[_messages_pb2.Header, _Mapping]] = ..., candidates: _Optional[_Iterable[int]] = ..., plain: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., cipher: _Optional[_Union[_tensor_pb2.CipherTensor, _Mapping]] = ...) -> None: ...

class SplitRequest(_message.Message):
    __slots__ = ("header", "node", "candidate")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    CANDIDATE_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    node: int
    candidate: int
    def __init__(self, header: _Optional[_Union[_messages_pb2.Header, _Mapping]] = ..., node: _Optional[int] = ..., candidate: _Optional[int] = ...) -> None: ...

class SplitReply(_message.Message):
    __slots__ = ("header", "split_id", "go_left")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SPLIT_ID_FIELD_NUMBER: _ClassVar[int]
    GO_LEFT_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    split_id: int
    go_left: _tensor_pb2.Tensor
    def __init__(self, header: _Optional[_Union[_messages_pb2.Header, _Mapping]] = ..., split_id: _Optional[int] = ..., go_left: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...

class RouteRequest(_message.Message):
    __slots__ = ("header", "sample_ids", "split_ids")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    SPLIT_IDS_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    sample_ids: _containers.RepeatedScalarFieldContainer[int]
    split_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, header: _Optional[_Union[_messages_pb2.Header, _Mapping]] = ..., sample_ids: _Optional[_Iterable[int]] = ..., split_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class RouteReply(_message.Message):
    __slots__ = ("header", "go_left")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    GO_LEFT_FIELD_NUMBER: _ClassVar[int]
    header: _messages_pb2.Header
    go_left: _tensor_pb2.Tensor
    def __init__(self, header: _Optional[_Union[_messages_pb2.Header, _Mapping]] = ..., go_left: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ...) -> None: ...
