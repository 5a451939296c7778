"""Receiving ciphertext tensors: decode against the run's public key and the expected shape."""

from __future__ import annotations

from collections.abc import Sequence

from vflnet.crypto import CipherArray, PublicKey
from vflnet.crypto.wire import cipher_from_proto
from vflnet.v1 import tensor_pb2
from vflnet.wire.tensors import PayloadError


def cipher_from_proto_checked(
    msg: tensor_pb2.CipherTensor, public_key: PublicKey, expect_shape: Sequence[int], what: str
) -> CipherArray:
    try:
        ca = cipher_from_proto(msg, public_key)
    except ValueError as exc:
        raise PayloadError(f"{what}: {exc}") from exc
    if tuple(ca.shape) != tuple(expect_shape):
        raise PayloadError(
            f"{what}: ciphertext shape {tuple(ca.shape)} where {tuple(expect_shape)} was expected"
        )
    return ca
