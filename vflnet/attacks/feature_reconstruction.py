"""Paper 000's binary feature reconstruction (Ye et al., Sec. IV and VII) on a stack of first-layer
outputs Z_A (n x k) of one fixed W_A: pure numpy, no wire.

- `attack_basis`: an orthonormal basis A (n x d) of col(Z_A), with the Section VII bias trick
  (subtract one row from every row) when asked.
- Algorithm 1, every binary vector in col(A) (not just the first): `search_brute` is the paper's
  enumeration of x' in {0,1}^d (vectorised in chunks, O(n d 2^d)); `search_mitm` is an exact
  meet-in-the-middle search that returns the same hits in O(2^(d/2)) per check row: split x' into
  two halves, x_i = H_i[hi] + L_i[lo] for every row i, and join the halves on one row through a
  sorted array (only pairs whose sum lies within tol of 0 or 1 survive), then filter on further rows
  and verify the survivors on every row exactly as the brute force does.
- `canonical_hits` (drop all-zeros/all-ones, one vector per complement pair), `onehot_groups` (the
  2^m - 1 subset sums of a one-hot group reassembled into its m atoms).
- Algorithm 2, leverage-score sampled regression (`leverage_regression`), with the paper's rule
  (smallest residual) and the normalised one (residual per one, 1%..99% ones), both tracked.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg


def bits(count: int, width: int, start: int = 0) -> np.ndarray:
    """Rows start..start+count-1 of the binary expansion: bits(...)[c, j] = bit j of (start + c)."""
    codes = np.arange(start, start + count, dtype=np.int64)
    return ((codes[:, None] >> np.arange(width, dtype=np.int64)) & 1).astype(np.float64)


def attack_basis(
    z: np.ndarray, rank: int | None = None, rank_tol: float = 1e-5, bias_trick: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """(A, singular values): A is n x d with orthonormal columns spanning col(Z_A) (the top-d left
    singular vectors, which also denoise). d = ``rank`` if given, else #{s_i > rank_tol * s_1}.
    ``bias_trick``: subtract row 0 from every row first (paper Sec. VII), which removes a passive bias
    or an affine {a, b} encoding; every binary vector found then has x_0 = 0 (features up to complement)."""
    z = np.asarray(z, dtype=np.float64)
    if bias_trick:
        z = z - z[0]
    u, s, _ = np.linalg.svd(z, full_matrices=False)
    if rank is None:
        rank = int((s > rank_tol * s[0]).sum()) if s[0] > 0 else 0
    return u[:, :rank], s


def solve_matrix(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(M, pivot rows): M = A A'^-1 (n x d) for the d rows A' picked by a pivoted QR of A^T (well
    conditioned), so every vector of col(A) is M x' with x' its values on the pivot rows."""
    d = a.shape[1]
    _, _, piv = scipy.linalg.qr(a.T, pivoting=True, mode="economic")
    rows = np.sort(piv[:d])
    m = np.linalg.solve(a[rows].T, a.T).T
    return m, rows


def _binary_rows(x: np.ndarray, tol: float) -> np.ndarray:
    """Which rows of x (candidates x positions) are binary within tol at every position."""
    return (np.minimum(np.abs(x), np.abs(x - 1.0)) <= tol).all(axis=1)


