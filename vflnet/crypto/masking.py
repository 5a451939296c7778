"""Additive masks for the decryption service (paper 004, Algorithm 1 lines 9-11).

A party that needs a value decrypted adds a random integer mask R to the fixed-point integers
*inside* the ciphertext, packs the result (so the coordinator decrypts fewer ciphertexts), and
removes R from the exact integers the coordinator returns. R is drawn uniformly from
[-2^(b+s), 2^(b+s)] where b bounds the value and s is the statistical security parameter, so
value + R is within statistical distance 2^-s of a value-independent distribution: the coordinator
learns nothing about the value, its low-order bits included.
"""

from __future__ import annotations

import secrets

import numpy as np

from vflnet.crypto import encoding
from vflnet.crypto.cipher import CipherArray

STATISTICAL_BITS = 40
HEADROOM_BITS = STATISTICAL_BITS + 2  # slot room `mask` needs above the values of a packed array


def mask(
    ca: CipherArray, statistical_bits: int = STATISTICAL_BITS, workers: int = 1
) -> tuple[CipherArray, np.ndarray]:
    """Return ([[v + R]] packed for decryption, R). R stays with the caller.

    An unpacked array is packed after masking; an array that is already packed is masked slot by
    slot, so its slots must have room for the mask: `statistical_bits` + 2 bits above its values
    (`HEADROOM_BITS` with the default).
    """
    span = 1 << (ca.value_bits + statistical_bits)
    flat = [secrets.randbelow(2 * span + 1) - span for _ in range(ca.size)]
    r = np.empty(ca.shape, dtype=object)
    r.reshape(-1)[:] = flat
    masked = ca.add_encoded(r)
    if not masked.packed and masked.ndim >= 1 and masked.shape[-1] > 1:
        masked = masked.pack(headroom_bits=0, workers=workers)
    return masked, r


def unmask(masked_ints: np.ndarray, r: np.ndarray, frac_bits: int) -> np.ndarray:
    """Exact (v + R) - R, then the fixed-point scale removed: float64 values."""
    return encoding.decode(masked_ints - r, frac_bits)


def ints_to_bytes(ints: np.ndarray) -> tuple[bytes, int]:
    """Fixed-width two's-complement big-endian encoding of an object array of Python ints."""
    flat = [int(v) for v in ints.reshape(-1)]
    width = max((v.bit_length() for v in flat), default=0) // 8 + 1
    return b"".join(v.to_bytes(width, "big", signed=True) for v in flat), width


def ints_from_bytes(data: bytes, width: int, shape: tuple[int, ...]) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if width <= 0 or len(data) != count * width:
        raise ValueError(f"{len(data)} bytes do not hold {count} integers of width {width}")
    out = np.empty(shape, dtype=object)
    out.reshape(-1)[:] = [
        int.from_bytes(data[i * width : (i + 1) * width], "big", signed=True) for i in range(count)
    ]
    return out
