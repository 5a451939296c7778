"""Byte and protobuf codecs for `CipherArray` (never pickle).

Bytes: every ciphertext is `width` bytes big-endian (width = byte length of n^2), concatenated in
row-major order of the ciphertext array (for packed arrays: `shape[:-1] + (ceil(shape[-1]/slots),)`).

`vflnet.v1.CipherTensor` fields as used here:
  key_id      fingerprint of the public key; must match the receiver's key
  shape       logical (plaintext) shape
  frac_bits   fixed-point scale: value = encoded / 2^frac_bits
  slots       values per ciphertext (1 = unpacked); the slot width is (bits(n) - 2) // slots
  slot_bits   signed bit width every value fits in, |encoded| < 2^(slot_bits - 1): the overflow bound
              the receiver keeps tracking (<= the slot width for packed arrays)
  width       bytes per ciphertext
  depth       always 0: frac_bits already carries the scale of products

Messages over the gRPC limit are chunked by the transport (vflnet/wire/chunking.py), not here.
"""

from __future__ import annotations

from gmpy2 import mpz

from vflnet.crypto import encoding
from vflnet.crypto.cipher import CipherArray, PublicKey
from vflnet.crypto.randomness import object_array
from vflnet.v1 import tensor_pb2


def to_bytes(ca: CipherArray) -> bytes:
    """Fixed-width big-endian ciphertexts, row-major."""
    width = ca.public_key.width
    return b"".join(int(c).to_bytes(width, "big") for c in ca.data.reshape(-1))


def from_bytes(
    data: bytes,
    public_key: PublicKey,
    shape: tuple[int, ...],
    frac_bits: int,
    bound: int,
    slots: int = 1,
) -> CipherArray:
    """Parse `to_bytes` output; checks the length and that every ciphertext lies in (0, n^2)."""
    width = public_key.width
    data_shape = shape if slots == 1 else shape[:-1] + (encoding.packed_count(shape[-1], slots),)
    count = 1
    for dim in data_shape:
        count *= dim
    if len(data) != count * width:
        raise ValueError(
            f"ciphertext payload has {len(data)} bytes, expected {count} ciphertexts x {width} bytes = {count * width}"
        )
    view = memoryview(data)
    values = [int.from_bytes(view[i * width : (i + 1) * width], "big") for i in range(count)]
    nsquare = public_key.nsquare
    if any(v <= 0 or v >= nsquare for v in values):
        raise ValueError("a ciphertext is out of range (must satisfy 0 < c < n^2)")
    cts = object_array([mpz(v) for v in values], data_shape)
    return CipherArray(public_key, cts, shape, frac_bits, bound, slots, fresh=False)


def cipher_to_proto(ca: CipherArray, obfuscate: bool = True, workers: int = 1) -> tensor_pb2.CipherTensor:
    """Encode for the wire; arrays produced by arithmetic are re-randomised first (obfuscate=True)."""
    if obfuscate and not ca.fresh:
        ca = ca.rerandomize(workers=workers)
    return tensor_pb2.CipherTensor(
        key_id=ca.public_key.key_id,
        shape=list(ca.shape),
        frac_bits=ca.frac_bits,
        slots=ca.slots,
        slot_bits=ca.value_bits,
        width=ca.public_key.width,
        data=to_bytes(ca),
        depth=0,
    )


def cipher_from_proto(msg: tensor_pb2.CipherTensor, public_key: PublicKey) -> CipherArray:
    """Decode and validate a CipherTensor against the receiver's public key (ValueError if bad)."""
    if msg.key_id != public_key.key_id:
        raise ValueError(
            f"CipherTensor key_id {msg.key_id!r} does not match the public key {public_key.key_id!r}"
        )
    if msg.width != public_key.width:
        raise ValueError(f"CipherTensor width {msg.width} != {public_key.width} bytes of n^2")
    if msg.depth != 0:
        raise ValueError("CipherTensor depth must be 0 (the scale is carried by frac_bits)")
    if msg.frac_bits < 0:
        raise ValueError(f"CipherTensor frac_bits must be >= 0, got {msg.frac_bits}")
    shape = tuple(int(s) for s in msg.shape)
    if any(s < 0 for s in shape):
        raise ValueError(f"CipherTensor shape {shape} has a negative dimension")
    if msg.slots < 1 or (msg.slots > 1 and not shape):
        raise ValueError(f"CipherTensor slots must be >= 1 (and > 1 only with an axis), got {msg.slots}")
    if msg.slots > 1 and msg.slots > (public_key.bits - 2) // 2:
        raise ValueError(f"CipherTensor slots {msg.slots} do not fit a {public_key.bits}-bit key")
    capacity = public_key.max_int if msg.slots == 1 else encoding.slot_capacity(public_key.bits, msg.slots)
    if msg.slot_bits < 1 or msg.slot_bits - 1 > int(capacity).bit_length():
        raise ValueError(f"CipherTensor slot_bits {msg.slot_bits} out of range for this layout")
    bound = min((1 << (msg.slot_bits - 1)) - 1, int(capacity))
    return from_bytes(msg.data, public_key, shape, msg.frac_bits, bound, msg.slots)
