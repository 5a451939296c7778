"""Vectorised modular arithmetic kernels on object arrays of gmpy2 integers.

`multi_exp` computes out[m, j] = prod_k bases[m, k]^exps[k, j] mod N with Straus' interleaved
windows: one shared chain of squarings per output, one table look-up and multiplication per base
per w-bit window, and per-base tables reused by every output column. Each window gathers all
look-ups at once and multiplies them as a pairwise tree, so Python overhead is paid per numpy
step (a few per window), not per big-integer operation.

Negative exponents are shifted by c = max|e| into [0, 2c] and the surplus is removed per row with
one inversion of the product of the row's bases (see `_multi_exp_block`): no inverse tables.
Exponentiating by n - |k| instead would cost a full |n|-bit exponentiation per term (about 8 ms
at 2048 bits here, against 30 us for an inversion). Tables stop at the largest exponent, so small
integer multipliers (pixel values, 0/1 masks) cost one look-up per term and a short table.
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


def _window_bits(bases: int, lookups: int, exp_bits: int, top: int) -> int:
    """Window width minimising table cost plus look-up multiplications, for `bases` tables and
    `lookups` (output, term) pairs per window (`top`: largest exponent)."""
    best, best_cost = 1, None
    for w in range(1, 9):
        entries = min(1 << w, top + 1)  # a table never needs powers above the largest exponent
        if bases * entries > _TABLE_ENTRY_CAP and w > 1:
            break
        cost = bases * max(0, entries - 2) + lookups * (-(-exp_bits // w))
        if best_cost is None or cost < best_cost:
            best, best_cost = w, cost
    return best


def _tables(bases: np.ndarray, entries: int, modulus: mpz) -> np.ndarray:
    """table[m, k, d] = bases[m, k]^d for d < entries."""
    table = np.empty(bases.shape + (entries,), dtype=object)
    table[..., 0] = mpz(1)
    table[..., 1] = bases
    for d in range(2, entries):
        table[..., d] = table[..., d - 1] * bases % modulus
    return table


def _multi_exp_block(
    bases: np.ndarray, exps: np.ndarray, modulus: mpz, where: np.ndarray | None
) -> np.ndarray:
    """multi_exp for one block of rows, in this process.

    Negative exponents: with c = max|e|, prod_k b_k^e_k = prod_k b_k^(e_k + c) * (prod_k b_k)^-c, so
    the Straus part sees only exponents in [0, 2c] and each row pays one product, one inversion
    and one power by c for all its output columns.
    """
    rows, terms = bases.shape
    cols = exps.shape[1]
    out = np.empty((rows, cols), dtype=object)
    out.reshape(-1)[:] = [mpz(1)] * out.size
    out_rows, out_cols = np.nonzero(np.ones((rows, cols), dtype=bool) if where is None else where)
    top = max((abs(int(e)) for e in exps.reshape(-1)), default=0)
    if top == 0 or out_rows.size == 0 or terms == 0:
        return out
    offset = top if any(e < 0 for e in exps.reshape(-1)) else 0
    mags = exps + offset if offset else exps
    top += offset
    exp_bits = top.bit_length()
    # bases equal to 1 (exact zeros, e.g. units a ReLU switched off) add nothing: each row keeps its
    # other bases first and the term axis stops at the longest such list
    trivial = np.array([[b == 1 for b in row] for row in bases], dtype=bool).reshape(rows, terms)
    kept = int((~trivial).sum(axis=1).max())
    term_of = np.argsort(trivial, axis=1, kind="stable")[:, :kept]  # (rows, kept) original term index
    bases = np.take_along_axis(bases, term_of, axis=1)
    terms = kept
    if terms == 0:
        return out
    w = _window_bits(rows * terms, out_rows.size * terms, exp_bits, top)
    h = _subset_bits(rows, terms, out_rows.size, exp_bits) if exp_bits <= 62 else 0
    if h and _subset_cost(rows, terms, out_rows.size, exp_bits, h) < _straus_cost(
        rows, terms, out_rows.size, exp_bits, top, w
    ):
        table, evaluate = _subset_tables(bases, h, modulus), _bit_sliced
    else:
        table, evaluate = _tables(bases, min(1 << w, top + 1), modulus), _straus
    mags = mags.astype(np.int64) if exp_bits <= 62 else mags
    step = max(1, _GATHER_CAP // terms)
    for a in range(0, out_rows.size, step):
        m, j = out_rows[a : a + step], out_cols[a : a + step]
        out[m, j] = evaluate(table, mags[term_of[m].T, j[None, :]], m, exp_bits, w, modulus)
    if offset:
        totals = prod_axis0(bases.T, modulus)  # prod_k b[m, k]
        corrections = powmod_scalar(
            object_array([gmpy2.invert(t, modulus) for t in totals], (rows,)), offset, modulus
        )
        out[out_rows, out_cols] = out[out_rows, out_cols] * corrections[out_rows] % modulus
    return out


def _straus(
    table: np.ndarray, mags: np.ndarray, out_rows: np.ndarray, exp_bits: int, w: int, modulus: mpz
) -> np.ndarray:
    """Interleaved windows for a list of outputs (row out_rows[p], exponent column mags[:, p]): per
    window, w squarings, then one gathered table entry per (output, term) multiplied together as a
    pairwise tree."""
    terms = mags.shape[0]
    term_index = np.arange(terms)[:, None]
    mask = (1 << w) - 1
    acc = None
    for t in range(-(-exp_bits // w) - 1, -1, -1):
        shifted = (mags >> (t * w)) & mask
        digits = shifted if shifted.dtype != object else shifted.astype(np.int64)
        window = prod_axis0(
            table[out_rows[None, :], term_index, digits], modulus
        )  # gathered (terms, outputs)
        acc = window if acc is None else powmod_scalar(acc, 1 << w, modulus) * window % modulus
    return acc


# Relative costs of the big-integer steps: a table entry or look-up is one multiplication modulo N
# (numpy, with a full division); the squarings inside gmpy2's powmod are cheaper (Montgomery) but each
# call adds about two multiplications of conversion.
_POWMOD_SQUARE, _POWMOD_CALL = 0.6, 2.0


def _straus_cost(rows: int, terms: int, outputs: int, exp_bits: int, top: int, w: int) -> float:
    windows = -(-exp_bits // w)
    table = rows * terms * max(0, min(1 << w, top + 1) - 2)
    return table + outputs * (terms * windows + exp_bits * _POWMOD_SQUARE + windows * _POWMOD_CALL)


def _subset_cost(rows: int, terms: int, outputs: int, exp_bits: int, h: int) -> float:
    groups = -(-terms // h)
    return rows * groups * (1 << h) + outputs * exp_bits * (groups + 1)


def _subset_bits(rows: int, terms: int, outputs: int, exp_bits: int) -> int:
    """Group size of the bit-sliced method with the lowest cost (0: none fits the table cap)."""
    sizes = [h for h in range(2, 9) if rows * -(-terms // h) * (1 << h) <= _TABLE_ENTRY_CAP]
    return min(sizes, key=lambda h: _subset_cost(rows, terms, outputs, exp_bits, h), default=0)


def _subset_tables(bases: np.ndarray, h: int, modulus: mpz) -> np.ndarray:
    """table[m, G, s] = prod of bases[m, G*h + i] over the bits i set in s (terms in groups of h)."""
    rows, terms = bases.shape
    groups = -(-terms // h)
    ones = np.empty((rows, groups * h - terms), dtype=object)
    ones.reshape(-1)[:] = [mpz(1)] * ones.size
    grouped = np.concatenate([bases, ones], axis=1).reshape(rows, groups, h)
    table = np.empty((rows, groups, 1 << h), dtype=object)
    table[..., 0] = mpz(1)
    for i in range(h):
        table[..., 1 << i : 2 << i] = table[..., : 1 << i] * grouped[..., i : i + 1] % modulus
    return table


def _bit_sliced(
    table: np.ndarray, mags: np.ndarray, out_rows: np.ndarray, exp_bits: int, w: int, modulus: mpz
) -> np.ndarray:
    """Few terms per output (e.g. [[g]] @ W, 10 logits): one bit of every exponent at a time, the
    terms' bits of a group picking one subset product, one squaring per bit (`w` is unused)."""
    groups, h = table.shape[1], table.shape[2].bit_length() - 1
    terms, outputs = mags.shape
    padded = np.concatenate([mags, np.zeros((groups * h - terms, outputs), dtype=np.int64)]).reshape(
        groups, h, outputs
    )
    weights = (1 << np.arange(h, dtype=np.int64))[None, :, None]
    group_index = np.arange(groups)[:, None]
    acc = None
    for t in range(exp_bits - 1, -1, -1):
        index = (((padded >> t) & 1) * weights).sum(axis=1)  # (groups, outputs)
        window = prod_axis0(table[out_rows[None, :], group_index, index], modulus)
        acc = window if acc is None else acc * acc % modulus * window % modulus
    return acc


