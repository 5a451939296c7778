"""Encryption randomness in the style of Damgard-Jurik-Nielsen (DJN), with a fixed-base table.

A textbook Paillier encryption multiplies (1 + m*n) by r^n mod n^2 for a uniform r in Z_n^*, which
costs one full-length exponentiation (|n| bits) per ciphertext. DJN instead fixes h_s = h^n mod n^2
for h = -x^2 mod n (x random, secret to this process) and uses h_s^a with a random exponent a.
Because the base is fixed, h_s^a is a product of one precomputed table entry per byte of a:

    table[j][d] = h_s^(d * 256^j),   h_s^a = prod_j table[j][byte_j(a)]   (mod n^2)

so a 224-bit exponent costs 27 modular multiplications and no squaring.

SECURITY NOTE. The exponent length is a trade-off. DJN analyse exponents of about |n|/2 bits; the
default here is shorter: 2x the security level of the key size (NIST SP 800-57: 1024 -> 80,
2048 -> 112, 3072 -> 128 bits, so 160/224/256-bit exponents). Generic attacks on a short exponent
(baby-step giant-step, Pollard lambda) then cost about 2^security, but semantic security rests on
a short-exponent assumption in addition to decisional composite residuosity. Pass
`exponent_bits=n_bits // 2` to `PublicKey` for the DJN length (still fast: one multiplication per
exponent byte).
"""

from __future__ import annotations

import secrets

import gmpy2
import numpy as np
from gmpy2 import mpz

_WINDOW_BITS = 8
_TABLE_SIZE = 1 << _WINDOW_BITS


def default_exponent_bits(n_bits: int) -> int:
    """Twice the NIST security level of an n of `n_bits` bits (at least 128 for toy keys)."""
    if n_bits >= 3072:
        security = 128
    elif n_bits >= 2048:
        security = 112
    elif n_bits >= 1024:
        security = 80
    else:
        security = 64
    return 2 * security


def object_array(items: list, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """An object ndarray holding `items` as they are (numpy never tries to look inside an mpz)."""
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out if shape is None else out.reshape(shape)


class DjnRandomness:
    """Fixed-base table of h_s for one modulus; produces obfuscating factors h_s^a mod n^2."""

    def __init__(self, n: int, hs: int, exponent_bits: int) -> None:
        self.n = mpz(n)
        self.nsquare = self.n * self.n
        self.hs = mpz(hs)
        self.exponent_bits = exponent_bits
        self.windows = -(-exponent_bits // _WINDOW_BITS)
        bases = [self.hs]
        for _ in range(self.windows - 1):
            bases.append(gmpy2.powmod(bases[-1], _TABLE_SIZE, self.nsquare))
        base_col = object_array(bases)
        table = np.empty((self.windows, _TABLE_SIZE), dtype=object)
        table[:, 0] = mpz(1)
        table[:, 1] = base_col
        for d in range(2, _TABLE_SIZE):
            table[:, d] = table[:, d - 1] * base_col % self.nsquare
        self.table = table

    @classmethod
    def create(cls, n: int, exponent_bits: int) -> DjnRandomness:
        """Pick a fresh secret x and build h_s = (-x^2 mod n)^n mod n^2."""
        n = mpz(n)
        while True:
            x = mpz(secrets.randbelow(int(n) - 2) + 2)
            if gmpy2.gcd(x, n) == 1:
                break
        h = (-x * x) % n
        return cls(n, gmpy2.powmod(h, n, n * n), exponent_bits)

    def factors(self, count: int) -> np.ndarray:
        """`count` independent factors h_s^a mod n^2 with uniform a in [0, 2^(8*windows))."""
        if count == 0:
            return np.empty(0, dtype=object)
        digits = np.frombuffer(secrets.token_bytes(count * self.windows), dtype=np.uint8)
        digits = digits.reshape(count, self.windows)
        acc = self.table[0][digits[:, 0]]
        for j in range(1, self.windows):
            acc = acc * self.table[j][digits[:, j]] % self.nsquare
        return acc
