"""Image-recovery metrics: PSNR, MSE, recovered-label accuracy, iterations to a PSNR target, grid pictures."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from vflnet.extras import require


def _check_pair(real: Tensor, fake: Tensor) -> None:
    if real.shape != fake.shape:
        raise ValueError(f"shape mismatch: real {tuple(real.shape)} vs recovered {tuple(fake.shape)}")
    if real.dim() < 2:
        raise ValueError("expected a batch of images [N, ...]")


def psnr_per_image(real: Tensor, fake: Tensor, max_val: float = 1.0) -> Tensor:
    """PSNR of each image, 10 log10(max^2 / MSE); recovered values are clipped to [0, max_val] first."""
    _check_pair(real, fake)
    err = (real.double() - fake.double().clamp(0, max_val)).pow(2).flatten(1).mean(1)
    return 10 * torch.log10(max_val**2 / err.clamp_min(1e-20))


def psnr(real: Tensor, fake: Tensor, max_val: float = 1.0) -> float:
    """Mean per-image PSNR over all N images (the paper reports the mean over the recovered set)."""
    return float(psnr_per_image(real, fake, max_val).mean())


def mse(real: Tensor, fake: Tensor, max_val: float = 1.0) -> float:
    """Mean squared error over all pixels, recovered values clipped to [0, max_val]."""
    _check_pair(real, fake)
    return float((real.double() - fake.double().clamp(0, max_val)).pow(2).mean())


def label_accuracy(recovered: Tensor, true: Tensor) -> float:
    """Fraction of recovered labels equal to the truth; ``recovered`` is indices or per-class scores."""
    if recovered.dim() == 2:
        recovered = recovered.argmax(dim=1)
    if recovered.shape != true.shape:
        raise ValueError(f"shape mismatch: {tuple(recovered.shape)} vs {tuple(true.shape)}")
    return float((recovered == true).double().mean())


def iterations_to_psnr(history: Iterable[tuple[int, float]], target: float) -> int | None:
    """First iteration in a ``(iteration, psnr)`` history at which PSNR reaches ``target`` (Table 5)."""
    for iteration, value in history:
        if value >= target:
            return iteration
    return None


def save_image_grid(real: Tensor, fake: Tensor, path: str | Path, n: int = 20, title: str = "") -> Path:
    """Write a PNG with ``n`` real images (top row) above their recoveries (bottom row)."""
    require("matplotlib", "the image grid").use("Agg")
    plt = require("matplotlib.pyplot", "the image grid")

    _check_pair(real, fake)
    n = min(n, real.shape[0])
    fig, axes = plt.subplots(2, n, figsize=(n * 0.9, 2.2), squeeze=False)
    for row, batch in enumerate((real, fake.clamp(0, 1))):
        for i in range(n):
            img = batch[i].detach().cpu().numpy()
            img = img[0] if img.shape[0] == 1 else np.transpose(img, (1, 2, 0))
            ax = axes[row][i]
            ax.imshow(img, cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
        axes[row][0].set_ylabel("real" if row == 0 else "recovered", fontsize=7)
    if title:
        fig.suptitle(title, fontsize=8)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80, bbox_inches="tight")
    plt.close(fig)
    return path


def ssim_per_image(
    real: Tensor, fake: Tensor, max_val: float = 1.0, window: int = 11, sigma: float = 1.5
) -> Tensor:
    """Structural similarity (Wang et al.) of each image pair [N, 1, H, W]: Gaussian window 11, sigma
    1.5, K1 = 0.01, K2 = 0.03, valid positions only; the window shrinks to the largest odd size that
    fits a smaller image (8x4 digits halves). Recovered values are clipped to [0, max_val]."""
    _check_pair(real, fake)
    x, y = real.double(), fake.double().clamp(0, max_val)
    size = min(window, x.shape[-2], x.shape[-1])
    size -= 1 - size % 2
    r = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(r**2) / (2 * sigma**2))
    kernel = (g[:, None] * g[None, :] / g.sum() ** 2)[None, None]

    def blur(t: Tensor) -> Tensor:
        return torch.nn.functional.conv2d(t, kernel)

    c1, c2 = (0.01 * max_val) ** 2, (0.03 * max_val) ** 2
    mx, my = blur(x), blur(y)
    vx, vy, cxy = blur(x * x) - mx**2, blur(y * y) - my**2, blur(x * y) - mx * my
    s = ((2 * mx * my + c1) * (2 * cxy + c2)) / ((mx**2 + my**2 + c1) * (vx + vy + c2))
    return s.flatten(1).mean(1)
