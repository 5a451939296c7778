"""Counting the Paillier work of a computation in per-value operations (for `vflnet bench he-step`).

Inside ``counting()`` every engine operation reports what an implementation with one ciphertext per
value (python-paillier's ``EncryptedNumber``) would do for it: encryptions, ciphertext additions,
plaintext additions (masks), ciphertext x plaintext products (by the multiplier's bit length and
sign, which set their cost), re-randomisations of computed ciphertexts before they are sent, and
decryptions. A packed array counts every value of its shape (padding the caller put into the shape
included), not its ciphertexts. Work with no per-value counterpart is not counted: packing (the
Horner chains), rescaling to a common scale (per-value numbers keep their own exponents).

Counts are kept per owner, ``owner()`` evaluated in the thread that does the work (default: one
owner, ""). Counting is off outside ``counting()``: the engine then pays one global lookup per op.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

KINDS = ("encrypt", "add", "add_plain", "mul", "obfuscate", "decrypt")


@dataclass
class OpCounts:
    """Per-value operations of one owner; ``mul_bits`` splits ``mul`` by (multiplier bits, negative)."""

    ops: Counter[str] = field(default_factory=Counter)
    mul_bits: Counter[tuple[int, bool]] = field(default_factory=Counter)

    def __getitem__(self, kind: str) -> int:
        return self.ops[kind]

    def scaled(self, factor: float) -> OpCounts:
        """Every count times ``factor`` (per step from a run's total: factor 1/steps)."""
        out = OpCounts()
        out.ops.update({k: v * factor for k, v in self.ops.items()})  # type: ignore[misc]
        out.mul_bits.update({k: v * factor for k, v in self.mul_bits.items()})  # type: ignore[misc]
        return out


class OpCounter:
    """Counts of the work done while it is active, per owner."""

    def __init__(self, owner: Callable[[], str]) -> None:
        self.owner = owner
        self.counts: dict[str, OpCounts] = {}
        self.lock = threading.Lock()

    def _slot(self) -> OpCounts:
        who = self.owner()
        if who not in self.counts:
            self.counts[who] = OpCounts()
        return self.counts[who]

    def add(self, kind: str, n: int) -> None:
        if n:
            with self.lock:
                self._slot().ops[kind] += int(n)

    def products(self, multipliers: np.ndarray, uses: np.ndarray | int = 1) -> None:
        """Products by each multiplier in ``multipliers`` (object array of ints), each used ``uses``
        times (an array broadcasting against ``multipliers``, or a number)."""
        if multipliers.size == 0:
            return
        flat = np.asarray(multipliers, dtype=object).reshape(-1)
        bits = np.fromiter((abs(int(v)).bit_length() for v in flat), dtype=np.int64, count=flat.size)
        negative = np.fromiter((int(v) < 0 for v in flat), dtype=bool, count=flat.size)
        weights = np.broadcast_to(np.asarray(uses, dtype=np.int64), np.shape(multipliers)).reshape(-1)
        key = bits * 2 + negative
        totals = np.bincount(key, weights=weights)
        with self.lock:
            slot = self._slot()
            for k in np.flatnonzero(totals):
                slot.mul_bits[(int(k) // 2, bool(k % 2))] += int(totals[k])
            slot.ops["mul"] += int(totals.sum())


_ACTIVE: OpCounter | None = None


@contextlib.contextmanager
def counting(owner: Callable[[], str] = lambda: "") -> Iterator[OpCounter]:
    """Count the engine's work (in every thread) until the block ends; one counter at a time."""
    global _ACTIVE
    if _ACTIVE is not None:
        raise RuntimeError("already counting")
    counter = OpCounter(owner)
    _ACTIVE = counter
    try:
        yield counter
    finally:
        _ACTIVE = None


def active() -> OpCounter | None:
    return _ACTIVE


def count(kind: str, n: int) -> None:
    """Called by the engine: ``n`` per-value operations of ``kind``."""
    counter = _ACTIVE
    if counter is not None:
        counter.add(kind, n)


def count_products(multipliers: Any, uses: Any = 1, additions: int = 0) -> None:
    """Called by the engine: products by ``multipliers`` (each ``uses`` times) and the ``additions``
    that sum them up."""
    counter = _ACTIVE
    if counter is not None:
        counter.products(np.asarray(multipliers, dtype=object), uses)
        counter.add("add", additions)
