"""SecureBoost's tree algorithm (Cheng et al., 2019), in the pieces its parties run.

The label holder (the active party) computes per-sample gradient statistics gh = (g_1..g_c, h_1..h_c)
of the softmax loss, as fixed-point integers (``FRAC_BITS``), so that every sum is exact: Paillier sums
of encrypted gh decrypt to exactly the integers the plaintext sums give, and the HE and plaintext
modes grow the same trees. Every party (the label holder too, over its own features) holds candidate
thresholds per feature (quantiles of its training rows) and answers, for the open nodes of a level,
the cumulative histogram: per node, feature and candidate t, the sum of gh over the node's rows with
x <= t. The label holder adds the left and right scores (sum_k G_k^2 / (H_k + lambda)), picks the best
candidate over all parties and asks its owner to split: the owner keeps (feature, threshold) under a
split id and returns which of the node's rows go left. The label holder's tree knows each split as
(party, split id) only.

``grow_tree`` is the label holder's loop over the levels; the `secureboost` protocol
(vflnet/protocols/secureboost.py) runs it with parties reached over the wire, ``train_local`` runs it
with every party in this process (the one-process run of the same algorithm).

With the initial scores (all zero), h_k = (1/c)(1 - 1/c) is the same for every row, and the gain is
the Gini decrease of the split: a single tree here is a CART classification tree on bucketed features.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from gmpy2 import mpz

from vflnet.crypto import CipherArray, encoding, opcount
from vflnet.crypto.multiexp import powmod_scalar, prod_axis0
from vflnet.crypto.parallel import run_chunks, split_ranges

FRAC_BITS = 20  # fixed point of g and h: |g| <= 1, 0 <= h <= 1/4


@dataclass(frozen=True)
class TreeParams:
    max_depth: int = 5
    n_bins: int = 32  # candidate thresholds per feature: at most n_bins - 1
    reg_lambda: float = 0.0
    min_child_weight: float = 1e-3  # least sum of h on each side of a split
    learning_rate: float = 0.3  # boosting only
    ensemble: str = (
        "forest"  # "forest": votes of trees on the initial gradients; "boost": softmax of summed leaves
    )


# ----------------------------------------------------------------------- a party's features
def candidate_thresholds(x: np.ndarray, n_bins: int) -> list[np.ndarray]:
    """Per feature, its distinct training values if there are at most ``n_bins`` (the candidates of an
    exact tree), else distinct quantiles; always below the largest value (a threshold there would send
    every row left)."""
    qs = np.linspace(0, 1, n_bins + 1)[1:-1]
    out = []
    for col in np.asarray(x, np.float64).T:
        distinct = np.unique(col)
        t = distinct if len(distinct) <= n_bins else np.unique(np.quantile(col, qs, method="lower"))
        out.append(t[t < col.max()])
    return out


def bucketize(x: np.ndarray, thresholds: Sequence[np.ndarray]) -> np.ndarray:
    """Bucket b of a value: how many thresholds lie below it, so x <= t_b exactly when bucket <= b."""
    cols = [np.searchsorted(t, col, side="left") for t, col in zip(thresholds, np.asarray(x).T, strict=True)]
    return np.stack(cols, 1).astype(np.int32) if cols else np.zeros((len(x), 0), np.int32)


def grad_hess(y: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """Softmax-loss gradient and hessian per class, as fixed-point int64: columns g_1..g_c, h_1..h_c."""
    z = scores - scores.max(1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(1, keepdims=True)
    g = p.copy()
    g[np.arange(len(y)), y] -= 1.0
    h = p * (1.0 - p)
    return np.round(np.concatenate([g, h], 1) * (1 << FRAC_BITS)).astype(np.int64)


def histograms_plain(
    buckets: np.ndarray,
    n_candidates: Sequence[int],
    node_of: np.ndarray,
    nodes: Sequence[int],
    gh: np.ndarray,
) -> np.ndarray:
    """Cumulative histograms (len(nodes), sum(n_candidates), k) of int64 gh."""
    k = gh.shape[1]
    out = np.zeros((len(nodes), int(sum(n_candidates)), k), np.int64)
    for j, node in enumerate(nodes):
        rows = node_of == node
        col = 0
        for f, m in enumerate(n_candidates):
            sums = np.zeros((m + 1, k), np.int64)
            np.add.at(sums, buckets[rows, f], gh[rows])
            out[j, col : col + m] = np.cumsum(sums, 0)[:m]
            col += m
    return out


def _cipher_hist_chunk(
    nsquare: mpz,
    data: np.ndarray,
    buckets: np.ndarray,
    n_candidates: list[int],
    node_of: np.ndarray,
    nodes: list[int],
) -> np.ndarray:
    """Cumulative ciphertext histograms of some features: (nodes, their candidates, ciphertexts per row)."""
    width = data.shape[1]
    out = np.empty((len(nodes), int(sum(n_candidates)), width), dtype=object)
    for j, node in enumerate(nodes):
        rows = np.flatnonzero(node_of == node)
        col = 0
        for f, m in enumerate(n_candidates):
            b = buckets[rows, f]
            order = np.argsort(b, kind="stable")
            sorted_b, sorted_rows = b[order], rows[order]
            acc = np.full(width, mpz(1), dtype=object)  # Enc(0) without randomness: rerandomised on send
            for t in range(m):
                lo, hi = np.searchsorted(sorted_b, [t, t + 1])
                if hi > lo:
                    acc = acc * prod_axis0(data[sorted_rows[lo:hi]], nsquare) % nsquare
                out[j, col + t] = acc
            col += m
    return out


def histograms_encrypted(
    buckets: np.ndarray,
    n_candidates: Sequence[int],
    node_of: np.ndarray,
    nodes: Sequence[int],
    gh: CipherArray,
    workers: int = 1,
) -> CipherArray:
    """The same histograms as ``histograms_plain`` over encrypted gh (n, k), by ciphertext additions on
    the engine's arrays (packed gh: one addition per row and feature, whatever k); features are split
    over ``workers`` processes. When gh's slots hold several rows' worth of k values (``slots`` >= 2k),
    the candidates are packed ``slots // k`` to a ciphertext (shape (nodes, groups, per_group * k)):
    the label holder decrypts that many times fewer ciphertexts (``unpack_histograms``)."""
    n_candidates = [int(m) for m in n_candidates]
    nodes = [int(n) for n in nodes]
    total = int(sum(n_candidates))
    chunks = []
    for a, b in split_ranges(len(n_candidates), workers) if n_candidates else []:
        chunks.append((gh.public_key.nsquare, gh.data, buckets[:, a:b], n_candidates[a:b], node_of, nodes))
    parts = run_chunks(_cipher_hist_chunk, chunks, workers)
    k = gh.shape[1]
    rows_in = int(np.isin(node_of, nodes).sum())
    # per value, as one EncryptedNumber per value would: every row into its bucket, then cumulative sums
    opcount.count("add", k * (rows_in * len(n_candidates) + len(nodes) * total))
    width = gh.data.shape[1]
    data = np.concatenate(parts, 1) if parts else np.empty((len(nodes), 0, width), dtype=object)
    bound = gh.bound * max(1, len(node_of))
    q = gh.slots // k if gh.slots >= 2 * k else 1
    if q == 1:
        return CipherArray(gh.public_key, data, (len(nodes), total, k), gh.frac_bits, bound, gh.slots)
    groups = -(-total // q)
    padded = np.empty((len(nodes), groups * q), dtype=object)
    padded.reshape(-1)[:] = [mpz(1)] * padded.size  # Enc(0): padding candidates decrypt to zeros
    padded[:, :total] = data[:, :, 0]
    grouped = padded.reshape(len(nodes), groups, q)
    shift = 1 << (encoding.slot_width(gh.public_key.bits, gh.slots) * k)
    n2 = gh.public_key.nsquare
    acc = grouped[..., q - 1].copy()
    for j in range(q - 2, -1, -1):  # Horner, as CipherArray.pack: candidate j in slots [j k, (j + 1) k)
        acc = powmod_scalar(acc, shift, n2) * grouped[..., j] % n2
    return CipherArray(
        gh.public_key, acc[..., None], (len(nodes), groups, q * k), gh.frac_bits, bound, gh.slots
    )


def packed_shape(n_nodes: int, n_candidates: int, k: int, slots: int) -> tuple[int, int, int]:
    """The shape ``histograms_encrypted`` sends for gh of k values in ``slots`` slots."""
    q = slots // k if slots >= 2 * k else 1
    return (n_nodes, -(-n_candidates // q), q * k) if q > 1 else (n_nodes, n_candidates, k)


def unpack_histograms(values: np.ndarray, n_candidates: int, k: int) -> np.ndarray:
    """(nodes, n_candidates, k) from the decrypted (nodes, groups, per_group * k)."""
    n_nodes = values.shape[0]
    return values.reshape(n_nodes, -1, k)[:, :n_candidates]


@dataclass
class LocalParty:
    """One party's side of tree growing and prediction, over its own features: candidate thresholds,
    the current tree's rows and gh, and its split table (split id -> feature, threshold)."""

    x: np.ndarray
    thresholds: list[np.ndarray]
    workers: int = 1
    features: list[int] = field(default_factory=list)  # split table: split id -> feature
    cuts: list[float] = field(default_factory=list)  # split id -> threshold
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    gh: Any = None  # int64 array or CipherArray over `rows`
    node_of: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    nodes: list[int] = field(default_factory=list)

    @classmethod
    def fit(cls, x: np.ndarray, train_rows: np.ndarray, n_bins: int, workers: int = 1) -> LocalParty:
        """Image regions count as flat pixel features."""
        flat = np.asarray(x, np.float64).reshape(len(x), -1)
        return cls(flat, candidate_thresholds(flat[train_rows], n_bins), workers)

    @property
    def n_candidates(self) -> list[int]:
        return [len(t) for t in self.thresholds]

    def start_tree(self, rows: np.ndarray, gh: Any) -> None:
        self.rows, self.gh = rows, gh
        self.buckets = bucketize(self.x[rows], self.thresholds)
        self.node_of, self.nodes = np.zeros(len(rows), np.int64), []

    def histograms(self, node_of: np.ndarray, nodes: Sequence[int]) -> Any:
        """Histograms of ``nodes``; every node with rows in ``node_of`` may be split next."""
        self.node_of, self.nodes = node_of, sorted(set(node_of[node_of >= 0].tolist()))
        if isinstance(self.gh, CipherArray):
            return histograms_encrypted(
                self.buckets, self.n_candidates, node_of, nodes, self.gh, self.workers
            )
        return histograms_plain(self.buckets, self.n_candidates, node_of, nodes, self.gh)

    def locate(self, candidate: int) -> tuple[int, float]:
        """(feature, threshold) of a flat candidate index; IndexError if there is none."""
        if candidate < 0:
            raise IndexError(f"no split candidate {candidate}")
        for f, t in enumerate(self.thresholds):
            if candidate < len(t):
                return f, float(t[candidate])
            candidate -= len(t)
        raise IndexError(f"no split candidate beyond {sum(self.n_candidates) - 1}")

    def split(self, node: int, candidate: int) -> tuple[int, np.ndarray]:
        """Record the split of ``node`` at ``candidate``; (split id, go-left of the node's rows in order)."""
        f, t = self.locate(candidate)
        self.features.append(f)
        self.cuts.append(t)
        members = self.rows[self.node_of == node]
        return len(self.cuts) - 1, self.x[members, f] <= t

    def route(self, rows: np.ndarray, split_ids: np.ndarray) -> np.ndarray:
        """Go-left bits (len(split_ids), len(rows)) of this party's own splits; IndexError for an unknown id."""
        ids = np.asarray(split_ids, np.int64)
        if len(ids) and (ids.min() < 0 or ids.max() >= len(self.cuts)):
            raise IndexError(
                f"unknown split id(s) {sorted(set(ids[(ids < 0) | (ids >= len(self.cuts))].tolist()))}"
            )
        f = np.asarray(self.features, np.int64)[ids]
        t = np.asarray(self.cuts, np.float64)[ids]
        return (self.x[rows][:, f] <= t).T


