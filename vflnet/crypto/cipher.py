"""Paillier keys and `CipherArray`, the arrays of ciphertexts they make and read.

Keys and arrays are one module: a key encrypts into an array and decrypts one, and an array
carries its public key.

Paillier key pairs, compatible with `phe` (python-paillier), with a JSON format on disk.

The engine always uses g = n + 1 (as `phe` does), so g^m = 1 + m*n mod n^2 needs no exponentiation.

`CipherArray`: a numpy-shaped array of Paillier ciphertexts with its scale, layout and bound.

Every array carries
  * `frac_bits`: value = decrypted integer / 2^frac_bits. Multiplying by a plaintext encoded with
    f' fractional bits adds f' (the product of two fixed-point numbers has both scales); additions
    first align the smaller scale up (ciphertext^(2^d)).
  * `slots`: values of the last axis packed per ciphertext (1 = unpacked; layout in `encoding`).
  * `bound`: an upper bound on |encoded value| over the array, updated by every operation. An
    operation whose bound would exceed the plaintext space (n/3) or a packed slot raises
    `PaillierOverflowError` before anything is computed; decryption re-checks it.
  * `fresh`: True after encryption or `rerandomize()`. Arithmetic results are not fresh: their
    randomness is derived from the inputs, so they must be re-randomised before leaving a party
    (`vflnet.crypto.wire.cipher_to_proto` does it, like phe's be_secure).

Packed arrays support addition, plaintext addition, multiplication by plaintexts that are constant
within each ciphertext (e.g. a scalar, or a column vector), `rmatmul_plain` (P @ C, C packed along
its last axis), sums over leading axes, and indexing/reshape/concatenation of leading axes.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gmpy2
import numpy as np
import phe
from gmpy2 import mpz

from vflnet.crypto import encoding, opcount
from vflnet.crypto.errors import KeyMismatchError, PaillierOverflowError
from vflnet.crypto.multiexp import multi_exp, powmod_elementwise, powmod_scalar, prod_axis0
from vflnet.crypto.parallel import run_chunks, split_ranges
from vflnet.crypto.randomness import DjnRandomness, default_exponent_bits, object_array

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

        return decrypt_array(self, ca, workers=workers, as_float=True)

    def decrypt_encoded(self, ca: CipherArray, workers: int = 1) -> np.ndarray:
        """Decrypt to the exact signed fixed-point integers (object array of Python ints)."""

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


DEFAULT_MUL_FRAC_BITS = 32


def _data_shape(shape: tuple[int, ...], slots: int) -> tuple[int, ...]:
    if slots == 1:
        return shape
    return shape[:-1] + (encoding.packed_count(shape[-1], slots),)


class CipherArray:
    """Ciphertexts (object ndarray of mpz) under one public key; see the module docstring."""

    __array_ufunc__ = None  # make numpy defer `ndarray @ CipherArray`, `ndarray * CipherArray`, ...

    def __init__(
        self,
        public_key: PublicKey,
        data: np.ndarray,
        shape: Sequence[int],
        frac_bits: int,
        bound: int,
        slots: int = 1,
        fresh: bool = False,
    ) -> None:
        shape = tuple(int(s) for s in shape)
        if not isinstance(data, np.ndarray):  # 0-d object arithmetic yields a bare mpz
            data = np.asarray(data, dtype=object)
        if data.dtype != object:
            raise TypeError("ciphertext data must be an object array of gmpy2 mpz")
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        if slots > 1 and not shape:
            raise ValueError("a packed array needs at least one axis")
        if data.shape != _data_shape(shape, slots):
            raise ValueError(f"data shape {data.shape} does not match shape {shape} with {slots} slots")
        if frac_bits < 0:
            raise ValueError(f"frac_bits must be >= 0, got {frac_bits}")
        self.public_key = public_key
        self.data = data
        self.shape = shape
        self.frac_bits = int(frac_bits)
        self.slots = int(slots)
        self.bound = int(bound)
        self.fresh = fresh
        if self.bound > self.capacity:
            raise PaillierOverflowError(self._overflow_text("array", self.bound))

    # ----- layout -------------------------------------------------------------------------------
    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def packed(self) -> bool:
        return self.slots > 1

    @property
    def slot_width(self) -> int:
        """Bits per slot of the packing layout (the whole plaintext when unpacked)."""
        if self.slots == 1:
            return self.public_key.bits
        return encoding.slot_width(self.public_key.bits, self.slots)

    @property
    def capacity(self) -> int:
        """Largest |encoded value| this layout can hold."""
        if self.slots == 1:
            return int(self.public_key.max_int)
        return encoding.slot_capacity(self.public_key.bits, self.slots)

    @property
    def value_bits(self) -> int:
        """Signed bit width every value fits in: |v| < 2^(value_bits - 1)."""
        return self.bound.bit_length() + 1

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d CipherArray")
        return self.shape[0]

    def __repr__(self) -> str:
        return (
            f"CipherArray(shape={self.shape}, frac_bits={self.frac_bits}, slots={self.slots}, "
            f"value_bits={self.value_bits}, key_id={self.public_key.key_id})"
        )

    def _like(self, data: np.ndarray, shape: Sequence[int], frac_bits: int, bound: int) -> CipherArray:
        return CipherArray(self.public_key, data, shape, frac_bits, bound, self.slots, fresh=False)

    def _overflow_text(self, op: str, bound: int) -> str:
        where = f"a {self.slot_width}-bit packed slot" if self.packed else "the plaintext space (n/3)"
        return (
            f"{op}: values may reach 2^{int(bound).bit_length()} in magnitude, more than {where} holds "
            f"(2^{self.capacity.bit_length()}); use fewer frac_bits, a larger key, or more packing headroom"
        )

    def _check_bound(self, op: str, bound: int) -> int:
        if bound > self.capacity:
            raise PaillierOverflowError(self._overflow_text(op, bound))
        return bound

    def _same_key(self, other: CipherArray) -> None:
        if other.public_key != self.public_key:
            raise KeyMismatchError(
                f"ciphertexts under different public keys: {self.public_key.key_id} vs {other.public_key.key_id}"
            )

    # ----- scale --------------------------------------------------------------------------------
    def with_frac_bits(self, frac_bits: int) -> CipherArray:
        """The same values at a larger scale (multiplies every ciphertext's plaintext by 2^d)."""
        shift = frac_bits - self.frac_bits
        if shift < 0:
            raise ValueError("the scale of a ciphertext can only grow (division is not homomorphic)")
        if shift == 0:
            return self
        bound = self._check_bound("rescale", self.bound << shift)
        data = powmod_scalar(self.data, 1 << shift, self.public_key.nsquare)
        return self._like(data, self.shape, frac_bits, bound)

    # ----- addition -----------------------------------------------------------------------------
    def __add__(self, other: Any) -> CipherArray:
        if isinstance(other, CipherArray):
            return self._add_cipher(other)
        return self._add_plain(other)

    __radd__ = __add__

    def __neg__(self) -> CipherArray:
        n2 = self.public_key.nsquare
        data = object_array([gmpy2.invert(c, n2) for c in self.data.reshape(-1)], self.data.shape)
        return self._like(data, self.shape, self.frac_bits, self.bound)

    def __sub__(self, other: Any) -> CipherArray:
        if isinstance(other, CipherArray):
            return self._add_cipher(-other)
        return self._add_plain(-np.asarray(other))

    def __rsub__(self, other: Any) -> CipherArray:
        return (-self)._add_plain(other)

    def _add_cipher(self, other: CipherArray) -> CipherArray:
        self._same_key(other)
        if other.slots != self.slots:
            raise ValueError(
                f"cannot add arrays with different packing ({self.slots} vs {other.slots} slots)"
            )
        shape = np.broadcast_shapes(self.shape, other.shape)
        if self.packed and not (self.shape[-1] == other.shape[-1] == shape[-1]):
            raise ValueError("packed arrays can only broadcast along leading axes")
        frac = max(self.frac_bits, other.frac_bits)
        bound = (self.bound << (frac - self.frac_bits)) + (other.bound << (frac - other.frac_bits))
        self._check_bound("add", bound)
        a, b = self.with_frac_bits(frac), other.with_frac_bits(frac)
        opcount.count("add", int(np.prod(shape, dtype=np.int64)))
        data = a.data * b.data % self.public_key.nsquare
        return self._like(data, shape, frac, bound)

    def _add_plain(self, values: Any) -> CipherArray:
        return self.add_encoded(encoding.encode(values, self.frac_bits))

    def add_encoded(self, ints: np.ndarray) -> CipherArray:
        """Add exact integers at this array's fixed-point scale (no shift): how a party adds an
        integer-domain mask that also hides the low-order bits of every value."""
        ints = np.asarray(ints, dtype=object)
        shape = np.broadcast_shapes(self.shape, ints.shape)
        bound = self._check_bound("add plaintext", self.bound + encoding.max_abs(ints))
        ints = np.broadcast_to(ints, shape)
        opcount.count("add_plain", ints.size)
        data = self.data
        if self.packed:
            if shape[-1] != self.shape[-1]:
                raise ValueError("a plaintext added to a packed array may only broadcast along leading axes")
            ints = encoding.pack(np.ascontiguousarray(ints), self.slots, self.slot_width)
        n, n2 = self.public_key.n, self.public_key.nsquare
        g_m = np.asarray((ints % n * n + 1) % n2, dtype=object)
        data = np.broadcast_to(data, g_m.shape) * g_m % n2
        return self._like(data, shape, self.frac_bits, bound)

    # ----- multiplication by plaintexts ---------------------------------------------------------
    def __mul__(self, other: Any) -> CipherArray:
        if isinstance(other, CipherArray):
            raise TypeError("Paillier cannot multiply two ciphertexts; multiply by a plaintext instead")
        return self.mul(other)

    __rmul__ = __mul__

    def mul(self, values: Any, frac_bits: int | None = None, workers: int = 1) -> CipherArray:
        """Elementwise product with plaintext `values` (broadcast), encoded with `frac_bits`.

        `frac_bits` defaults to 0 for integer plaintexts and DEFAULT_MUL_FRAC_BITS for floats; the
        result has self.frac_bits + frac_bits fractional bits.
        """
        frac = _plain_frac_bits(values, frac_bits)
        ints = encoding.encode(values, frac)
        bound = self._check_bound("multiply", self.bound * encoding.max_abs(ints))
        shape = np.broadcast_shapes(self.shape, ints.shape)
        n2 = self.public_key.nsquare
        if self.packed:
            if shape[-1] != self.shape[-1]:
                raise ValueError(
                    "a plaintext multiplying a packed array may only broadcast along leading axes"
                )
            exps = _per_ciphertext(np.broadcast_to(ints, shape), self.slots)
        else:
            exps = np.broadcast_to(ints, shape)
        opcount.count_products(np.broadcast_to(ints, shape))
        data = np.broadcast_to(self.data, exps.shape)
        uniques = set(exps.reshape(-1)) if exps.size else set()
        if len(uniques) == 1:
            out = _chunked(_powmod_scalar_chunk, data, (uniques.pop(), n2), workers)
        else:
            out = _chunked_pairs(_powmod_elementwise_chunk, data, exps, n2, workers)
        return self._like(out, shape, self.frac_bits + frac, bound)

    def matmul_plain(
        self, matrix: Any, frac_bits: int | None = None, workers: int = 1, where: Any = None
    ) -> CipherArray:
        """C @ P for this (unpacked) array C of shape (K,) or (M, K) and a plaintext P of (K,) or (K, J).

        `where` (bool, the result's shape) computes only those outputs and leaves the others exact
        zeros: (C @ P) * where, at the cost of the computed outputs only (e.g. a ReLU mask).
        """
        if self.packed:
            raise ValueError(
                "C @ P needs one multiplier per slot; pack C.T instead and use rmatmul_plain (P.T @ C.T)"
            )
        frac = _plain_frac_bits(matrix, frac_bits)
        ints = encoding.encode(matrix, frac)
        if self.ndim not in (1, 2) or ints.ndim not in (1, 2) or self.shape[-1] != ints.shape[0]:
            raise ValueError(f"matmul_plain shapes do not match: {self.shape} @ {ints.shape}")
        bases = self.data.reshape(-1, self.shape[-1])
        exps = ints.reshape(ints.shape[0], -1)
        shape = self.shape[:-1] + ints.shape[1:]
        keep = None
        if where is not None:
            keep = np.asarray(where, dtype=bool)
            if keep.shape != shape:
                raise ValueError(f"where has shape {keep.shape}, the product {shape}")
            keep = keep.reshape(bases.shape[0], exps.shape[1])
        bound = self._check_bound("matmul", self.bound * _max_col_abs_sum(exps))
        kept = np.full(exps.shape[1], bases.shape[0], dtype=np.int64) if keep is None else keep.sum(axis=0)
        opcount.count_products(exps, kept[None, :], int(kept.sum()) * (exps.shape[0] - 1))
        out = multi_exp(bases, exps, self.public_key.nsquare, workers, keep)
        return self._like(out.reshape(shape), shape, self.frac_bits + frac, bound)

    def rmatmul_plain(self, matrix: Any, frac_bits: int | None = None, workers: int = 1) -> CipherArray:
        """P @ C for a plaintext P of (K,) or (M, K) and this array C of (K,) or (K, J).

        Works on packed C of shape (K, J): every row of C is scaled by one plaintext, so the packed
        ciphertexts combine as they are.
        """
        frac = _plain_frac_bits(matrix, frac_bits)
        ints = encoding.encode(matrix, frac)
        if self.ndim not in (1, 2) or ints.ndim not in (1, 2) or ints.shape[-1] != self.shape[0]:
            raise ValueError(f"rmatmul_plain shapes do not match: {ints.shape} @ {self.shape}")
        if self.packed and self.ndim != 2:
            raise ValueError("P @ C on a packed C needs C of shape (K, J), packed along J")
        rows = ints.reshape(-1, ints.shape[-1])
        bound = self._check_bound("matmul", self.bound * _max_col_abs_sum(rows.T))
        bases = self.data.reshape(self.data.shape[0], -1).T
        columns = self.shape[1] if self.ndim == 2 else 1
        opcount.count_products(rows, columns, rows.shape[0] * columns * (rows.shape[1] - 1))
        out = multi_exp(bases, rows.T, self.public_key.nsquare, workers).T
        shape = ints.shape[:-1] + self.shape[1:]
        return self._like(out.reshape(_data_shape(shape, self.slots)), shape, self.frac_bits + frac, bound)

    def __matmul__(self, other: Any) -> CipherArray:
        if isinstance(other, CipherArray):
            raise TypeError("Paillier cannot multiply two ciphertexts; use a plaintext matrix")
        return self.matmul_plain(other)

    def __rmatmul__(self, other: Any) -> CipherArray:
        return self.rmatmul_plain(other)

    # ----- reductions and shape helpers ---------------------------------------------------------
    def sum(self, axis: int | None = None) -> CipherArray:
        """Homomorphic sum over `axis` (all axes when None; packed arrays: leading axes only)."""
        if axis is None:
            if self.packed:
                raise ValueError("a packed array cannot be summed across its packed (last) axis")
            flat = self.data.reshape(-1, 1)
            opcount.count("add", max(0, self.size - 1))
            total = prod_axis0(flat, self.public_key.nsquare).reshape(())
            bound = self._check_bound("sum", self.bound * max(1, self.size))
            return self._like(total, (), self.frac_bits, bound)
        axis = axis % self.ndim if self.ndim else 0
        if self.packed and axis == self.ndim - 1:
            raise ValueError("a packed array cannot be summed across its packed (last) axis")
        bound = self._check_bound("sum", self.bound * max(1, self.shape[axis]))
        if self.shape[axis]:
            opcount.count("add", (self.shape[axis] - 1) * (self.size // self.shape[axis]))
        data = prod_axis0(np.moveaxis(self.data, axis, 0), self.public_key.nsquare)
        shape = self.shape[:axis] + self.shape[axis + 1 :]
        return self._like(np.asarray(data, dtype=object), shape, self.frac_bits, bound)

    def __getitem__(self, key: Any) -> CipherArray:
        if self.packed:
            keys = key if isinstance(key, tuple) else (key,)
            if len(keys) >= self.ndim or any(k is Ellipsis or k is None for k in keys):
                raise IndexError("packed arrays can only be indexed on leading axes (no ... or None)")
            data = self.data[keys]
            shape = data.shape[:-1] + (self.shape[-1],)
            return CipherArray(
                self.public_key, data, shape, self.frac_bits, self.bound, self.slots, self.fresh
            )
        data = np.asarray(self.data[key], dtype=object)
        return CipherArray(self.public_key, data, data.shape, self.frac_bits, self.bound, 1, self.fresh)

    def reshape(self, *shape: Any) -> CipherArray:
        target = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], Sequence) else tuple(shape)
        if self.packed:
            target = tuple(np.empty(self.shape, dtype=np.bool_).reshape(target).shape)
            if not target or target[-1] != self.shape[-1]:
                raise ValueError("reshaping a packed array must keep its last (packed) axis")
            data = self.data.reshape(target[:-1] + (self.data.shape[-1],))
            return CipherArray(
                self.public_key, data, target, self.frac_bits, self.bound, self.slots, self.fresh
            )
        data = self.data.reshape(target)
        return CipherArray(self.public_key, data, data.shape, self.frac_bits, self.bound, 1, self.fresh)

    def transpose(self, *axes: int) -> CipherArray:
        if self.packed:
            raise ValueError("a packed array cannot be transposed without decryption")
        data = self.data.transpose(*axes) if axes else self.data.T
        return CipherArray(self.public_key, data, data.shape, self.frac_bits, self.bound, 1, self.fresh)

    @property
    def T(self) -> CipherArray:  # noqa: N802 - numpy's name
        return self.transpose()

    # ----- packing and obfuscation --------------------------------------------------------------
    def pack(self, headroom_bits: int = 0, slots: int | None = None, workers: int = 1) -> CipherArray:
        """Pack an unpacked array along its last axis homomorphically (no key needed).

        Costs about bits(n) squarings mod n^2 per packed ciphertext (Horner: c_{k-1}^(2^w) * c_{k-2}
        ...), far less than decrypting every value, and shrinks the message by the slot count.
        """
        if self.packed:
            raise ValueError("array is already packed")
        if self.ndim == 0:
            raise ValueError("a 0-d array cannot be packed")
        k = slots or encoding.max_slots(self.public_key.bits, self.value_bits + headroom_bits)
        k = max(1, min(k, self.shape[-1]) if slots is None else k)
        if k == 1:
            return self
        width = encoding.slot_width(self.public_key.bits, k)
        if self.bound > encoding.slot_capacity(self.public_key.bits, k):
            raise PaillierOverflowError(f"values of {self.value_bits} bits do not fit {width}-bit slots")
        length = self.shape[-1]
        groups = encoding.packed_count(length, k)
        n2 = self.public_key.nsquare
        padded = self.data
        if groups * k != length:
            pad = np.empty(self.shape[:-1] + (groups * k - length,), dtype=object)
            pad.reshape(-1)[:] = [mpz(1)] * pad.size  # Enc(0) without randomness; padding stays 0
            padded = np.concatenate([self.data, pad], axis=-1)
        grouped = padded.reshape(self.shape[:-1] + (groups, k))
        # one group: start at its last value, not at padding (zeros cost squarings too)
        top = min(k, length) - 1
        acc = grouped[..., top].copy()
        for j in range(top - 1, -1, -1):
            acc = _chunked(_powmod_scalar_chunk, acc, (1 << width, n2), workers) * grouped[..., j] % n2
        return CipherArray(self.public_key, acc, self.shape, self.frac_bits, self.bound, k, fresh=False)

    def rerandomize(self, workers: int = 1) -> CipherArray:
        """Multiply every ciphertext by a fresh encryption of zero (hides how it was computed)."""
        pk = self.public_key
        flat = self.data.reshape(-1)
        opcount.count("obfuscate", self.size)
        ranges = split_ranges(flat.size, workers * 2 if workers > 1 else 1) if flat.size else []
        if workers == 1:
            factors = [pk.randomness.factors(flat.size)] if flat.size else []
        else:
            rnd = pk.randomness
            chunks = [(int(pk.n), int(rnd.hs), rnd.exponent_bits, b - a) for a, b in ranges]
            factors = run_chunks(_factors_chunk, chunks, workers)
        out = np.concatenate(factors) * flat % pk.nsquare if factors else flat.copy()
        data = out.reshape(self.data.shape)
        return CipherArray(pk, data, self.shape, self.frac_bits, self.bound, self.slots, fresh=True)


def concatenate(arrays: Sequence[CipherArray], axis: int = 0) -> CipherArray:
    """Join arrays along `axis` (aligning scales; packed arrays: leading axes only)."""
    if not arrays:
        raise ValueError("need at least one array to concatenate")
    first = arrays[0]
    for other in arrays[1:]:
        first._same_key(other)
        if other.slots != first.slots:
            raise ValueError("cannot concatenate arrays with different packing")
    ndim = first.ndim
    axis = axis % ndim
    if first.packed and axis == ndim - 1:
        raise ValueError("packed arrays can only be concatenated along leading axes")
    frac = max(a.frac_bits for a in arrays)
    aligned = [a.with_frac_bits(frac) for a in arrays]
    data = np.concatenate([a.data for a in aligned], axis=axis)
    shape = list(first.shape)
    shape[axis] = sum(a.shape[axis] for a in arrays)
    bound = max(a.bound for a in aligned)
    fresh = all(a.fresh for a in arrays) and all(a.frac_bits == frac for a in arrays)
    return CipherArray(first.public_key, data, tuple(shape), frac, bound, first.slots, fresh)


# ----- encryption and decryption ---------------------------------------------------------------
def encrypt_array(
    public_key: PublicKey,
    values: Any,
    frac_bits: int,
    *,
    pack: bool = False,
    slots: int | None = None,
    headroom_bits: int = 64,
    workers: int = 1,
) -> CipherArray:
    """Encode and encrypt (see `PublicKey.encrypt`)."""
    ints = encoding.encode(values, frac_bits)
    bound = encoding.max_abs(ints)
    if bound > public_key.max_int:
        raise PaillierOverflowError(
            f"values of {bound.bit_length()} bits exceed the plaintext space of a {public_key.bits}-bit key"
        )
    k = 1
    if slots is not None:
        k = slots
    elif pack and ints.ndim >= 1 and ints.shape[-1] > 1:
        k = min(ints.shape[-1], encoding.max_slots(public_key.bits, bound.bit_length() + 1 + headroom_bits))
    if k > 1:
        if ints.ndim == 0:
            raise ValueError("a scalar cannot be packed")
        if bound > encoding.slot_capacity(public_key.bits, k):
            raise PaillierOverflowError(f"values of {bound.bit_length()} bits do not fit {k} slots")
        plain = encoding.pack(ints, k, encoding.slot_width(public_key.bits, k))
    else:
        plain = ints
    opcount.count("encrypt", ints.size)
    flat = plain.reshape(-1)
    if workers == 1 or flat.size < 2:
        cts = _encrypt_with(public_key.randomness, flat)
    else:
        rnd = public_key.randomness
        ranges = split_ranges(flat.size, workers * 2)
        chunks = [(int(public_key.n), int(rnd.hs), rnd.exponent_bits, flat[a:b]) for a, b in ranges]
        cts = np.concatenate(run_chunks(_encrypt_chunk, chunks, workers))
    return CipherArray(public_key, cts.reshape(plain.shape), ints.shape, frac_bits, bound, k, fresh=True)


def decrypt_array(
    private_key: PrivateKey, ca: CipherArray, workers: int = 1, as_float: bool = True
) -> np.ndarray:
    """CRT decryption, signed decoding and bound/slot checks (see `PrivateKey.decrypt`)."""
    if ca.public_key != private_key.public_key:
        raise KeyMismatchError(
            f"ciphertexts are under key {ca.public_key.key_id}, the private key is {private_key.public_key.key_id}"
        )
    flat = ca.data.reshape(-1)
    opcount.count("decrypt", ca.size)
    consts = _crt_constants(private_key)
    ranges = split_ranges(flat.size, workers * 2 if workers > 1 else 1) if flat.size else []
    parts = run_chunks(_decrypt_chunk, [(consts, flat[a:b]) for a, b in ranges], workers)
    residues = [m for part in parts for m in part]
    n = private_key.public_key.n
    half = n // 2
    signed = object_array([int(m - n) if m > half else int(m) for m in residues], ca.data.shape)
    if ca.packed:
        ints = encoding.unpack(signed, ca.slots, ca.slot_width, ca.shape[-1], ca.bound)
    else:
        ints = signed.reshape(ca.shape)
        if encoding.max_abs(ints) > ca.bound:
            raise PaillierOverflowError(
                f"a decrypted value exceeds the tracked bound 2^{ca.bound.bit_length()}: "
                "overflow or an altered ciphertext"
            )
    return encoding.decode(ints, ca.frac_bits) if as_float else ints


# ----- helpers (module level so worker processes can import them) ------------------------------
_WORKER_RANDOMNESS: dict[tuple[int, int, int], DjnRandomness] = {}


def _worker_randomness(n: int, hs: int, exponent_bits: int) -> DjnRandomness:
    key = (n, hs, exponent_bits)
    if key not in _WORKER_RANDOMNESS:
        _WORKER_RANDOMNESS[key] = DjnRandomness(n, hs, exponent_bits)
    return _WORKER_RANDOMNESS[key]


def _encrypt_with(randomness: DjnRandomness, plaintexts: np.ndarray) -> np.ndarray:
    """(1 + m*n) * h_s^a mod n^2 for signed integers m."""
    n, n2 = randomness.n, randomness.nsquare
    if plaintexts.size == 0:
        return np.empty(0, dtype=object)
    g_m = object_array([mpz(int(m) % n) * n + 1 for m in plaintexts])
    return g_m * randomness.factors(plaintexts.size) % n2


def _encrypt_chunk(n: int, hs: int, exponent_bits: int, plaintexts: np.ndarray) -> np.ndarray:
    return _encrypt_with(_worker_randomness(n, hs, exponent_bits), plaintexts)


def _factors_chunk(n: int, hs: int, exponent_bits: int, count: int) -> np.ndarray:
    return _worker_randomness(n, hs, exponent_bits).factors(count)


def _crt_constants(key: PrivateKey) -> tuple[mpz, ...]:
    return (key.p, key.q, key.psquare, key.qsquare, key.hp, key.hq, key.q_inverse_mod_p)


def _decrypt_chunk(consts: tuple[mpz, ...], cts: np.ndarray) -> list[mpz]:
    """m mod p and m mod q from c^(p-1) mod p^2 and c^(q-1) mod q^2, joined by CRT."""
    p, q, p2, q2, hp, hq, q_inv = consts
    xp = gmpy2.powmod_base_list([c % p2 for c in cts], p - 1, p2)
    xq = gmpy2.powmod_base_list([c % q2 for c in cts], q - 1, q2)
    out = []
    for a, b in zip(xp, xq, strict=True):
        mp = (a - 1) // p * hp % p
        mq = (b - 1) // q * hq % q
        out.append(mq + (mp - mq) * q_inv % p * q)
    return out


def _powmod_scalar_chunk(bases: np.ndarray, exp: int, modulus: mpz) -> np.ndarray:
    return powmod_scalar(bases, exp, modulus)


def _powmod_elementwise_chunk(bases: np.ndarray, exps: np.ndarray, modulus: mpz) -> np.ndarray:
    return powmod_elementwise(bases, exps, modulus)


def _chunked(fn: Any, data: np.ndarray, extra: tuple[Any, ...], workers: int) -> np.ndarray:
    flat = np.ascontiguousarray(data).reshape(-1)
    if flat.size == 0:
        return np.empty(data.shape, dtype=object)
    ranges = split_ranges(flat.size, workers * 2 if workers > 1 else 1)
    parts = run_chunks(fn, [(flat[a:b], *extra) for a, b in ranges], workers)
    return np.concatenate(parts).reshape(data.shape)


def _chunked_pairs(fn: Any, data: np.ndarray, exps: np.ndarray, modulus: mpz, workers: int) -> np.ndarray:
    flat = np.ascontiguousarray(data).reshape(-1)
    flat_e = np.ascontiguousarray(exps).reshape(-1)
    if flat.size == 0:
        return np.empty(data.shape, dtype=object)
    ranges = split_ranges(flat.size, workers * 2 if workers > 1 else 1)
    parts = run_chunks(fn, [(flat[a:b], flat_e[a:b], modulus) for a, b in ranges], workers)
    return np.concatenate(parts).reshape(data.shape)


def _plain_frac_bits(values: Any, frac_bits: int | None) -> int:
    if frac_bits is not None:
        return frac_bits
    return 0 if np.asarray(values).dtype.kind in "iubO" else DEFAULT_MUL_FRAC_BITS


def _max_col_abs_sum(exps: np.ndarray) -> int:
    """max_j sum_k |exps[k, j]| — the growth factor of a product with that matrix."""
    if exps.size == 0:
        return 0
    return max(sum(abs(int(v)) for v in col) for col in exps.T)


def _per_ciphertext(ints: np.ndarray, slots: int) -> np.ndarray:
    """One multiplier per packed ciphertext; refuses multipliers that differ inside a ciphertext."""
    length = ints.shape[-1]
    groups = encoding.packed_count(length, slots)
    pad = groups * slots - length
    if pad:
        ints = np.pad(ints, [(0, 0)] * (ints.ndim - 1) + [(0, pad)], mode="edge")
    grouped = ints.reshape(ints.shape[:-1] + (groups, slots))
    first = grouped[..., :1]
    if not np.all(grouped == first):
        raise ValueError(
            "a packed ciphertext can only be multiplied by one plaintext for all its slots; "
            "use an unpacked array for per-element multipliers"
        )
    return np.ascontiguousarray(grouped[..., 0])
