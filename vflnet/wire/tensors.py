"""Tensor codec: numpy arrays <-> ``vflnet.v1.Tensor`` (dtype + shape + raw little-endian bytes).

Decoding validates everything a receiver must not take on trust: the dtype is one we allow, the byte
length matches the shape, and (optionally) the shape is what the receiver expects and every value is
finite. A violation raises :class:`PayloadError`, which servicers turn into ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch

from vflnet.v1 import tensor_pb2

ALLOWED_DTYPES = {"float32", "float64", "int64", "int32", "uint8", "bool"}
MAX_DIMS = 32  # numpy's own limit is 64; no tensor here has more than a handful
# Looked up once, not per message: numpy computes ``dtype.name`` in Python (several us a call), and
# every tensor of a step passes here twice
_WIRE_DTYPE = {name: np.dtype(name).newbyteorder("<") for name in ALLOWED_DTYPES}  # as the bytes are
_HOST_DTYPE = {name: dtype.newbyteorder("=") for name, dtype in _WIRE_DTYPE.items()}  # as decoded
_NAME_OF = {  # a sender's array in either byte order (big-endian is converted as it is encoded)
    np.dtype(name).newbyteorder(order): name for name in ALLOWED_DTYPES for order in "<>="
}


class PayloadError(ValueError):
    """A received payload is malformed, has the wrong shape/dtype, or holds NaN/Inf."""


def to_proto(array: np.ndarray | torch.Tensor, into: tensor_pb2.Tensor | None = None) -> tensor_pb2.Tensor:
    """``array`` as a Tensor; ``into``: an empty Tensor field of a message to fill in place, which
    spares copying a built Tensor (the whole payload) into it."""
    if isinstance(array, torch.Tensor):
        array = array.detach().cpu().numpy()
    array = np.ascontiguousarray(array)
    name = _NAME_OF.get(array.dtype)
    if name is None:
        raise PayloadError(f"dtype {array.dtype.name} cannot be sent; allowed: {sorted(ALLOWED_DTYPES)}")
    data = array.astype(_WIRE_DTYPE[name], copy=False).tobytes()
    if into is None:
        return tensor_pb2.Tensor(dtype=name, shape=array.shape, data=data)
    into.dtype = name
    into.shape.extend(array.shape)
    into.data = data
    return into


def _shape(msg: tensor_pb2.Tensor, what: str) -> tuple[int, ...]:
    """The shape, refused before it is read if it has more dimensions than any tensor here (its
    element count is then a product of a few exact integers, never a wrapped int64)."""
    if len(msg.shape) > MAX_DIMS:
        raise PayloadError(f"{what}: {len(msg.shape)} dimensions; at most {MAX_DIMS}")
    return tuple(msg.shape)  # Python ints already (an int64 field)


def _shape_matches(shape: tuple[int, ...], expect: Sequence[int | None]) -> bool:
    if len(shape) != len(expect):
        return False
    for got, want in zip(shape, expect, strict=True):
        if want is not None and want != got:
            return False
    return True


def from_proto(
    msg: tensor_pb2.Tensor,
    *,
    expect_dtype: str | None = None,
    expect_shape: Sequence[int | None] | None = None,
    require_finite: bool = True,
    what: str = "tensor",
) -> np.ndarray:
    """Decode and validate. ``None`` in ``expect_shape`` matches any size on that axis. Bit-packed
    +/-1 codes decode to float32 where no other dtype is expected."""
    name = msg.dtype
    if name == PM1 and expect_dtype in (None, PM1):
        return from_pm1_proto(msg, expect_shape=expect_shape, what=what)
    dtype = _WIRE_DTYPE.get(name)
    if dtype is None:
        raise PayloadError(f"{what}: dtype {name!r} is not allowed")
    if expect_dtype is not None and name != expect_dtype:
        raise PayloadError(f"{what}: dtype {name} where {expect_dtype} was expected")
    shape = _shape(msg, what)
    if shape and min(shape) < 0:
        raise PayloadError(f"{what}: negative dimension in shape {shape}")
    if expect_shape is not None and not _shape_matches(shape, expect_shape):
        want = tuple("*" if e is None else e for e in expect_shape)
        raise PayloadError(f"{what}: shape {shape} where {want} was expected")
    n = math.prod(shape)
    data = msg.data
    if len(data) != n * dtype.itemsize:
        raise PayloadError(f"{what}: {len(data)} data bytes do not match shape {shape} of {name}")
    # a writable copy in this machine's byte order (frombuffer's view of the message is read-only)
    array = np.frombuffer(data, dtype=dtype).astype(_HOST_DTYPE[name]).reshape(shape)
    if require_finite and dtype.kind == "f" and not np.isfinite(array).all():
        raise PayloadError(f"{what}: contains NaN or Inf")
    return array


PM1 = "pm1"  # +/-1 values bit-packed: 1 bit each, +1 = bit set, row-major, numpy packbits (MSB first)


def to_pm1_proto(codes: np.ndarray | torch.Tensor) -> tensor_pb2.Tensor:
    """+/-1 codes (HashVFL) as one bit per value; anything else is refused before it is sent."""
    if isinstance(codes, torch.Tensor):
        codes = codes.detach().cpu().numpy()
    flat = np.asarray(codes).reshape(-1)
    if not np.isin(flat, (-1.0, 1.0)).all():
        raise PayloadError("only +/-1 values can be sent as bit-packed codes")
    return tensor_pb2.Tensor(dtype=PM1, shape=list(np.shape(codes)), data=np.packbits(flat > 0).tobytes())


def from_pm1_proto(
    msg: tensor_pb2.Tensor, *, expect_shape: Sequence[int | None] | None = None, what: str = "codes"
) -> np.ndarray:
    """Bit-packed +/-1 codes as float32; any other dtype, a wrong length or set padding bits is refused."""
    if msg.dtype != PM1:
        raise PayloadError(f"{what}: dtype {msg.dtype!r} where bit-packed +/-1 codes ({PM1!r}) were expected")
    shape = _shape(msg, what)
    if (shape and min(shape) < 0) or (expect_shape is not None and not _shape_matches(shape, expect_shape)):
        raise PayloadError(f"{what}: shape {shape} where {tuple(expect_shape or ())} was expected")
    n = math.prod(shape)
    if len(msg.data) != (n + 7) // 8:
        raise PayloadError(f"{what}: {len(msg.data)} bytes do not hold {n} bits")
    bits = np.unpackbits(np.frombuffer(msg.data, dtype=np.uint8))
    if bits[n:].any():
        raise PayloadError(f"{what}: padding bits after the {n} code bits are set")
    return np.where(bits[:n] == 1, 1.0, -1.0).astype(np.float32).reshape(shape)


def payload_bytes(msg: tensor_pb2.Tensor) -> int:
    """Raw tensor bytes carried by a message (what an ideal transport would send)."""
    return len(msg.data)


def to_tensor_map(values: dict[str, np.ndarray]) -> tensor_pb2.TensorMap:
    out = tensor_pb2.TensorMap()
    for name, value in values.items():
        out.tensors[name].CopyFrom(to_proto(value))
    return out


def from_tensor_map(msg: tensor_pb2.TensorMap, what: str) -> dict[str, np.ndarray]:
    return {
        name: from_proto(t, expect_dtype="float32", what=f"{what} {name}") for name, t in msg.tensors.items()
    }
