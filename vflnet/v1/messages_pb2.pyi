from vflnet.v1 import tensor_pb2 as _tensor_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    TRAIN: _ClassVar[Phase]
    EVAL: _ClassVar[Phase]
    PREDICT: _ClassVar[Phase]
PHASE_UNSPECIFIED: Phase
TRAIN: Phase
EVAL: Phase
PREDICT: Phase

class Header(_message.Message):
    __slots__ = ("run_id", "step", "batch_id", "sender", "model_version", "epoch", "phase")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    BATCH_ID_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step: int
    batch_id: int
    sender: str
    model_version: int
    epoch: int
    phase: Phase
    def __init__(self, run_id: _Optional[str] = ..., step: _Optional[int] = ..., batch_id: _Optional[int] = ..., sender: _Optional[str] = ..., model_version: _Optional[int] = ..., epoch: _Optional[int] = ..., phase: _Optional[_Union[Phase, str]] = ...) -> None: ...

class ProtocolData(_message.Message):
    __slots__ = ("tensors", "values")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: bytes
        def __init__(self, key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    tensors: _tensor_pb2.TensorMap
    values: _containers.ScalarMap[str, bytes]
    def __init__(self, tensors: _Optional[_Union[_tensor_pb2.TensorMap, _Mapping]] = ..., values: _Optional[_Mapping[str, bytes]] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("run_id", "name", "role", "address", "sample_ids", "resume", "step_work_s", "config", "protocol")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    RESUME_FIELD_NUMBER: _ClassVar[int]
    STEP_WORK_S_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    name: str
    role: str
    address: str
    sample_ids: _containers.RepeatedScalarFieldContainer[int]
    resume: bool
    step_work_s: float
    config: str
    protocol: ProtocolData
    def __init__(self, run_id: _Optional[str] = ..., name: _Optional[str] = ..., role: _Optional[str] = ..., address: _Optional[str] = ..., sample_ids: _Optional[_Iterable[int]] = ..., resume: _Optional[bool] = ..., step_work_s: _Optional[float] = ..., config: _Optional[str] = ..., protocol: _Optional[_Union[ProtocolData, _Mapping]] = ...) -> None: ...

class PartyInfo(_message.Message):
    __slots__ = ("name", "role", "address")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    name: str
    role: str
    address: str
    def __init__(self, name: _Optional[str] = ..., role: _Optional[str] = ..., address: _Optional[str] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("run_id", "roster", "train_ids", "test_ids", "resume_step", "resume_sha256", "step_deadline_s", "protocol")
    class ResumeSha256Entry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROSTER_FIELD_NUMBER: _ClassVar[int]
    TRAIN_IDS_FIELD_NUMBER: _ClassVar[int]
    TEST_IDS_FIELD_NUMBER: _ClassVar[int]
    RESUME_STEP_FIELD_NUMBER: _ClassVar[int]
    RESUME_SHA256_FIELD_NUMBER: _ClassVar[int]
    STEP_DEADLINE_S_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    roster: _containers.RepeatedCompositeFieldContainer[PartyInfo]
    train_ids: _containers.RepeatedScalarFieldContainer[int]
    test_ids: _containers.RepeatedScalarFieldContainer[int]
    resume_step: int
    resume_sha256: _containers.ScalarMap[str, str]
    step_deadline_s: float
    protocol: ProtocolData
    def __init__(self, run_id: _Optional[str] = ..., roster: _Optional[_Iterable[_Union[PartyInfo, _Mapping]]] = ..., train_ids: _Optional[_Iterable[int]] = ..., test_ids: _Optional[_Iterable[int]] = ..., resume_step: _Optional[int] = ..., resume_sha256: _Optional[_Mapping[str, str]] = ..., step_deadline_s: _Optional[float] = ..., protocol: _Optional[_Union[ProtocolData, _Mapping]] = ...) -> None: ...

class StepCommand(_message.Message):
    __slots__ = ("header", "sample_ids", "checkpoint_after", "protocol")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_AFTER_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    header: Header
    sample_ids: _containers.RepeatedScalarFieldContainer[int]
    checkpoint_after: bool
    protocol: ProtocolData
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., sample_ids: _Optional[_Iterable[int]] = ..., checkpoint_after: _Optional[bool] = ..., protocol: _Optional[_Union[ProtocolData, _Mapping]] = ...) -> None: ...

class StepReport(_message.Message):
    __slots__ = ("header", "metrics", "bytes_sent", "payload_bytes", "checkpoint_sha256", "protocol")
    class MetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    class BytesSentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class PayloadBytesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    HEADER_FIELD_NUMBER: _ClassVar[int]
    METRICS_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHECKPOINT_SHA256_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    header: Header
    metrics: _containers.ScalarMap[str, float]
    bytes_sent: _containers.ScalarMap[str, int]
    payload_bytes: _containers.ScalarMap[str, int]
    checkpoint_sha256: str
    protocol: ProtocolData
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., metrics: _Optional[_Mapping[str, float]] = ..., bytes_sent: _Optional[_Mapping[str, int]] = ..., payload_bytes: _Optional[_Mapping[str, int]] = ..., checkpoint_sha256: _Optional[str] = ..., protocol: _Optional[_Union[ProtocolData, _Mapping]] = ...) -> None: ...

class ShutdownRequest(_message.Message):
    __slots__ = ("run_id", "save_checkpoint", "reason", "sender")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SAVE_CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    save_checkpoint: bool
    reason: str
    sender: str
    def __init__(self, run_id: _Optional[str] = ..., save_checkpoint: _Optional[bool] = ..., reason: _Optional[str] = ..., sender: _Optional[str] = ...) -> None: ...

class ShutdownReply(_message.Message):
    __slots__ = ("checkpoint", "effects")
    CHECKPOINT_FIELD_NUMBER: _ClassVar[int]
    EFFECTS_FIELD_NUMBER: _ClassVar[int]
    checkpoint: str
    effects: str
    def __init__(self, checkpoint: _Optional[str] = ..., effects: _Optional[str] = ...) -> None: ...

class ReleaseCommand(_message.Message):
    __slots__ = ("header", "recipient", "modules")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_FIELD_NUMBER: _ClassVar[int]
    MODULES_FIELD_NUMBER: _ClassVar[int]
    header: Header
    recipient: str
    modules: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., recipient: _Optional[str] = ..., modules: _Optional[_Iterable[str]] = ...) -> None: ...

