"""The VFL model of the CAFE paper (Jin et al., NeurIPS 2021, Fig. 4 and the authors' MNIST model).

M workers each own one image region and a bottom model ``features -> fc1 -> ReLU -> fc2 -> ReLU -> fc3 ->
ReLU``; the label holder owns the top model, a linear layer on the concatenated worker outputs trained
with softmax cross-entropy. ``fc1`` is "the first fully connected layer" whose bias and weight gradients
CAFE Steps I-II invert; ``features`` is the conv stack (conv variant) or a plain flatten (FC-only
variant, where the input of ``fc1`` is the raw region, so Steps I-II alone recover the data).

Parameters and gradients are exchanged as ``{party: {param_name: tensor}}`` with the party names
``worker0..worker{M-1}`` and ``top``; each party's ``param_name`` is the name inside its own module
(``fc1.weight``, ``fc1.bias``, ...), which is what a party would put on the wire.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn import functional as F

TOP = "top"

Params = Mapping[str, Mapping[str, Tensor]]


def worker_name(m: int) -> str:
    """Party name of worker ``m`` on the wire."""
    return f"worker{m}"


@dataclass(frozen=True)
class CafeNetConfig:
    """Shape of the CAFE VFL model; defaults are the authors' MNIST model (14x14 quadrants, M = 4)."""

    kind: Literal["conv", "fc"] = "conv"
    n_workers: int = 4
    region_shape: tuple[int, int, int] = (1, 14, 14)
    n_classes: int = 10
    conv_channels: tuple[int, int] = (64, 128)
    fc1_out: int = 256
    fc2_out: int = 64
    worker_out: int = 10
    top_softmax: bool = False  # the authors' top: softmax on its output, before the loss's own softmax

    def __post_init__(self) -> None:
        if self.kind not in ("conv", "fc"):
            raise ValueError(f"kind must be 'conv' or 'fc', got {self.kind!r}")
        for name in ("n_workers", "n_classes", "fc1_out", "fc2_out", "worker_out"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if len(self.region_shape) != 3 or min(self.region_shape) < 1:
            raise ValueError(f"region_shape must be (C, H, W) with positive sizes, got {self.region_shape}")
        if len(self.conv_channels) != 2 or min(self.conv_channels) < 1:
            raise ValueError(f"conv_channels must be two positive ints, got {self.conv_channels}")

    def feature_dim(self) -> int:
        """d1: the size of a worker's internal representation (the input of fc1)."""
        c, h, w = self.region_shape
        if self.kind == "fc":
            return c * h * w
        # two stride-2 max-pools with TF 'same' padding (ceil_mode): ceil(ceil(h/2)/2)
        return self.conv_channels[1] * ((h + 3) // 4) * ((w + 3) // 4)


class CafeBottom(nn.Module):
    """One worker's bottom model; ``internal(x)`` is h_n, the input of the first FC layer."""

    def __init__(self, config: CafeNetConfig) -> None:
        super().__init__()
        c = config.region_shape[0]
        if config.kind == "conv":
            c1, c2 = config.conv_channels
            self.features: nn.Module = nn.Sequential(
                nn.Conv2d(c, c1, 5, padding=2),
                nn.ReLU(),
                nn.MaxPool2d(2, 2, ceil_mode=True),
                nn.Conv2d(c1, c2, 5, padding=2),
                nn.ReLU(),
                nn.MaxPool2d(2, 2, ceil_mode=True),
                nn.Flatten(),
            )
        else:
            self.features = nn.Flatten()
        self.fc1 = nn.Linear(config.feature_dim(), config.fc1_out)
        self.head = nn.Sequential(
            nn.ReLU(),
            nn.Linear(config.fc1_out, config.fc2_out),
            nn.ReLU(),
            nn.Linear(config.fc2_out, config.worker_out),
            nn.ReLU(),
        )

    def internal(self, x: Tensor) -> Tensor:
        return self.features(x)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.fc1(self.internal(x)))


class CafeTop(nn.Module):
    """The label holder's top model: a linear layer on the concatenated worker outputs (softmax in the loss)."""

    def __init__(self, config: CafeNetConfig) -> None:
        super().__init__()
        self.out = nn.Linear(config.n_workers * config.worker_out, config.n_classes)
        self.softmax = config.top_softmax

    def forward(self, z: Tensor) -> Tensor:
        out = self.out(z)
        return torch.softmax(out, dim=1) if self.softmax else out


class CafeVFL(nn.Module):
    """All parties' modules side by side; only used in-process (tests, the attacker's architecture copy)."""

    def __init__(self, config: CafeNetConfig) -> None:
        super().__init__()
        self.config = config
        self.bottoms = nn.ModuleList(CafeBottom(config) for _ in range(config.n_workers))
        self.top = CafeTop(config)

    @property
    def worker_names(self) -> list[str]:
        return [worker_name(m) for m in range(self.config.n_workers)]

    def party_modules(self) -> dict[str, nn.Module]:
        mods: dict[str, nn.Module] = {worker_name(m): b for m, b in enumerate(self.bottoms)}
        mods[TOP] = self.top
        return mods

    def forward(
        self, xs: Sequence[Tensor], return_internal: bool = False
    ) -> Tensor | tuple[Tensor, list[Tensor]]:
        internals = [b.internal(x) for b, x in zip(self.bottoms, xs, strict=True)]
        outs = [b.head(b.fc1(h)) for b, h in zip(self.bottoms, internals, strict=True)]
        logits = self.top(torch.cat(outs, dim=1))
        return (logits, internals) if return_internal else logits


def flat_name(party: str, name: str) -> str:
    """Name of a party's parameter inside ``CafeVFL`` (for ``torch.func.functional_call``)."""
    if party == TOP:
        return f"top.{name}"
    if not party.startswith("worker"):
        raise KeyError(f"unknown party {party!r}")
    return f"bottoms.{int(party[len('worker') :])}.{name}"


def party_parameters(model: CafeVFL) -> dict[str, dict[str, Tensor]]:
    """Detached copies of every party's parameters: what the server broadcasts."""
    return {
        party: {n: p.detach().clone() for n, p in mod.named_parameters()}
        for party, mod in model.party_modules().items()
    }


def load_party_parameters(model: CafeVFL, params: Params) -> None:
    """Copy broadcast parameters into a model (a party applying the server's broadcast)."""
    with torch.no_grad():
        for party, mod in model.party_modules().items():
            for n, p in mod.named_parameters():
                p.copy_(params[party][n])


def soft_cross_entropy(logits: Tensor, target: Tensor) -> Tensor:
    """Batch-mean CE; ``target`` is class indices or a probability matrix (dummy labels)."""
    if target.dtype in (torch.int64, torch.int32):
        return F.cross_entropy(logits, target)
    return -(target * F.log_softmax(logits, dim=1)).sum(dim=1).mean()


def party_gradients(
    model: CafeVFL, xs: Sequence[Tensor], y: Tensor
) -> tuple[float, dict[str, dict[str, Tensor]]]:
    """Batch loss and each party's batch-averaged parameter gradients (what each party uploads).

    The split-learning exchange (workers send outputs, the label holder returns output gradients,
    workers backprop) gives exactly the autograd gradients of the joint loss, so this computes them
    in one pass.
    """
    mods = model.party_modules()
    names = [(party, n) for party, mod in mods.items() for n, _ in mod.named_parameters()]
    tensors = [p for mod in mods.values() for _, p in mod.named_parameters()]
    loss = soft_cross_entropy(model(xs), y)
    grads = torch.autograd.grad(loss, tensors)
    out: dict[str, dict[str, Tensor]] = {party: {} for party in mods}
    for (party, n), g in zip(names, grads, strict=True):
        out[party][n] = g.detach()
    return float(loss.detach()), out


def split_image_grid(images: Tensor, grid: tuple[int, int]) -> list[Tensor]:
    """Cut ``[N, C, H, W]`` images into ``rows x cols`` regions, row-major: worker m gets region m."""
    rows, cols = grid
    _, _, h, w = images.shape
    if h % rows or w % cols:
        raise ValueError(f"image size {h}x{w} is not divisible by grid {rows}x{cols}")
    rh, cw = h // rows, w // cols
    return [
        images[:, :, r * rh : (r + 1) * rh, c * cw : (c + 1) * cw].contiguous()
        for r in range(rows)
        for c in range(cols)
    ]


def merge_image_grid(regions: Sequence[Tensor], grid: tuple[int, int]) -> Tensor:
    """Inverse of ``split_image_grid``."""
    rows, cols = grid
    if len(regions) != rows * cols:
        raise ValueError(f"{len(regions)} regions do not fill a {rows}x{cols} grid")
    return torch.cat([torch.cat(list(regions[r * cols : (r + 1) * cols]), dim=3) for r in range(rows)], dim=2)


def grid_for(n_workers: int) -> tuple[int, int]:
    """The most square ``rows x cols`` grid with ``n_workers`` cells (4 -> 2x2 quadrants as in the paper)."""
    rows = max(r for r in range(1, int(n_workers**0.5) + 1) if n_workers % r == 0)
    return rows, n_workers // rows
