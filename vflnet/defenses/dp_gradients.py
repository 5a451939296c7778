"""DP-style gradient upload (the DP baseline of CAFE App. G.3): clip the upload's norm, add Gaussian noise.

A party applies it to its own batch-averaged gradient upload (it never sees per-sample gradients in
the param-server protocol, so clipping acts on the whole upload: the global l2 norm over all its
tensors is clipped to ``clip_norm``, the paper's value being 3), then adds N(0, (noise_multiplier *
clip_norm)^2) to every entry. ``from_epsilon`` calibrates the multiplier for one (epsilon, delta)
release with the classic Gaussian mechanism, sigma = sqrt(2 ln(1.25/delta)) / epsilon (Dwork and Roth;
tight only for epsilon < 1, and no accounting across iterations: the paper gives no calibration).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


class DpGradients:
    """Outgoing transform ``grads -> clipped + noised grads`` for one party."""

    def __init__(self, clip_norm: float = 3.0, noise_multiplier: float = 1.0, seed: int = 0) -> None:
        if not (math.isfinite(clip_norm) and clip_norm > 0):
            raise ValueError(f"clip_norm must be a positive finite number, got {clip_norm!r}")
        if not (math.isfinite(noise_multiplier) and noise_multiplier >= 0):
            raise ValueError(
                f"noise_multiplier must be a non-negative finite number, got {noise_multiplier!r}"
            )
        self.clip_norm, self.noise_multiplier = clip_norm, noise_multiplier
        self._gen = torch.Generator().manual_seed(seed)

    @classmethod
    def from_epsilon(
        cls, epsilon: float, delta: float = 1e-5, clip_norm: float = 3.0, seed: int = 0
    ) -> DpGradients:
        """Gaussian-mechanism calibration for one release at (epsilon, delta)."""
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"epsilon must be a positive finite number, got {epsilon!r}")
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        return cls(clip_norm, math.sqrt(2 * math.log(1.25 / delta)) / epsilon, seed)

    def __call__(self, grads: dict[str, Tensor]) -> dict[str, Tensor]:
        norm = math.sqrt(sum(float(g.detach().double().pow(2).sum()) for g in grads.values()))
        scale = min(1.0, self.clip_norm / norm) if norm > 0 else 1.0
        std = self.noise_multiplier * self.clip_norm
        return {
            name: g.detach() * scale + torch.randn(g.shape, generator=self._gen, dtype=g.dtype) * std
            for name, g in grads.items()
        }