class ModelRelease(_message.Message):
    __slots__ = ("header", "modules", "parameters", "spec")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    MODULES_FIELD_NUMBER: _ClassVar[int]
    PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    SPEC_FIELD_NUMBER: _ClassVar[int]
    header: Header
    modules: _containers.RepeatedScalarFieldContainer[str]
    parameters: _tensor_pb2.TensorMap
    spec: str
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., modules: _Optional[_Iterable[str]] = ..., parameters: _Optional[_Union[_tensor_pb2.TensorMap, _Mapping]] = ..., spec: _Optional[str] = ...) -> None: ...

class ReleaseAck(_message.Message):
    __slots__ = ("header", "bytes_sent")
    class BytesSentEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    HEADER_FIELD_NUMBER: _ClassVar[int]
    BYTES_SENT_FIELD_NUMBER: _ClassVar[int]
    header: Header
    bytes_sent: _containers.ScalarMap[str, int]
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., bytes_sent: _Optional[_Mapping[str, int]] = ...) -> None: ...

class Embeddings(_message.Message):
    __slots__ = ("header", "sample_ids", "values", "cipher")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_IDS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    CIPHER_FIELD_NUMBER: _ClassVar[int]
    header: Header
    sample_ids: _containers.RepeatedScalarFieldContainer[int]
    values: _tensor_pb2.Tensor
    cipher: _tensor_pb2.CipherTensor
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., sample_ids: _Optional[_Iterable[int]] = ..., values: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., cipher: _Optional[_Union[_tensor_pb2.CipherTensor, _Mapping]] = ...) -> None: ...

class EmbeddingGradients(_message.Message):
    __slots__ = ("header", "values", "cipher")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    CIPHER_FIELD_NUMBER: _ClassVar[int]
    header: Header
    values: _tensor_pb2.Tensor
    cipher: _tensor_pb2.CipherTensor
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., values: _Optional[_Union[_tensor_pb2.Tensor, _Mapping]] = ..., cipher: _Optional[_Union[_tensor_pb2.CipherTensor, _Mapping]] = ...) -> None: ...

class DecryptRequest(_message.Message):
    __slots__ = ("header", "purpose", "cipher")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    CIPHER_FIELD_NUMBER: _ClassVar[int]
    header: Header
    purpose: str
    cipher: _tensor_pb2.CipherTensor
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., purpose: _Optional[str] = ..., cipher: _Optional[_Union[_tensor_pb2.CipherTensor, _Mapping]] = ...) -> None: ...

class DecryptReply(_message.Message):
    __slots__ = ("header", "shape", "integer_width", "integers")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    INTEGER_WIDTH_FIELD_NUMBER: _ClassVar[int]
    INTEGERS_FIELD_NUMBER: _ClassVar[int]
    header: Header
    shape: _containers.RepeatedScalarFieldContainer[int]
    integer_width: int
    integers: bytes
    def __init__(self, header: _Optional[_Union[Header, _Mapping]] = ..., shape: _Optional[_Iterable[int]] = ..., integer_width: _Optional[int] = ..., integers: _Optional[bytes] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("data", "index", "count")
    DATA_FIELD_NUMBER: _ClassVar[int]
    INDEX_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    index: int
    count: int
    def __init__(self, data: _Optional[bytes] = ..., index: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class ReplyTicket(_message.Message):
    __slots__ = ("token",)
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    token: str
    def __init__(self, token: _Optional[str] = ...) -> None: ...