def search_brute(m: np.ndarray, tol: float = 1e-3, chunk_cells: int = 1 << 22) -> np.ndarray:
    """Algorithm 1 as the paper writes it, every hit: all codes c in 1..2^d-1 (bit j = x'_j) with
    M x' binary. Vectorised over chunks of candidates; returns the sorted hit codes."""
    n, d = m.shape
    chunk = max(1, chunk_cells // max(n, 1))
    hits = []
    for start in range(1, 1 << d, chunk):
        count = min(chunk, (1 << d) - start)
        b = bits(count, d, start)
        ok = _binary_rows(b @ m.T, tol)
        hits.append(np.nonzero(ok)[0].astype(np.int64) + start)
    return np.concatenate(hits) if hits else np.zeros(0, np.int64)


def search_mitm(
    m: np.ndarray,
    pivots: np.ndarray,
    tol: float = 1e-3,
    check_rows: int = 32,
    pair_chunk: int = 1 << 20,
) -> np.ndarray:
    """Algorithm 1, exact, by meet in the middle: the same hit codes as `search_brute` (see module doc)."""
    n, d = m.shape
    others = np.setdiff1d(np.arange(n), pivots)
    if d < 4 or len(others) == 0:
        return search_brute(m, tol)
    lo_w = d // 2
    hi_w = d - lo_w
    b_lo, b_hi = bits(1 << lo_w, lo_w), bits(1 << hi_w, hi_w)
    join_tol = tol * 1.01 + 1e-12  # a superset of the brute force's test: the final check decides
    # candidate rows for the join and the filter: spread over the non-pivot rows
    pick = others[np.linspace(0, len(others) - 1, min(len(others), check_rows)).astype(np.int64)]
    lo_vals = b_lo @ m[pick, :lo_w].T  # (2^lo, c)
    hi_vals = b_hi @ m[pick, lo_w:].T  # (2^hi, c)

    def ranges(col: int) -> tuple[list[np.ndarray], np.ndarray]:
        order = np.argsort(lo_vals[:, col], kind="stable")
        sorted_lo = lo_vals[order, col]
        spans = []
        for target in (0.0, 1.0):
            need = target - hi_vals[:, col]
            spans.append(
                (
                    np.searchsorted(sorted_lo, need - join_tol, "left"),
                    np.searchsorted(sorted_lo, need + join_tol, "right"),
                )
            )
        return spans, order  # type: ignore[return-value]

    # join on the row that lets the fewest pairs through
    best_col, best = 0, None
    for col in range(lo_vals.shape[1]):
        spans, order = ranges(col)
        total = int(sum((b - a).sum() for a, b in spans))
        if best is None or total < best[0]:
            best_col, best = col, (total, spans, order)
    assert best is not None
    _, spans, order = best
    rest = [c for c in range(lo_vals.shape[1]) if c != best_col]
    found = []
    for a_idx, b_idx in spans:
        counts = b_idx - a_idx
        h_all = np.nonzero(counts)[0]
        # pairs (h, l) in chunks of about pair_chunk
        cum = np.cumsum(counts[h_all])
        start = 0
        while start < len(h_all):
            stop = int(np.searchsorted(cum, (cum[start - 1] if start else 0) + pair_chunk, "right"))
            stop = max(stop, start + 1)
            hs = h_all[start:stop]
            reps = counts[hs]
            h_pairs = np.repeat(hs, reps)
            offsets = np.arange(reps.sum()) - np.repeat(np.cumsum(reps) - reps, reps)
            l_pairs = order[np.repeat(a_idx[hs], reps) + offsets]
            if rest:
                vals = hi_vals[h_pairs][:, rest] + lo_vals[l_pairs][:, rest]
                keep = _binary_rows(vals, join_tol)
                h_pairs, l_pairs = h_pairs[keep], l_pairs[keep]
            codes = l_pairs.astype(np.int64) | (h_pairs.astype(np.int64) << lo_w)
            codes = codes[codes != 0]
            if len(codes):
                ok = _binary_rows(bits_of(codes, d) @ m.T, tol)
                found.append(codes[ok])
            start = stop
    return np.unique(np.concatenate(found)) if found else np.zeros(0, np.int64)


def bits_of(codes: np.ndarray, width: int) -> np.ndarray:
    """The binary expansion (float64, bit j in column j) of given codes."""
    return ((codes[:, None] >> np.arange(width, dtype=np.int64)) & 1).astype(np.float64)


def hit_vectors(m: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """The binary vectors x = M x' of hit codes, rounded to {0, 1} (uint8, hits x n)."""
    if len(codes) == 0:
        return np.zeros((0, m.shape[0]), np.uint8)
    return np.rint(bits_of(codes, m.shape[1]) @ m.T).astype(np.uint8)


def canonical_hits(x: np.ndarray) -> np.ndarray:
    """Drop all-zeros and all-ones vectors and keep one vector per complement pair (the one with
    x_0 = 0), in first-seen order: a feature recovered up to complement counts once."""
    out, seen = [], set()
    for v in x:
        if v.all() or not v.any():
            continue
        c = v if v[0] == 0 else 1 - v
        key = c.tobytes()
        if key not in seen:
            seen.add(key)
            out.append(c)
    return np.array(out, dtype=np.uint8).reshape(-1, x.shape[1])


def onehot_groups(x: np.ndarray) -> list[list[int]]:
    """Reassemble one-hot groups from raw hits (before `canonical_hits`): the atoms (hits containing no
    other nonzero hit) grouped by "disjoint, and their sum is a hit too"; each group of >= 2 atoms is
    one categorical feature (a complete group's sum is the all-ones vector). Indices into x."""
    keep = [i for i in range(len(x)) if x[i].any()]
    if not keep:
        return []
    v = x[keep].astype(np.float32)
    inside = v @ (1.0 - v).T  # inside[i, j] == 0: hit i lies within hit j
    sizes = v.sum(axis=1)
    atoms = [
        keep[i]
        for i in range(len(keep))
        if not any(inside[j, i] == 0 and sizes[j] < sizes[i] for j in range(len(keep)))
    ]
    known = {x[i].tobytes() for i in range(len(x))}
    parent = {a: a for a in atoms}

    def root(a: int) -> int:
        while parent[a] != a:
            a = parent[a]
        return a

    for i, a in enumerate(atoms):
        for b in atoms[i + 1 :]:
            if not (x[a] & x[b]).any() and (x[a] | x[b]).tobytes() in known:
                parent[root(b)] = root(a)
    groups: dict[int, list[int]] = {}
    for a in atoms:
        groups.setdefault(root(a), []).append(a)
    # two atoms that cover every row are one binary feature and its complement, not a group
    return [g for g in groups.values() if len(g) >= 3 or (len(g) == 2 and not (x[g[0]] | x[g[1]]).all())]


def categorical(x: np.ndarray, group: list[int]) -> np.ndarray:
    """The reassembled categorical feature of a one-hot group: per row the index of its atom with a 1,
    -1 where none (an incomplete group)."""
    out = np.full(x.shape[1], -1, np.int64)
    for k, i in enumerate(group):
        out[x[i] == 1] = k
    return out


# ------------------------------------------------------------------------------ Algorithm 2
@dataclass
class RegressionResult:
    paper: np.ndarray  # x* under the paper's rule: smallest residual min_w ||Aw - x||^2
    normalized: np.ndarray  # x* under residual / #ones, among candidates with 1%..99% ones
    paper_residual: float
    normalized_score: float


def leverage_regression(
    a: np.ndarray,
    r: int,
    repeats: int,
    rng: np.random.Generator,
    chunk_cells: int = 1 << 22,
) -> RegressionResult:
    """Algorithm 2 on an orthonormal basis A (n x d): ``repeats`` times, sample r rows by leverage score
    (without replacement), rescale by D = 1/sqrt(r p), and for every x' in {0,1}^r \\ {0} build x
    (x' on the sampled rows, A w' thresholded at 0.5 elsewhere); keep the best x under both rules.
    e = [1, 0, ..., 0] is in T as the paper's step 2 puts it."""
    n, d = a.shape
    r = min(r, n)
    lev = (a**2).sum(axis=1)
    p = lev / lev.sum()
    lo_ones, hi_ones = 0.01 * n, 0.99 * n
    e = np.zeros(n)
    e[0] = 1.0
    best_paper = (float(e @ e - np.sum((a.T @ e) ** 2)), e)
    best_norm: tuple[float, np.ndarray] = (np.inf, np.zeros(n))
    chunk = max(1, chunk_cells // n)
    for _ in range(repeats):
        rows = rng.choice(n, size=r, replace=False, p=p)
        scale = 1.0 / np.sqrt(r * p[rows])
        sub = scale[:, None] * a[rows]
        m2 = a @ (np.linalg.pinv(sub) * scale[None, :])  # A w' = M2 x'
        outside = np.ones(n, bool)
        outside[rows] = False
        for start in range(1, 1 << r, chunk):
            b = bits(min(chunk, (1 << r) - start), r, start)
            x = (b @ m2.T >= 0.5).astype(np.float64)
            x[:, rows] = b
            ones = x.sum(axis=1)
            resid = ones - ((x @ a) ** 2).sum(axis=1)  # ||x||^2 - ||A^T x||^2 (x binary)
            i = int(np.argmin(resid))
            if resid[i] < best_paper[0]:
                best_paper = (float(resid[i]), x[i].copy())
            norm = np.where((ones >= lo_ones) & (ones <= hi_ones), resid / np.maximum(ones, 1), np.inf)
            j = int(np.argmin(norm))
            if norm[j] < best_norm[0]:
                best_norm = (float(norm[j]), x[j].copy())
    return RegressionResult(
        best_paper[1].astype(np.uint8), best_norm[1].astype(np.uint8), best_paper[0], best_norm[0]
    )