# ------------------------------------------------------------------------------- the tree
@dataclass
class Tree:
    """A full binary layout (node i has children 2i+1, 2i+2, as in paper 003's Algorithm 1): per node
    its kind (0 absent, 1 internal, 2 leaf), owner party index and split id (internal), and leaf
    values (one per class)."""

    kind: np.ndarray
    owner: np.ndarray
    split_id: np.ndarray
    value: np.ndarray

    @classmethod
    def empty(cls, depth: int, n_classes: int) -> Tree:
        size = (1 << (depth + 1)) - 1
        return cls(np.zeros(size, np.int8), np.full(size, -1), np.full(size, -1), np.zeros((size, n_classes)))

    def to_dict(self) -> dict[str, np.ndarray]:
        return {"kind": self.kind, "owner": self.owner, "split_id": self.split_id, "value": self.value}


class Party(Protocol):
    """What the label holder needs of a party (itself included) while growing a tree."""

    def histograms(self, node_of: np.ndarray, nodes: Sequence[int]) -> np.ndarray: ...

    def split(self, node: int, candidate: int) -> tuple[int, np.ndarray]: ...


def _score(g: np.ndarray, h: np.ndarray, lam: float) -> np.ndarray:
    return (g * g / (h + lam)).sum(-1)


def best_split(hist: np.ndarray, total: np.ndarray, n_classes: int, params: TreeParams) -> tuple[float, int]:
    """(gain, candidate) of one party's best split of one node from its decrypted histogram (C, k)
    and the node's totals (k,), both fixed-point int64; (-inf, -1) if no candidate is allowed."""
    if hist.shape[0] == 0:
        return -np.inf, -1
    scale = float(1 << FRAC_BITS)
    left = hist.astype(np.float64) / scale
    right = (total[None, :] - hist).astype(np.float64) / scale
    tot = total.astype(np.float64) / scale
    c = n_classes
    with np.errstate(divide="ignore", invalid="ignore"):  # empty sides (h = 0, lambda = 0) are masked below
        gain = (
            _score(left[:, :c], left[:, c:], params.reg_lambda)
            + _score(right[:, :c], right[:, c:], params.reg_lambda)
            - _score(tot[None, :c], tot[None, c:], params.reg_lambda)
        )
    ok = (left[:, c:].sum(1) >= params.min_child_weight) & (right[:, c:].sum(1) >= params.min_child_weight)
    gain = np.where(ok, gain, -np.inf)
    best = int(np.argmax(gain))
    return float(gain[best]), best if np.isfinite(gain[best]) else -1


