"""Vectorised modular arithmetic kernels on object arrays of gmpy2 integers.

`multi_exp` computes out[m, j] = prod_k bases[m, k]^exps[k, j] mod N with Straus' interleaved
windows: one shared chain of squarings per output, one table look-up and multiplication per base
per w-bit window, and per-base tables reused by every output column. Each window gathers all
look-ups at once and multiplies them as a pairwise tree, so Python overhead is paid per numpy
step (a few per window), not per big-integer operation.

Negative exponents use tables of the inverse base (one modular inversion per base). Exponentiating
by n - |k| instead costs a full |n|-bit exponentiation (about 8 ms at 2048 bits here, against 30 us
for an inversion), so inverses are always used.
"""

from __future__ import annotations

import gmpy2
import numpy as np
from gmpy2 import mpz

from vflnet.crypto.parallel import run_chunks, split_ranges
from vflnet.crypto.randomness import object_array

_TABLE_ENTRY_CAP = 1 << 21  # big integers held in window tables at once, per process
_GATHER_CAP = 1 << 18  # table entries gathered per window step (object references)


def powmod_elementwise(bases: np.ndarray, exps: np.ndarray, modulus: mpz) -> np.ndarray:
    """bases^exps mod modulus elementwise (same shapes); negative exponents invert first."""
    flat = [gmpy2.powmod(b, e, modulus) for b, e in zip(bases.reshape(-1), exps.reshape(-1), strict=True)]
    return object_array(flat, bases.shape)


def powmod_scalar(bases: np.ndarray, exp: int, modulus: mpz) -> np.ndarray:
    """bases^exp mod modulus for one shared (possibly negative) exponent."""
    if bases.size == 0:
        return bases.copy()
    return object_array(gmpy2.powmod_base_list(list(bases.reshape(-1)), exp, modulus), bases.shape)


def prod_axis0(arr: np.ndarray, modulus: mpz) -> np.ndarray:
    """Product over axis 0 modulo `modulus`, as a pairwise tree of vectorised multiplications."""
    if arr.shape[0] == 0:
        out = np.empty(arr.shape[1:], dtype=object)
        out.reshape(-1)[:] = [mpz(1)] * out.size
        return out
    while arr.shape[0] > 1:
        half = arr.shape[0] // 2
        merged = arr[0 : 2 * half : 2] * arr[1 : 2 * half : 2] % modulus
        arr = np.concatenate([merged, arr[2 * half :]]) if arr.shape[0] % 2 else merged
    return arr[0]


def _window_bits(rows: int, cols: int, terms: int, exp_bits: int, signed: bool) -> int:
    """Window width minimising table cost plus look-up multiplications."""
    best, best_cost = 1, None
    for w in range(1, 9):
        if rows * terms * (1 << w) * (2 if signed else 1) > _TABLE_ENTRY_CAP and w > 1:
            break
        table = rows * terms * ((1 << w) - 2) * (2 if signed else 1)
        lookups = rows * cols * terms * (-(-exp_bits // w))
        cost = table + lookups
        if best_cost is None or cost < best_cost:
            best, best_cost = w, cost
    return best


def _tables(bases: np.ndarray, w: int, modulus: mpz) -> np.ndarray:
    """table[m, k, d] = bases[m, k]^d for d < 2^w."""
    table = np.empty(bases.shape + (1 << w,), dtype=object)
    table[..., 0] = mpz(1)
    table[..., 1] = bases
    for d in range(2, 1 << w):
        table[..., d] = table[..., d - 1] * bases % modulus
    return table


def _multi_exp_block(bases: np.ndarray, exps: np.ndarray, modulus: mpz) -> np.ndarray:
    """multi_exp for one block of rows, in this process."""
    rows, terms = bases.shape
    cols = exps.shape[1]
    negative = np.array([[e < 0 for e in row] for row in exps], dtype=bool).reshape(terms, cols)
    magnitudes = np.abs(exps)
    exp_bits = max((int(e).bit_length() for e in magnitudes.reshape(-1)), default=0)
    if exp_bits == 0 or rows == 0 or cols == 0:
        out = np.empty((rows, cols), dtype=object)
        out.reshape(-1)[:] = [mpz(1)] * out.size
        return out
    signed = bool(negative.any())
    w = _window_bits(rows, cols, terms, exp_bits, signed)
    table = _tables(bases, w, modulus)
    inv_table = None
    if signed:
        inverses = object_array([gmpy2.invert(b, modulus) for b in bases.reshape(-1)], bases.shape)
        inv_table = _tables(inverses, w, modulus)
    mags = magnitudes.astype(np.int64) if exp_bits <= 62 else magnitudes
    step = max(1, _GATHER_CAP // max(1, rows * terms))
    blocks = [
        _straus_columns(
            table, inv_table, mags[:, a : a + step], negative[:, a : a + step], exp_bits, w, modulus
        )
        for a in range(0, cols, step)
    ]
    return np.concatenate(blocks, axis=1)


def _straus_columns(
    table: np.ndarray,
    inv_table: np.ndarray | None,
    mags: np.ndarray,
    negative: np.ndarray,
    exp_bits: int,
    w: int,
    modulus: mpz,
) -> np.ndarray:
    """Interleaved windows for a block of output columns: per window, w shared squarings, then
    one gathered table entry per (row, term, column) multiplied together as a pairwise tree."""
    terms = mags.shape[0]
    term_index = np.arange(terms)[:, None]
    mask = (1 << w) - 1
    acc = None
    for t in range(-(-exp_bits // w) - 1, -1, -1):
        shifted = (mags >> (t * w)) & mask
        digits = shifted if shifted.dtype != object else shifted.astype(np.int64)
        picked = table[:, term_index, digits]  # (rows, terms, cols)
        if inv_table is not None:
            picked = np.where(negative[None, :, :], inv_table[:, term_index, digits], picked)
        window = prod_axis0(np.moveaxis(picked, 1, 0), modulus)
        acc = window if acc is None else powmod_scalar(acc, 1 << w, modulus) * window % modulus
    return acc


def multi_exp(bases: np.ndarray, exps: np.ndarray, modulus: mpz, workers: int = 1) -> np.ndarray:
    """out[m, j] = prod_k bases[m, k]^exps[k, j] mod modulus (bases: (M, K) mpz, exps: (K, J) ints)."""
    if bases.ndim != 2 or exps.ndim != 2 or bases.shape[1] != exps.shape[0]:
        raise ValueError(f"multi_exp shapes do not match: {bases.shape} and {exps.shape}")
    rows, terms = bases.shape
    per_row = max(1, terms * (1 << 8) * 2)
    block = max(1, _TABLE_ENTRY_CAP // per_row)
    parts = max(workers * 2 if workers > 1 else 1, -(-rows // block))
    ranges = split_ranges(rows, parts) if rows else []
    chunks = [(bases[a:b], exps, modulus) for a, b in ranges]
    results = run_chunks(_multi_exp_block, chunks, workers)
    if not results:
        return np.empty((0, exps.shape[1]), dtype=object)
    return np.concatenate(results, axis=0)
