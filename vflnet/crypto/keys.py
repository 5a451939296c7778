"""Paillier key pairs, compatible with `phe` (python-paillier), with a JSON format on disk.

The engine always uses g = n + 1 (as `phe` does), so g^m = 1 + m*n mod n^2 needs no exponentiation.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import gmpy2
import numpy as np
import phe
from gmpy2 import mpz

from vflnet.crypto.randomness import DjnRandomness, default_exponent_bits

if TYPE_CHECKING:
    from vflnet.crypto.cipher import CipherArray

log = logging.getLogger(__name__)

DEFAULT_KEY_BITS = 2048
MIN_SECURE_BITS = 1024
DEFAULT_FRAC_BITS = 32
_PUBLIC_KIND = "vflnet.paillier.public"
_PRIVATE_KIND = "vflnet.paillier.private"


def key_id_of(n: int) -> str:
    """Fingerprint of a public key: first 16 hex chars of sha256 over n's big-endian bytes."""
    n = int(n)
    return hashlib.sha256(n.to_bytes((n.bit_length() + 7) // 8, "big")).hexdigest()[:16]


class PublicKey:
    """A Paillier public key n (g = n + 1) plus this process's encryption randomness.

    `exponent_bits` sets the length of the secret exponent of the DJN randomness h_s^a (see
    `vflnet.crypto.randomness`); None picks 2x the security level of the key size.
    """

    def __init__(self, n: int, exponent_bits: int | None = None) -> None:
        n = mpz(n)
        if n < 3 or n % 2 == 0:
            raise ValueError("a Paillier modulus n must be an odd integer > 2")
        self.n: mpz = n
        self.nsquare: mpz = n * n
        self.bits: int = int(n.bit_length())
        self.width: int = (int(self.nsquare.bit_length()) + 7) // 8
        self.max_int: mpz = n // 3
        self.key_id: str = key_id_of(int(n))
        self.exponent_bits: int = exponent_bits or default_exponent_bits(self.bits)
        self._randomness: DjnRandomness | None = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PublicKey) and other.n == self.n

    def __hash__(self) -> int:
        return hash(int(self.n))

    def __repr__(self) -> str:
        return f"PublicKey(bits={self.bits}, key_id={self.key_id})"

    @property
    def randomness(self) -> DjnRandomness:
        """Lazily built DJN fixed-base table for this key (kept in this process only)."""
        if self._randomness is None:
            self._randomness = DjnRandomness.create(self.n, self.exponent_bits)
        return self._randomness

    def encrypt(
        self,
        values: Any,
        frac_bits: int = DEFAULT_FRAC_BITS,
        *,
        pack: bool = False,
        slots: int | None = None,
        headroom_bits: int = 64,
        workers: int = 1,
    ) -> CipherArray:
        """Encrypt a float or integer array as fixed point value*2^frac_bits.

        pack=True packs several values of the last axis into one ciphertext, leaving `headroom_bits`
        per slot for later growth: the default 64 covers one product with a plaintext of 32
        fractional bits and magnitude < 2^8 summed over up to 2^24 terms; use 0 for arrays that
        are only decrypted. `slots` forces a slot count instead.
        """
        from vflnet.crypto.cipher import encrypt_array

        return encrypt_array(
            self, values, frac_bits, pack=pack, slots=slots, headroom_bits=headroom_bits, workers=workers
        )

    def to_phe(self) -> phe.PaillierPublicKey:
        return phe.PaillierPublicKey(int(self.n))

    @classmethod
    def from_phe(cls, key: phe.PaillierPublicKey) -> PublicKey:
        return cls(key.n)

    def to_json(self) -> dict[str, Any]:
        return {"kind": _PUBLIC_KIND, "key_id": self.key_id, "n": str(int(self.n))}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PublicKey:
        if obj.get("kind") not in (_PUBLIC_KIND, _PRIVATE_KIND):
            raise ValueError(f"not a vflnet Paillier key: kind={obj.get('kind')!r}")
        key = cls(int(obj["n"]))
        if "key_id" in obj and obj["key_id"] != key.key_id:
            raise ValueError(
                f"key file is inconsistent: key_id {obj['key_id']} does not match n ({key.key_id})"
            )
        return key


class PrivateKey:
    """The factorisation p, q of n, with the constants of CRT decryption precomputed."""

    def __init__(self, public_key: PublicKey, p: int, q: int) -> None:
        p, q = mpz(p), mpz(q)
        if p * q != public_key.n:
            raise ValueError("p * q does not equal the public modulus n")
        if p == q:
            raise ValueError("p and q must be distinct primes")
        if q < p:
            p, q = q, p
        self.public_key = public_key
        self.p, self.q = p, q
        self.psquare, self.qsquare = p * p, q * q
        self.q_inverse_mod_p = gmpy2.invert(q, p)
        self.hp = self._h(p, self.psquare)
        self.hq = self._h(q, self.qsquare)

    def _h(self, prime: mpz, prime_square: mpz) -> mpz:
        """h_p = L_p(g^(p-1) mod p^2)^-1 mod p, with g = n + 1."""
        g_pow = gmpy2.powmod(self.public_key.n + 1, prime - 1, prime_square)
        return gmpy2.invert((g_pow - 1) // prime, prime)

    def __repr__(self) -> str:
        return f"PrivateKey(bits={self.public_key.bits}, key_id={self.public_key.key_id})"

    def decrypt(self, ca: CipherArray, workers: int = 1) -> np.ndarray:
        """Decrypt to float64 values (value = encoded / 2^frac_bits), checking the tracked bound."""
        from vflnet.crypto.cipher import decrypt_array

        return decrypt_array(self, ca, workers=workers, as_float=True)

    def decrypt_encoded(self, ca: CipherArray, workers: int = 1) -> np.ndarray:
        """Decrypt to the exact signed fixed-point integers (object array of Python ints)."""
        from vflnet.crypto.cipher import decrypt_array

        return decrypt_array(self, ca, workers=workers, as_float=False)

    def to_phe(self) -> phe.PaillierPrivateKey:
        return phe.PaillierPrivateKey(self.public_key.to_phe(), int(self.p), int(self.q))

    @classmethod
    def from_phe(cls, key: phe.PaillierPrivateKey) -> PrivateKey:
        return cls(PublicKey.from_phe(key.public_key), key.p, key.q)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": _PRIVATE_KIND,
            "key_id": self.public_key.key_id,
            "n": str(int(self.public_key.n)),
            "p": str(int(self.p)),
            "q": str(int(self.q)),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PrivateKey:
        if obj.get("kind") != _PRIVATE_KIND:
            raise ValueError(f"not a vflnet Paillier private key: kind={obj.get('kind')!r}")
        return cls(PublicKey.from_json(obj), int(obj["p"]), int(obj["q"]))


def _random_prime(bits: int) -> mpz:
    """A random prime of exactly `bits` bits whose two top bits are set (so p*q has 2*bits bits)."""
    start = mpz(secrets.randbits(bits)) | (mpz(3) << (bits - 2)) | 1
    prime = gmpy2.next_prime(start)
    while prime.bit_length() != bits:
        start = mpz(secrets.randbits(bits)) | (mpz(3) << (bits - 2)) | 1
        prime = gmpy2.next_prime(start)
    return prime


def generate_keypair(
    bits: int = DEFAULT_KEY_BITS, allow_insecure: bool = False
) -> tuple[PublicKey, PrivateKey]:
    """Generate a key pair with an n of exactly `bits` bits (1024, 2048 or 3072 are usual).

    Sizes under 1024 bits are refused unless `allow_insecure=True` (tests use 512), and then warned.
    """
    if bits % 2 or bits < 128:
        raise ValueError(f"key size must be an even number of bits >= 128, got {bits}")
    if bits < MIN_SECURE_BITS:
        if not allow_insecure:
            raise ValueError(f"{bits}-bit Paillier keys are insecure; pass allow_insecure=True to use them")
        message = f"generating an INSECURE {bits}-bit Paillier key (for tests only)"
        warnings.warn(message, stacklevel=2)
        log.warning(message)
    while True:
        p = _random_prime(bits // 2)
        q = _random_prime(bits // 2)
        n = p * q
        if p != q and n.bit_length() == bits:
            break
    public = PublicKey(n)
    return public, PrivateKey(public, p, q)


def save_public_key(path: str | os.PathLike[str], key: PublicKey) -> None:
    Path(path).write_text(json.dumps(key.to_json(), indent=1) + "\n")


def load_public_key(path: str | os.PathLike[str]) -> PublicKey:
    return PublicKey.from_json(json.loads(Path(path).read_text()))


def save_keypair(path: str | os.PathLike[str], private_key: PrivateKey) -> None:
    """Write n, p, q as JSON, readable by the owner only (0600)."""
    text = json.dumps(private_key.to_json(), indent=1) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)


def load_keypair(path: str | os.PathLike[str]) -> tuple[PublicKey, PrivateKey]:
    private = PrivateKey.from_json(json.loads(Path(path).read_text()))
    return private.public_key, private