MIN_GAIN = 1e-9


def grow_tree(
    parties: Sequence[Party],
    gh: np.ndarray,
    n_classes: int,
    params: TreeParams,
    gather: Callable[[np.ndarray, list[int]], list[np.ndarray]] | None = None,
) -> tuple[Tree, np.ndarray]:
    """The label holder's loop: level by level, every party's histograms for the open nodes (asked for
    the smaller child of each split only: the sibling's is the parent's minus it, exact on integers),
    the best split over all parties (ties: the earlier party, then the earlier candidate), the owner's split.
    Returns the tree and each row's leaf. ``gather`` collects the parties' decrypted histograms (the
    protocol asks them concurrently); by default it asks them one by one."""
    gather = gather or (lambda node_of, nodes: [p.histograms(node_of, nodes) for p in parties])
    tree = Tree.empty(params.max_depth, n_classes)
    node_of = np.zeros(len(gh), np.int64)
    leaf_of = np.full(len(gh), -1, np.int64)
    open_nodes = [0]
    tree.kind[0] = 1
    known: list[dict[int, np.ndarray]] = [{} for _ in parties]  # party -> node -> its histogram
    for depth in range(params.max_depth + 1):
        if not open_nodes:
            break
        counts = {n: int((node_of == n).sum()) for n in open_nodes}
        totals = {n: gh[node_of == n].sum(0) for n in open_nodes}
        if depth < params.max_depth:
            # histogram subtraction: ask for the smaller child of each split, derive its sibling from the parent
            ask = [n for n in open_nodes if n == 0 or _smaller(n, counts)]
            for p, hist in enumerate(gather(node_of, ask)):
                for j, n in enumerate(ask):
                    known[p][n] = hist[j]
                for n in open_nodes:
                    if n not in known[p]:
                        known[p][n] = known[p][(n - 1) // 2] - known[p][_sibling(n)]
        next_nodes = []
        for node in open_nodes:
            best = (MIN_GAIN, -1, -1)
            for p in range(len(parties)) if depth < params.max_depth else []:
                gain, cand = best_split(known[p][node], totals[node], n_classes, params)
                if cand >= 0 and gain > best[0]:
                    best = (gain, p, cand)
            members = np.flatnonzero(node_of == node)
            if best[1] < 0:
                total = totals[node].astype(np.float64) / (1 << FRAC_BITS)
                tree.kind[node] = 2
                tree.value[node] = -total[:n_classes] / (total[n_classes:] + params.reg_lambda + 1e-12)
                leaf_of[members] = node
                node_of[members] = -1
                continue
            split_id, left = parties[best[1]].split(node, best[2])
            if left.shape != (len(members),):
                raise ValueError(
                    f"party {best[1]} split node {node} into {left.shape} rows, not {len(members)}"
                )
            tree.kind[node], tree.owner[node], tree.split_id[node] = 1, best[1], split_id
            node_of[members] = np.where(left, 2 * node + 1, 2 * node + 2)
            tree.kind[[2 * node + 1, 2 * node + 2]] = 1
            next_nodes += [2 * node + 1, 2 * node + 2]
        open_nodes = next_nodes
    return tree, leaf_of


def _sibling(node: int) -> int:
    return node + 1 if node % 2 else node - 1


def _smaller(node: int, counts: dict[int, int]) -> bool:
    """Whether ``node`` is the child whose histogram is asked for: the one with fewer rows (left on ties)."""
    mine, theirs = counts[node], counts[_sibling(node)]
    return mine < theirs or (mine == theirs and node % 2 == 1)


def traverse(tree: Tree, go_left: Callable[[int, int], np.ndarray], n: int) -> np.ndarray:
    """Each sample's leaf; ``go_left(owner, split_id)`` gives the bits (n,) of one split."""
    node = np.zeros(n, np.int64)
    while True:
        internal = tree.kind[node] == 1
        if not internal.any():
            return node
        for i in np.unique(node[internal]):
            at = node == i
            bits = go_left(int(tree.owner[i]), int(tree.split_id[i]))[at]
            node[at] = np.where(bits, 2 * i + 1, 2 * i + 2)


@dataclass
class Ensemble:
    """The label holder's model: trees whose splits are (party, split id), and how leaves combine."""

    n_classes: int
    params: TreeParams
    trees: list[Tree] = field(default_factory=list)

    def confidence(self, leaves: list[np.ndarray]) -> np.ndarray:
        """Confidence vectors from each tree's leaf per sample: vote shares (forest; one tree: one-hot,
        paper 003's decision tree) or the softmax of the summed leaf values (boost)."""
        n = len(leaves[0]) if leaves else 0
        if self.params.ensemble == "boost":
            scores = np.zeros((n, self.n_classes))
            for tree, leaf in zip(self.trees, leaves, strict=True):
                scores += self.params.learning_rate * tree.value[leaf]
            z = np.exp(scores - scores.max(1, keepdims=True))
            return z / z.sum(1, keepdims=True)
        votes = np.zeros((n, self.n_classes))
        for tree, leaf in zip(self.trees, leaves, strict=True):
            votes[np.arange(n), tree.value[leaf].argmax(1)] += 1
        return votes / max(1, len(self.trees))

    def predict(self, route: Callable[[int, np.ndarray], np.ndarray], n: int) -> np.ndarray:
        """Confidence vectors of n samples; ``route(owner, split_ids)`` gives that party's go-left bits
        (len(split_ids), n), asked once per party for every split it owns in the ensemble."""
        owners = sorted({int(o) for t in self.trees for o in t.owner[t.kind == 1]})
        bits: dict[tuple[int, int], np.ndarray] = {}
        for owner in owners:
            ids = sorted({int(s) for t in self.trees for s in t.split_id[(t.kind == 1) & (t.owner == owner)]})
            for sid, row in zip(ids, route(owner, np.asarray(ids, np.int64)), strict=True):
                bits[owner, sid] = row
        return self.confidence([traverse(t, lambda o, s: bits[o, s], n) for t in self.trees])

    def step_scores(self, tree: Tree, leaf_of: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Boosting: the training rows' scores after adding ``tree`` (rows' leaves from growing it)."""
        return scores + self.params.learning_rate * tree.value[leaf_of]


def tree_gradients(ensemble: Ensemble, y: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """gh for the next tree: from the running scores (boost) or the initial ones (forest)."""
    if ensemble.params.ensemble == "boost":
        return grad_hess(y, scores)
    return grad_hess(y, np.zeros_like(scores))


# ------------------------------------------------------------------- one-process run
def train_local(
    xs: Sequence[np.ndarray],
    y: np.ndarray,
    n_classes: int,
    params: TreeParams,
    steps: Sequence[np.ndarray],
    train_rows: np.ndarray,
) -> tuple[Ensemble, list[LocalParty]]:
    """The same algorithm with every party in this process: party 0 is the label holder; each party's
    thresholds come from ``train_rows``; one tree per entry of ``steps`` (row indices)."""
    parties = [LocalParty.fit(x, train_rows, params.n_bins) for x in xs]
    ensemble = Ensemble(n_classes, params)
    scores = np.zeros((len(y), n_classes))
    for rows in steps:
        gh = tree_gradients(ensemble, y[rows], scores[rows])
        for p in parties:
            p.start_tree(rows, gh)
        tree, leaf_of = grow_tree(parties, gh, n_classes, params)
        ensemble.trees.append(tree)
        scores[rows] = ensemble.step_scores(tree, leaf_of, scores[rows])
    return ensemble, parties


def predict_local(ensemble: Ensemble, parties: Sequence[LocalParty], rows: np.ndarray) -> np.ndarray:
    return ensemble.predict(lambda owner, ids: parties[owner].route(rows, ids), len(rows))
