"""HashVFL's model components (paper 001): the hash layer of each party with features, the class codes
and consistency loss of the label holder, and the paper's baselines' pieces.

- A party's code is ``H = Sign(BN(f(x)))`` with Sign(0) = +1 and the straight-through gradient (the
  gradient of H is used verbatim as the gradient of BN(f(x))). Only H leaves the party.
- The label holder draws C distinct class codes o in {-1,+1}^d (Bernoulli(1/2) bits, redrawn until the
  rows are unique) and adds the consistency term -mean_i mean_u (h_i . o_y)/d to the cross-entropy
  (Algorithm 1's ``CE + 1 - Cos`` without the constant).
- Variants (the baselines of Table X and Fig. 6): ``hashvfl`` (BN + Sign + class codes), ``no_bn``
  (Sign + class codes), ``greedy_hash`` (Sign, no BN, CE plus Greedy Hash's party-local penalty
  0.1 mean|V - Sign(V)|^3), ``bsl`` (binarised split learning: BN + Sign, CE only, no class codes),
  and ``base_bn`` (BN, no Sign, CE only: the paper's structure without the hash, so each party sends
  its real-valued BN output, one standard deviation per dimension like the +/-1 codes; the comparably
  scaled "Base" of Table V).
- Laplace noise on the codes (Table VII): ``Sign(H + Lap(2/eps))``, re-signed so the wire stays +/-1.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

VARIANTS = ("hashvfl", "no_bn", "greedy_hash", "bsl", "base_bn")
USES_BN = {"hashvfl": True, "no_bn": False, "greedy_hash": False, "bsl": True, "base_bn": True}
USES_CLASS_CODES = {"hashvfl": True, "no_bn": True, "greedy_hash": False, "bsl": False, "base_bn": False}
# base_bn sends the real-valued BN output (float32 on the wire); every other variant sends +/-1 codes
USES_SIGN = {"hashvfl": True, "no_bn": True, "greedy_hash": True, "bsl": True, "base_bn": False}


def hard_sign(v: torch.Tensor) -> torch.Tensor:
    """+1 where v >= 0, -1 elsewhere (torch.sign would send 0 to 0)."""
    return torch.where(v >= 0, torch.ones_like(v), -torch.ones_like(v))


class SignSTE(torch.autograd.Function):
    """Sign forward, identity backward (the pure straight-through estimator, no clipping)."""

    @staticmethod
    def forward(ctx: object, v: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return hard_sign(v)

    @staticmethod
    def backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return grad


def sign_ste(v: torch.Tensor) -> torch.Tensor:
    return SignSTE.apply(v)  # type: ignore[no-any-return]


def default_code_len(n_classes: int) -> int:
    """The paper's main setting: ceil(log2 C) bits, just enough to give every class its own code."""
    return max(1, math.ceil(math.log2(n_classes)))


def class_codes(n_classes: int, code_len: int, seed: int) -> np.ndarray:
    """C distinct rows of i.i.d. +/-1 bits (p = 1/2), redrawn until unique; float32 [C, d]."""
    if 2**code_len < n_classes:
        raise ValueError(f"{code_len}-bit codes cannot give {n_classes} classes distinct codes")
    rng = np.random.default_rng([seed, 1001])
    while True:
        codes = np.where(rng.random((n_classes, code_len)) < 0.5, -1.0, 1.0).astype(np.float32)
        if len(np.unique(codes, axis=0)) == n_classes:
            return codes


def hamming(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamming distance between +/-1 codes along the last axis: sum (1 - a*b)/2."""
    return ((1 - a * b) / 2).sum(-1)


def consistency_loss(codes: list[torch.Tensor], table: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """-mean over parties and samples of (h . o_y)/d: 1 - Cos(H, o_Y) without the constant, written as a
    dot product so its gradient, -o_y/(N B d) per sample, has no norm term."""
    target = table[y]
    d = target.shape[1]
    return -torch.stack([(h * target).sum(1).mean() / d for h in codes]).mean()


# Greedy Hash's weight on its penalty (Su et al., NeurIPS 2018, the paper's [27]; its reference code)
GREEDY_WEIGHT = 0.1


def greedy_penalty(v: torch.Tensor) -> torch.Tensor:
    """Greedy Hash's pull of the real-valued output V towards its code Sign(V), as Su et al. [27] publish
    it: 0.1 x the mean over the batch matrix of |V - Sign(V)|^3 (= ||V| - 1|^3); computed where V lives,
    at the party. Not the HashVFL authors' ``||V - H||_3`` with H the STE's output: that term's
    gradient is exactly zero (the STE's identity cancels V's own), so it trains nothing; with H held
    constant instead, its gradient keeps its size however close V is, and pins every sample to one
    code (docs/attacks.md, Table X)."""
    return GREEDY_WEIGHT * (v - hard_sign(v.detach())).abs().pow(3).mean()


def laplace_resign(h: torch.Tensor, epsilon: float, generator: torch.Generator) -> torch.Tensor:
    """Sign(H + Lap(2/eps)) with the straight-through gradient: flips each bit with probability
    exp(-eps/2)/2 and keeps the wire +/-1."""
    u = torch.rand(h.shape, generator=generator, dtype=h.dtype) - 0.5
    lap = -(2.0 / epsilon) * torch.sign(u) * torch.log1p(-2 * u.abs())  # Laplace by inverse CDF, seeded
    return h + (hard_sign(h.detach() + lap) - h.detach())


class HashHead(nn.Module):
    """What sits between a party's bottom model and its code: BatchNorm1d(d) (or nothing, for the
    variants without BN). Its output is the pre-sign activation, which never leaves the party."""

    def __init__(self, width: int, batch_norm: bool) -> None:
        super().__init__()
        self.norm: nn.Module = nn.BatchNorm1d(width) if batch_norm else nn.Identity()

    def forward(self, v: torch.Tensor) -> torch.Tensor:
        return self.norm(v)


class HashedBottom(nn.Module):
    """bottom -> HashHead: a party's model up to the pre-sign activation (what a model release
    hands over, BN included); ``code`` adds the Sign."""

    def __init__(self, bottom: nn.Module, head: HashHead) -> None:
        super().__init__()
        self.bottom = bottom
        self.head = head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.bottom(x))

    def code(self, x: torch.Tensor) -> torch.Tensor:
        return sign_ste(self(x))