def multi_exp(
    bases: np.ndarray, exps: np.ndarray, modulus: mpz, workers: int = 1, where: np.ndarray | None = None
) -> np.ndarray:
    """out[m, j] = prod_k bases[m, k]^exps[k, j] mod modulus (bases: (M, K) mpz, exps: (K, J) ints).

    With a boolean `where` of shape (M, J), only those outputs are computed; the others are 1.
    """
    if bases.ndim != 2 or exps.ndim != 2 or bases.shape[1] != exps.shape[0]:
        raise ValueError(f"multi_exp shapes do not match: {bases.shape} and {exps.shape}")
    rows, terms = bases.shape
    if where is not None and where.shape != (rows, exps.shape[1]):
        raise ValueError(f"where has shape {where.shape}, the output {(rows, exps.shape[1])}")
    per_row = max(1, terms * (1 << 8))
    block = max(1, _TABLE_ENTRY_CAP // per_row)
    parts = max(workers * 2 if workers > 1 else 1, -(-rows // block))
    ranges = split_ranges(rows, parts) if rows else []
    chunks = [(bases[a:b], exps, modulus, None if where is None else where[a:b]) for a, b in ranges]
    results = run_chunks(_multi_exp_block, chunks, workers)
    if not results:
        return np.empty((0, exps.shape[1]), dtype=object)
    return np.concatenate(results, axis=0)
