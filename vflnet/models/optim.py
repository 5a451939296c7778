"""Optimizer and LR schedule from config; each party builds its own over its own parameters."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from vflnet.config import LRScheduleConfig, OptimizerConfig


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimizerConfig) -> torch.optim.Optimizer:
    params = list(params)
    if cfg.kind == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    if cfg.kind == "momentum":
        return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    if cfg.kind == "adam":
        return torch.optim.Adam(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay)  # type: ignore[arg-type]
    raise ValueError(f"unknown optimizer {cfg.kind!r}")


def build_schedule(
    optimizer: torch.optim.Optimizer, cfg: LRScheduleConfig
) -> torch.optim.lr_scheduler.LRScheduler | None:
    """Stepped once per epoch by the party when the coordinator starts a new epoch."""
    if cfg.kind == "none":
        return None
    return torch.optim.lr_scheduler.StepLR(optimizer, step_size=cfg.step_size, gamma=cfg.gamma)
