"""In-process stand-in for the param-server protocol, and the ground-truth scorer for CAFE.

``observation_stream`` plays the coordinator and the parties in one process: it schedules uniform
random batches, lets every party compute its batch-averaged gradient upload (optionally through that
party's outgoing defense), yields the server's view, and, in training mode, applies the uploads with
the server's optimizer before the next broadcast. Unit tests and ``reproduce`` use it; the real runtime
produces the same ``ServerObservation`` records from the wire.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from vflnet.attacks.cafe import CafeResult, ServerObservation
from vflnet.metrics.images import label_accuracy, mse, psnr
from vflnet.models.cafe_net import CafeVFL, merge_image_grid, party_gradients, party_parameters

GradTransform = Callable[[dict[str, Tensor]], dict[str, Tensor]]


@dataclass
class StreamLog:
    """Training-side record of a stream (not part of the attacker's view): loss per iteration."""

    losses: list[float]


def observation_stream(
    model: CafeVFL,
    regions: Sequence[Tensor],
    labels: Tensor,
    batch_size: int,
    iterations: int,
    seed: int = 0,
    train_lr: float = 0.0,
    optimizer: str = "adam",
    defenses: Mapping[str, GradTransform] | None = None,
    log: StreamLog | None = None,
) -> Iterator[ServerObservation]:
    """Yield ``iterations`` server observations; ``train_lr = 0`` is the static (unchanged Theta) setting."""
    n = labels.shape[0]
    if not 0 < batch_size <= n:
        raise ValueError(f"batch_size must be in [1, {n}], got {batch_size}")
    if train_lr < 0:
        raise ValueError(f"train_lr must be >= 0, got {train_lr}")
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    rng = np.random.default_rng(seed)
    mods = model.party_modules()
    opt: torch.optim.Optimizer | None = None
    if train_lr > 0:
        cls = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
        opt = cls(model.parameters(), lr=train_lr)
    for t in range(iterations):
        ids = np.sort(rng.choice(n, size=batch_size, replace=False))
        rows = torch.as_tensor(ids)
        loss, grads = party_gradients(model, [r[rows] for r in regions], labels[rows])
        if defenses:
            grads = {p: (defenses[p](g) if p in defenses else g) for p, g in grads.items()}
        if log is not None:
            log.losses.append(loss)
        yield ServerObservation(iteration=t, batch_ids=ids, params=party_parameters(model), grads=grads)
        if opt is not None:
            for party, mod in mods.items():
                for name, p in mod.named_parameters():
                    p.grad = grads[party][name].clone()
            opt.step()


def score_recovery(
    result: CafeResult, true_regions: Sequence[Tensor], true_labels: Tensor, grid: tuple[int, int]
) -> dict[str, float]:
    """Score the attacker's output against ground truth: PSNR/MSE over all N images, label accuracy."""
    real = merge_image_grid(true_regions, grid)
    fake = merge_image_grid(result.regions, grid)
    return {
        "psnr": psnr(real, fake),
        "mse": mse(real, fake),
        "label_acc": label_accuracy(result.labels, true_labels),
        "seen": float(result.seen.mean()),
    }
