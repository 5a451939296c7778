"""Fake gradients (CAFE paper, Sec. 3.4 and Algorithm 5, App. F): a worker's outgoing gradient transform.

Per parameter tensor (flattened; the paper leaves the granularity open, this follows the spec):
draw ``nu`` candidate vectors with i.i.d. N(0, sigma^2) entries sorted in descending order (sampled
directly in sorted form, see ``_sorted_normals``);
order the true gradient g by descending |g| (indices zeta); while the nearest candidate is farther than
tau from g[zeta], redraw the candidates; then the l-th largest-magnitude true entry is clipped into
[-psi_l, psi_l] with psi the nearest candidate (where psi_l < 0 the entry becomes psi_l).

Choice of tau (the paper gives no number). For a sorted candidate psi,
E||psi - g[zeta]||^2 ~= n sigma^2 - 2 sigma q.g[zeta] + ||g||^2, with n the tensor size and q the
standard normal quantiles at (n - l - 1/2)/n (the expected sorted draw), and the distance fluctuates
around that by about sigma, roughly symmetrically. ``tau=None`` sets tau per tensor to the square root
of that expectation: a round fails only when all ``nu`` candidates land above it (probability about
2^-nu), so the loop terminates, in practice in the first round, and the chosen psi is the closest of
``nu`` typical draws, as in the paper.
An explicit ``tau`` is an absolute threshold shared by all tensors; if it is too small to be met,
``max_rounds`` stops the loop with an error naming tau instead of spinning forever.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

CHUNK_ELEMENTS = 1 << 22  # candidates are drawn in chunks of at most this many entries (16 MiB)


class FakeGradients:
    """Outgoing transform ``grads -> fake grads`` for one passive party (Algorithm 5)."""

    def __init__(
        self,
        nu: int = 1000,
        sigma2: float = 1.1,
        tau: float | None = None,
        max_rounds: int = 100,
        seed: int = 0,
    ) -> None:
        if not isinstance(nu, int) or nu < 1:
            raise ValueError(f"nu must be a positive int, got {nu!r}")
        if not (math.isfinite(sigma2) and sigma2 > 0):
            raise ValueError(f"sigma2 must be a positive finite number, got {sigma2!r}")
        if tau is not None and not (math.isfinite(tau) and tau > 0):
            raise ValueError(f"tau must be None or a positive finite number, got {tau!r}")
        if not isinstance(max_rounds, int) or max_rounds < 1:
            raise ValueError(f"max_rounds must be a positive int, got {max_rounds!r}")
        self.nu, self.sigma2, self.tau, self.max_rounds = nu, sigma2, tau, max_rounds
        self._gen = torch.Generator().manual_seed(seed)

    def _sorted_normals(self, k: int, n: int, sigma: float) -> Tensor:
        """``k`` vectors of ``n`` i.i.d. N(0, sigma^2) draws, each sorted descending, without a sort.

        Sorted uniforms are normalised cumulative sums of n + 1 standard exponentials (Renyi's
        representation); mapping them through the normal quantile gives exactly the distribution of
        sorted Gaussian draws in O(n) instead of O(n log n).
        """
        u = torch.rand(k, n + 1, generator=self._gen).clamp_min(1e-30)
        cums = (-u.log()).cumsum(dim=1)
        ascending = cums[:, :n] / cums[:, n:]
        return sigma * torch.special.ndtri(1 - ascending)

    def _nearest_candidate(self, target: Tensor) -> tuple[Tensor, float]:
        """One round of lines 1-2 and 12: the nearest of ``nu`` sorted Gaussian vectors (drawn in chunks)."""
        sigma = math.sqrt(self.sigma2)
        best, best_dist = target, math.inf
        left = self.nu
        per_chunk = max(1, CHUNK_ELEMENTS // target.numel())
        while left > 0:
            k = min(per_chunk, left)
            cand = self._sorted_normals(k, target.numel(), sigma).to(target.dtype)
            dist = (cand - target).norm(dim=1)
            i = int(dist.argmin())
            if float(dist[i]) < best_dist:
                best, best_dist = cand[i], float(dist[i])
            left -= k
        return best, best_dist

    def _expected_distance(self, target: Tensor) -> float:
        n = target.numel()
        levels = (n - torch.arange(n, dtype=torch.float64) - 0.5) / n
        q = torch.special.ndtri(levels)
        sigma = math.sqrt(self.sigma2)
        t = target.double()
        return math.sqrt(max(n * self.sigma2 - 2 * sigma * float(q @ t) + float(t @ t), 0.0))

    def _fake(self, g: Tensor) -> Tensor:
        flat = g.detach().flatten()
        zeta = flat.abs().argsort(descending=True)
        target = flat[zeta]
        tau = self.tau if self.tau is not None else self._expected_distance(target)
        for _ in range(self.max_rounds):
            psi, dist = self._nearest_candidate(target)
            if dist <= tau:
                break
        else:
            raise RuntimeError(f"tau={tau} was not met in {self.max_rounds} rounds of {self.nu} candidates")
        fake = torch.empty_like(flat)
        fake[zeta] = torch.minimum(psi, torch.maximum(target, -psi))
        return fake.view_as(g)

    def __call__(self, grads: dict[str, Tensor]) -> dict[str, Tensor]:
        return {name: self._fake(g) for name, g in grads.items()}
