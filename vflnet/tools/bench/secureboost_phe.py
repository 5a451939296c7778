"""The `secureboost` tree on python-paillier objects: the phe row of `vflnet bench secureboost`.

python-paillier has no arrays, no packing and no wire format, so the protocol's messages cannot carry
its numbers without a second implementation of the protocol. This runs the protocol's algorithm (the
label holder's loop `grow_tree`, with histogram subtraction) with every party in this process and the
cryptography one `phe.EncryptedNumber` per value, as a phe implementation of the protocol would:

- the label holder encrypts each row's k gradient statistics (fixed-point integers) and serialises
  them for every passive party;
- a passive party reads them back, adds each row's values into its bucket per node and feature
  (phe `+`), takes the cumulative sums over the buckets, re-randomises every histogram value for the
  wire and serialises it;
- the label holder reads the histograms back and decrypts every value.

Ciphertexts cross as fixed-width big-endian integers (2 * bits / 8 bytes each). There is no gRPC here:
the figure is phe's arithmetic alone, which favours phe against the engine's run over the bridge.
The grown tree must equal the plaintext one-process tree (`same_tree`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import phe

from vflnet.models.secureboost import LocalParty, Tree, TreeParams, grad_hess, grow_tree
from vflnet.progress import advance, runs


@dataclass
class PheWire:
    """Fixed-width serialisation of ciphertexts (exponent 0: the values are fixed-point integers)."""

    public_key: phe.PaillierPublicKey
    sent: int = 0  # bytes

    @property
    def width(self) -> int:
        return (2 * self.public_key.n.bit_length() + 7) // 8

    def send(self, numbers: np.ndarray) -> bytes:
        w = self.width
        blob = b"".join(int(c.ciphertext(be_secure=False)).to_bytes(w, "big") for c in numbers.flat)
        self.sent += len(blob)
        return blob

    def receive(self, blob: bytes, shape: tuple[int, ...]) -> np.ndarray:
        w, pk = self.width, self.public_key
        out = np.empty(len(blob) // w, dtype=object)
        out[:] = [
            phe.EncryptedNumber(pk, int.from_bytes(blob[i : i + w], "big"), 0) for i in range(0, len(blob), w)
        ]
        return out.reshape(shape)


class PhePassive:
    """A passive party's side over phe numbers: its features and split table are a `LocalParty`'s."""

    def __init__(self, local: LocalParty, wire: PheWire) -> None:
        self.local, self.wire = local, wire
        self.gh = np.empty((0, 0), dtype=object)

    def start_tree(self, rows: np.ndarray, blob: bytes, k: int) -> None:
        self.local.start_tree(rows, None)
        self.gh = self.wire.receive(blob, (len(rows), k))

    def histograms(self, node_of: np.ndarray, nodes: list[int]) -> bytes:
        """Cumulative histograms (nodes, candidates, k), each value re-randomised, serialised."""
        local, pk = self.local, self.wire.public_key
        local.node_of = node_of
        k = self.gh.shape[1]
        out = np.empty((len(nodes), sum(local.n_candidates), k), dtype=object)
        for j, node in enumerate(nodes):
            rows = np.flatnonzero(node_of == node)
            col = 0
            for f, m in enumerate(local.n_candidates):
                b = local.buckets[rows, f]
                order = np.argsort(b, kind="stable")
                sorted_b, values = b[order], self.gh[rows[order]]
                acc = [phe.EncryptedNumber(pk, 1, 0)] * k  # Enc(0) without randomness: re-randomised below
                for t in range(m):
                    lo, hi = np.searchsorted(sorted_b, [t, t + 1])
                    for i in range(lo, hi):
                        acc = [a + v for a, v in zip(acc, values[i], strict=True)]
                    out[j, col + t] = [phe.EncryptedNumber(pk, a.ciphertext(False), 0) for a in acc]
                col += m
        for c in out.flat:
            c.obfuscate()
        return self.wire.send(out)


class PheRemote:
    """The label holder's handle on a passive party: decrypts what the party's histograms carry."""

    def __init__(self, party: PhePassive, private_key: phe.PaillierPrivateKey, k: int) -> None:
        self.party, self.private_key, self.k = party, private_key, k

    def histograms(self, node_of: np.ndarray, nodes: list[int]) -> np.ndarray:
        blob = self.party.histograms(node_of, nodes)
        shape = (len(nodes), sum(self.party.local.n_candidates), self.k)
        numbers = self.party.wire.receive(blob, shape)
        advance(f"{len(nodes)} node(s)")
        return np.array([self.private_key.decrypt(c) for c in numbers.flat], np.int64).reshape(shape)

    def split(self, node: int, candidate: int) -> tuple[int, np.ndarray]:
        return self.party.local.split(node, candidate)


def encrypt_rows(public: phe.PaillierPublicKey, gh: np.ndarray) -> np.ndarray:
    """The label holder's gh (n, k) fixed-point integers as phe numbers, one per value."""
    numbers = np.empty(gh.shape, dtype=object)
    with runs("phe: encrypt gh", total=len(gh), unit="row"):
        for i, row in enumerate(gh.tolist()):
            numbers[i] = [public.encrypt(v) for v in row]
            advance(str(i))
    return numbers


@dataclass
class PheTree:
    seconds: float
    cpu_seconds: float  # of this process: the run is single-threaded, so this is its cost on an idle core
    bytes_sent: int
    tree: Tree
    same_tree: bool  # the tree equals the plaintext one-process tree


def phe_tree(
    xs: list[np.ndarray],
    y: np.ndarray,
    n_classes: int,
    params: TreeParams,
    train_rows: np.ndarray,
    key_bits: int,
) -> PheTree:
    """One tree on the initial gradients; party 0 (the label holder) histograms its own features in
    plaintext, as the protocol's label holder does; the others are passive parties over phe."""
    public, private = phe.generate_paillier_keypair(n_length=key_bits)
    gh = grad_hess(y[train_rows], np.zeros((len(train_rows), n_classes)))
    k = gh.shape[1]
    own = LocalParty.fit(xs[0], train_rows, params.n_bins)
    passives = [PhePassive(LocalParty.fit(x, train_rows, params.n_bins), PheWire(public)) for x in xs[1:]]

    start, start_cpu = time.perf_counter(), time.process_time()
    numbers = encrypt_rows(public, gh)
    own.start_tree(train_rows, gh)
    for p in passives:
        p.start_tree(train_rows, p.wire.send(numbers), k)
    parties = [own, *(PheRemote(p, private, k) for p in passives)]
    with runs("phe: histograms", unit="request"):
        tree, _ = grow_tree(parties, gh, n_classes, params)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - start_cpu

    plain = [LocalParty.fit(x, train_rows, params.n_bins) for x in xs]
    for p in plain:
        p.start_tree(train_rows, gh)
    expected, _ = grow_tree(plain, gh, n_classes, params)
    same = all(
        np.array_equal(a, b)
        for a, b in zip(tree.to_dict().values(), expected.to_dict().values(), strict=True)
    )
    return PheTree(seconds, cpu_seconds, sum(p.wire.sent for p in passives), tree, same)
