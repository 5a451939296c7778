"""Paper 000's defenses of a passive party's first-layer output z_A = W_A x_A (Sec. V), as bottom models
the party builds in place of its own (``acts_on = "bottom"``): what they send is what crosses the wire,
in every phase (training, evaluation, prediction) and under every protocol (under split-he before it is
encrypted).

- ``embedding-noise`` (Algorithm 3): z_A + u, u ~ N(0, sigma^2) per entry, drawn afresh for every
  message; the noise is outside the autograd graph, so dL/dW_A = dL/dz x_A^T exactly as without it.
- ``masquerade`` (Algorithm 4): z_A = P Q x_A + a u with P (k x (d_A-1)), Q ((d_A-1) x d_A) and u (k)
  trained, so W_A = P Q has rank d_A - 1 and the fabricated binary feature a enters col(Z_A) while the
  true ones leave it. P, Q start from the truncated SVD of a default-initialised W_A. The paper leaves
  open how a is drawn: ``a_mode: per_sample`` (default) fixes a per record, from a keyed hash of the
  record's row (the same record always gets the same a, so two queries of one record do not expose
  +-u); ``per_message`` draws a fresh Bernoulli(0.5) for every row of every message (the literal
  reading).
"""

from __future__ import annotations

import functools
import hashlib
from abc import abstractmethod
from typing import Any

import numpy as np
import torch
from torch import nn

from vflnet.defenses.base import Defense
from vflnet.registry import DEFENSES, Param


class NoisyEmbedding(nn.Module):
    """The party's own bottom, plus N(0, sigma^2) noise on what it outputs (Algorithm 3)."""

    def __init__(self, inner: nn.Module, sigma: float, seed: int) -> None:
        super().__init__()
        self.inner = inner
        self.sigma = sigma
        self.gen = torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = self.inner(x)
        noise = torch.randn(z.shape, generator=self.gen, dtype=z.dtype) * self.sigma
        return z + noise


class Masquerade(nn.Module):
    """z_A = P Q x_A + a u (Algorithm 4); autograd gives the paper's dL/dP, dL/dQ and dL/du = a dL/dz."""

    def __init__(self, in_dim: int, out_dim: int, a_mode: str, seed: int) -> None:
        super().__init__()
        if in_dim < 2:
            raise ValueError(f"masquerade needs a passive party with >= 2 features, got {in_dim}")
        full = nn.Linear(in_dim, out_dim, bias=False).weight.detach().double()
        u, s, vt = torch.linalg.svd(full, full_matrices=False)
        rank = in_dim - 1
        self.q = nn.Linear(in_dim, rank, bias=False)
        self.p = nn.Linear(rank, out_dim, bias=False)
        with torch.no_grad():
            self.q.weight.copy_(vt[:rank].float())
            self.p.weight.copy_((u[:, :rank] * s[:rank]).float())
        self.u = nn.Parameter(torch.randn(out_dim) / np.sqrt(out_dim))
        self.a_mode = a_mode
        self.key = seed.to_bytes(8, "little", signed=True)
        self.gen = torch.Generator().manual_seed(seed)

    def fabricated(self, x: torch.Tensor) -> torch.Tensor:
        """a for each row of x: a keyed hash of the row (per_sample) or a fresh coin (per_message)."""
        if self.a_mode == "per_message":
            return torch.bernoulli(torch.full((x.shape[0],), 0.5), generator=self.gen)
        rows = np.ascontiguousarray(x.detach().numpy())
        bits = [hashlib.blake2b(r.tobytes(), key=self.key, digest_size=1).digest()[0] & 1 for r in rows]
        return torch.tensor(bits, dtype=x.dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.p(self.q(x)) + self.fabricated(x)[:, None] * self.u[None, :]


class BottomDefense(Defense):
    """A defense that replaces or wraps the passive party's bottom model."""

    roles = frozenset({"passive"})
    acts_on = "bottom"

    def build(self, num_classes: int, seed: int) -> Any:
        """(bottom, in_dim, out_dim) -> the module the party trains and sends the output of."""
        return functools.partial(self.wrap, seed=seed)

    @abstractmethod
    def wrap(self, bottom: nn.Module, in_dim: int, out_dim: int, seed: int) -> nn.Module: ...


def _number(default: float, help_: str) -> Param:
    return Param(
        default,
        help_,
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v >= 0,
        "a number >= 0",
    )


@DEFENSES.register
class EmbeddingNoise(BottomDefense):
    name = "embedding-noise"
    description = (
        "paper 000 Algorithm 3: add N(0, sigma^2) noise to every entry of z_A the passive party sends"
    )
    implementation = NoisyEmbedding
    params = {"sigma": _number(0.1, "noise standard deviation (in units of z_A)")}

    def wrap(self, bottom: nn.Module, in_dim: int, out_dim: int, seed: int) -> nn.Module:
        return NoisyEmbedding(bottom, float(self.p["sigma"]), seed)


@DEFENSES.register
class MasqueradeDefense(BottomDefense):
    name = "masquerade"
    description = "paper 000 Algorithm 4: rank-(d_A-1) W_A = P Q plus a fabricated random binary feature a u"
    implementation = Masquerade
    params = {
        "a_mode": Param(
            "per_sample",
            "how the fabricated bit is drawn: per_sample (fixed per record) or per_message",
            lambda v: v in ("per_sample", "per_message"),
            "per_sample or per_message",
        )
    }

    def wrap(self, bottom: nn.Module, in_dim: int, out_dim: int, seed: int) -> nn.Module:
        if not isinstance(bottom, nn.Linear) or bottom.bias is not None:
            raise ValueError("masquerade replaces an input-layer cut: a linear bottom with bias: false")
        return Masquerade(in_dim, out_dim, str(self.p["a_mode"]), seed)
