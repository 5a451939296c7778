"""Byte/protobuf codecs of CipherArray, validation of received messages."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from vflnet.crypto import PaillierOverflowError, generate_keypair
from vflnet.crypto.wire import (
    cipher_from_proto,
    cipher_to_proto,
    from_bytes,
    to_bytes,
)
from vflnet.v1 import tensor_pb2

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    PK, SK = generate_keypair(512, allow_insecure=True)
    OTHER_PK, _ = generate_keypair(512, allow_insecure=True)
X = np.random.default_rng(0).normal(size=(4, 7)) * 10


def test_bytes_are_fixed_width_big_endian_row_major() -> None:
    ca = PK.encrypt(X)
    raw = to_bytes(ca)
    assert PK.width == 128 and len(raw) == X.size * 128
    assert int.from_bytes(raw[128:256], "big") == ca.data[0, 1]
    back = from_bytes(raw, PK, X.shape, ca.frac_bits, ca.bound)
    assert np.array_equal(SK.decrypt(back), SK.decrypt(ca))
    with pytest.raises(ValueError, match="expected 28 ciphertexts"):
        from_bytes(raw[:-1], PK, X.shape, ca.frac_bits, ca.bound)
    with pytest.raises(ValueError, match="out of range"):
        from_bytes(b"\xff" * 128 + raw[128:], PK, X.shape, ca.frac_bits, ca.bound)


@pytest.mark.parametrize("pack", [False, True])
def test_proto_round_trip(pack: bool) -> None:
    ca = PK.encrypt(X, pack=pack)
    msg = cipher_to_proto(ca)
    assert isinstance(msg, tensor_pb2.CipherTensor)
    assert msg.key_id == PK.key_id and list(msg.shape) == [4, 7] and msg.width == 128
    assert msg.slots == ca.slots and msg.slot_bits == ca.value_bits and msg.depth == 0
    assert len(msg.data) == ca.data.size * 128
    wire_bytes = msg.SerializeToString()
    back = cipher_from_proto(tensor_pb2.CipherTensor.FromString(wire_bytes), PK)
    assert back.shape == ca.shape and back.slots == ca.slots and back.frac_bits == ca.frac_bits
    assert back.bound >= ca.bound
    assert np.array_equal(SK.decrypt(back), SK.decrypt(ca))


def test_received_arrays_keep_a_bound_for_further_arithmetic() -> None:
    g = PK.encrypt(X / 100)
    back = cipher_from_proto(cipher_to_proto(g), PK)
    w = np.random.default_rng(1).normal(size=(3, 4))
    assert np.allclose(SK.decrypt(w @ back), w @ (X / 100), atol=1e-8)
    lied = cipher_to_proto(PK.encrypt(X * 1e6))
    lied.slot_bits = 20  # claims |encoded| < 2^19 although values are ~2^55
    with pytest.raises(PaillierOverflowError):
        SK.decrypt(cipher_from_proto(lied, PK))


def test_arithmetic_results_are_rerandomised_on_encode() -> None:
    fresh = PK.encrypt(X)
    assert cipher_to_proto(fresh).data == to_bytes(fresh)  # already fresh: no extra work
    derived = fresh * 3
    msg = cipher_to_proto(derived)
    assert msg.data != to_bytes(derived)
    assert cipher_to_proto(derived, obfuscate=False).data == to_bytes(derived)
    assert np.array_equal(SK.decrypt(cipher_from_proto(msg, PK)), SK.decrypt(derived))


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("key_id", "0123456789abcdef", "key_id"),
        ("width", 64, "width"),
        ("depth", 1, "depth"),
        ("slots", 0, "slots"),
        ("frac_bits", -1, "frac_bits"),
        ("slot_bits", 0, "slot_bits"),
        ("slot_bits", 600, "slot_bits"),
        ("data", b"\x01" * 100, "bytes"),
    ],
)
def test_bad_messages_are_rejected_with_a_clear_error(field: str, value, match: str) -> None:
    msg = cipher_to_proto(PK.encrypt(X))
    setattr(msg, field, value)
    with pytest.raises(ValueError, match=match):
        cipher_from_proto(msg, PK)


def test_wrong_receiver_key_is_rejected() -> None:
    with pytest.raises(ValueError, match="does not match the public key"):
        cipher_from_proto(cipher_to_proto(PK.encrypt(X)), OTHER_PK)
