"""Conversion of ciphertexts between the engine and `phe` (python-paillier), the reference.

phe stores value = encoding * 16^exponent; the engine stores value = encoding / 2^frac_bits, so
frac_bits = -4 * exponent. Engine arrays are scaled up to a multiple of 4 fractional bits first.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import phe
from gmpy2 import mpz

from vflnet.crypto.cipher import CipherArray, PublicKey
from vflnet.crypto.errors import PaillierOverflowError
from vflnet.crypto.multiexp import powmod_elementwise
from vflnet.crypto.randomness import object_array


def to_phe_numbers(ca: CipherArray) -> np.ndarray:
    """Object array of `phe.EncryptedNumber` with the same values (unpacked arrays only)."""
    if ca.packed:
        raise ValueError("phe has no packed ciphertexts; decrypt with the engine or use an unpacked array")
    aligned = ca.with_frac_bits(ca.frac_bits + (-ca.frac_bits) % 4)
    phe_key = ca.public_key.to_phe()
    exponent = -(aligned.frac_bits // 4)
    numbers = [phe.EncryptedNumber(phe_key, int(c), exponent) for c in aligned.data.reshape(-1)]
    return object_array(numbers, ca.shape)


def from_phe_numbers(
    numbers: Iterable[phe.EncryptedNumber] | np.ndarray, public_key: PublicKey, max_abs: float
) -> CipherArray:
    """CipherArray from phe numbers under `public_key`, aligned to the finest exponent.

    phe tracks no bound, so the caller states `max_abs`, the largest |value| the numbers may
    hold; decryption re-checks it.
    """
    arr = np.asarray(numbers, dtype=object)
    flat = arr.reshape(-1)
    if any(x.public_key.n != public_key.n for x in flat):
        raise ValueError(f"phe numbers are not under the public key {public_key.key_id}")
    fracs = [-4 * x.exponent for x in flat]
    frac = max([0, *fracs])
    bound = math.ceil(abs(max_abs) * 2.0**frac)
    if bound > public_key.max_int:
        raise PaillierOverflowError(
            f"max_abs={max_abs} at {frac} fractional bits exceeds the plaintext space"
        )
    bases = object_array([mpz(x.ciphertext(be_secure=False)) for x in flat], arr.shape)
    exps = object_array([1 << (frac - f) for f in fracs], arr.shape)
    data = powmod_elementwise(bases, exps, public_key.nsquare)
    return CipherArray(public_key, data, arr.shape, frac, bound, fresh=False)
