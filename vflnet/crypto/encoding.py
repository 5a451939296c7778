"""Fixed-point encoding and slot packing, kept apart from encryption so each can be tested alone.

Fixed point: a real x is stored as the integer round(x * 2^frac_bits). Plaintexts live modulo n;
a negative integer v is stored as n + v, so residues above n/2 read back as negative. The engine
tracks an upper bound on |v| for every array and refuses operations that could leave the range
(-n/3, n/3) (the range `phe` accepts too), so a residue never wraps silently.

Packing layout: `slots` = k signed values of the last axis share one plaintext

    m = sum_j v_j * 2^(j*w),   w = (bits(n) - 2) // k   (slot j = element j of its group)

with |v_j| < 2^(w-1). The identity is over the integers, so it survives homomorphic addition and
multiplication by one integer shared by all k slots (carries and borrows cancel exactly). Reading
back takes balanced remainders from the lowest slot up: v_0 = m mods 2^w, m <- (m - v_0) / 2^w,
and so on; the rest must be 0 and padding slots (when the last axis is not a multiple of k) must be
0, otherwise a slot overflowed or the ciphertext was tampered with. |m| < 2^(kw-1) <= n/3.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vflnet.crypto.errors import PaillierOverflowError

_INT64_SAFE = 1 << 62


def encode(values: Any, frac_bits: int) -> np.ndarray:
    """Exact fixed-point integers round(values * 2^frac_bits) as an object array of Python ints."""
    if frac_bits < 0:
        raise ValueError(f"frac_bits must be >= 0, got {frac_bits}")
    arr = np.asarray(values)
    kind = arr.dtype.kind
    if kind in "iub":
        ints = arr.astype(object)
        if frac_bits:
            ints.reshape(-1)[:] = [int(v) << frac_bits for v in ints.reshape(-1)]
        return ints
    if kind == "f":
        if not np.all(np.isfinite(arr)):
            raise ValueError("cannot encode NaN or infinite values")
        scaled = np.asarray(np.rint(np.ldexp(arr.astype(np.float64), frac_bits)))
        if scaled.size == 0 or np.max(np.abs(scaled)) < _INT64_SAFE:
            return scaled.astype(np.int64).astype(object)
        out = np.empty(scaled.shape, dtype=object)
        out.reshape(-1)[:] = [int(v) for v in scaled.reshape(-1)]
        return out
    if kind == "O":
        out = np.empty(arr.shape, dtype=object)
        flat = []
        for v in arr.reshape(-1):
            if isinstance(v, float | np.floating) or not hasattr(v, "__index__"):
                raise TypeError(f"object arrays must hold integers, got {type(v).__name__}")
            flat.append(int(v) << frac_bits)
        out.reshape(-1)[:] = flat
        return out
    raise TypeError(f"cannot encode values of dtype {arr.dtype}")


def max_abs(ints: np.ndarray) -> int:
    """Largest |v| of an object array of integers (0 for an empty array)."""
    return max((abs(int(v)) for v in ints.reshape(-1)), default=0)


def decode(ints: np.ndarray, frac_bits: int) -> np.ndarray:
    """Float64 values v / 2^frac_bits, correctly rounded from the exact integers."""
    scale = 1 << frac_bits
    flat = np.fromiter((int(v) / scale for v in ints.reshape(-1)), dtype=np.float64, count=ints.size)
    return flat.reshape(ints.shape)


def slot_width(n_bits: int, slots: int) -> int:
    """Bits of one slot when `slots` values share a plaintext of an n with `n_bits` bits."""
    if slots < 1:
        raise ValueError(f"slots must be >= 1, got {slots}")
    width = (n_bits - 2) // slots
    if width < 2:
        raise ValueError(f"{slots} slots do not fit in a {n_bits}-bit plaintext")
    return width


def slot_capacity(n_bits: int, slots: int) -> int:
    """Largest |v| a slot may hold: 2^(w-1) - 1."""
    return (1 << (slot_width(n_bits, slots) - 1)) - 1


def max_slots(n_bits: int, value_bits: int) -> int:
    """Most slots such that each slot has at least `value_bits` bits (sign included)."""
    return max(1, (n_bits - 2) // value_bits)


def packed_count(length: int, slots: int) -> int:
    """Number of ciphertexts holding a last axis of `length` values."""
    return -(-length // slots)


def pack(ints: np.ndarray, slots: int, width: int) -> np.ndarray:
    """Pack the last axis, `slots` values per integer (zero padded); returns signed integers."""
    length = ints.shape[-1]
    groups = packed_count(length, slots)
    pad = groups * slots - length
    if pad:
        zeros = np.empty(ints.shape[:-1] + (pad,), dtype=object)
        zeros.reshape(-1)[:] = [0] * zeros.size
        ints = np.concatenate([ints, zeros], axis=-1)
    grouped = ints.reshape(ints.shape[:-1] + (groups, slots))
    acc = grouped[..., slots - 1].copy()
    for j in range(slots - 2, -1, -1):
        acc = acc * (1 << width) + grouped[..., j]
    return acc


def unpack(packed: np.ndarray, slots: int, width: int, length: int, bound: int) -> np.ndarray:
    """Inverse of `pack` for signed integers, checking every slot against `bound`.

    Raises PaillierOverflowError when a slot exceeds `bound`, a padding slot is not zero, or bits
    are left above the top slot.
    """
    modulus = 1 << width
    half = modulus >> 1
    out_groups = np.empty(packed.shape + (slots,), dtype=object)
    flat_out = out_groups.reshape(-1, slots)
    for row, m in enumerate(packed.reshape(-1)):
        m = int(m)
        for j in range(slots):
            v = m % modulus
            if v >= half:
                v -= modulus
            flat_out[row, j] = v
            m = (m - v) >> width
        if m != 0:
            raise PaillierOverflowError(
                "packed plaintext has bits above its top slot: a slot overflowed or the ciphertext was altered"
            )
    out = out_groups.reshape(packed.shape[:-1] + (packed.shape[-1] * slots,))
    if out.shape[-1] > length and any(v != 0 for v in out[..., length:].reshape(-1)):
        raise PaillierOverflowError("a padding slot is not zero: overflow or altered ciphertext")
    out = out[..., :length]
    if max_abs(out) > bound:
        raise PaillierOverflowError(
            f"a decrypted slot exceeds the tracked bound 2^{int(bound).bit_length()}: overflow or altered ciphertext"
        )
    return out
