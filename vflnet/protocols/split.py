"""Plaintext split learning, per role, with no transport in sight.

Passive: ``forward`` its bottom model on the batch, keep the graph, later ``backward`` the gradient
the active party returned and step its optimizer. Active: aggregate its own embedding (if any) with
the received ones, run the top model and the loss, step its optimizer, and return the gradient of
the loss w.r.t. each received embedding.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from vflnet.config import LRScheduleConfig, OptimizerConfig
from vflnet.defenses.label_defenses import LabelDefense, soft_cross_entropy
from vflnet.models.optim import build_optimizer, build_schedule
from vflnet.models.zoo import TopModel, aggregate


@dataclass
class LocalModel:
    """The modules one party trains, its optimizer and LR schedule, and its update counter."""

    modules: dict[str, nn.Module]
    optimizer_cfg: OptimizerConfig
    schedule_cfg: LRScheduleConfig
    version: int = 0  # optimizer updates applied: the `model_version` in message headers
    epoch: int = 0
    central: bool = False  # param-server: the coordinator owns parameters and optimizer; this party uploads gradients
    keep_last_grads: bool = False  # keep a copy of each step's gradients (for an attack granted the party's own view)
    last_grads: dict[str, torch.Tensor] = field(default_factory=dict)
    optimizer: torch.optim.Optimizer | None = field(init=False)
    schedule: Any = field(init=False)

    def __post_init__(self) -> None:
        # An active party with no features and no top model ("sum" of passive logits) has no parameters.
        params = [p for m in self.modules.values() for p in m.parameters()]
        self.optimizer = build_optimizer(params, self.optimizer_cfg) if params and not self.central else None
        self.schedule = build_schedule(self.optimizer, self.schedule_cfg) if self.optimizer else None

    def enter_epoch(self, epoch: int) -> None:
        """Advance the LR schedule once per epoch boundary the coordinator announces."""
        while self.epoch < epoch:
            self.epoch += 1
            if self.schedule is not None:
                self.schedule.step()

    def apply_update(self) -> None:
        """Step the optimizer; in param-server mode keep the gradients for the upload instead."""
        if self.keep_last_grads:
            self.last_grads = {n: p.grad.detach().clone() for n, p in self.named_parameters() if p.grad is not None}
        if self.optimizer is not None:
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.version += 1

    def named_parameters(self) -> list[tuple[str, nn.Parameter]]:
        return [(f"{key}.{name}", p) for key, m in self.modules.items() for name, p in m.named_parameters()]

    def load_params(self, values: dict[str, np.ndarray]) -> None:
        """Take the parameters the coordinator broadcast (param-server); names and shapes must match."""
        own = dict(self.named_parameters())
        if set(values) != set(own):
            raise ValueError(f"broadcast parameters {sorted(values)} do not match this party's {sorted(own)}")
        with torch.no_grad():
            for name, p in own.items():
                if tuple(values[name].shape) != tuple(p.shape):
                    raise ValueError(f"broadcast parameter {name} has shape {values[name].shape}, expected {tuple(p.shape)}")
                p.copy_(torch.from_numpy(values[name]))

    def take_grads(self) -> dict[str, np.ndarray]:
        """The batch-averaged parameter gradients of the last step (param-server upload), then cleared."""
        out = {}
        for name, p in self.named_parameters():
            out[name] = p.grad.detach().numpy().copy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32)
            p.grad = None
        return out

    def train(self, mode: bool) -> None:
        for m in self.modules.values():
            m.train(mode)

    def state(self) -> dict[str, Any]:
        return {
            "modules": {k: m.state_dict() for k, m in self.modules.items()},
            "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "version": self.version,
            "epoch": self.epoch,
        }

    def save(self, path: Path) -> None:
        """Atomic: a crash mid-write never leaves a truncated checkpoint."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(self.state(), tmp)
        os.replace(tmp, path)


class PassiveSplit:
    def __init__(self, local: LocalModel) -> None:
        self.local = local
        self.bottom = local.modules["bottom"]
        self._pending: torch.Tensor | None = None

    def forward(self, x: np.ndarray, train: bool) -> np.ndarray:
        self.local.train(train)
        with torch.set_grad_enabled(train):
            emb = self.bottom(torch.from_numpy(x))
        self._pending = emb if train else None
        return emb.detach().numpy()

    def backward(self, grad: np.ndarray) -> None:
        if self._pending is None:
            raise RuntimeError("backward without a training forward pass")
        emb, self._pending = self._pending, None
        emb.backward(torch.from_numpy(grad))
        self.local.apply_update()


@dataclass
class StepResult:
    grads: list[np.ndarray]  # one per received embedding, same order
    loss_sum: float
    correct: int
    count: int
    logits: np.ndarray


def label_loss(logits: torch.Tensor, target: torch.Tensor, defense: LabelDefense | None) -> torch.Tensor:
    """Cross-entropy, against the defense's training targets when it has its own (CAE's soft labels)."""
    if defense is None:
        return F.cross_entropy(logits, target)
    return soft_cross_entropy(logits, defense.train_targets(target))


def predict(logits: torch.Tensor, defense: LabelDefense | None) -> torch.Tensor:
    return logits.argmax(dim=1) if defense is None else defense.predict(logits)


class ActiveSplit:
    def __init__(self, local: LocalModel, aggregation: str, defense: LabelDefense | None = None) -> None:
        self.local = local
        self.defense = defense
        self.bottom: nn.Module | None = local.modules.get("bottom")
        self.top: TopModel = local.modules["top"]  # type: ignore[assignment]
        self.aggregation = aggregation

    def step(self, x_own: np.ndarray | None, received: list[np.ndarray], y: np.ndarray, train: bool) -> StepResult:
        self.local.train(train)
        with torch.set_grad_enabled(train):
            inputs = [torch.from_numpy(e).requires_grad_(train) for e in received]
            parts = list(inputs)
            if self.bottom is not None:
                assert x_own is not None
                parts.insert(0, self.bottom(torch.from_numpy(x_own)))
            logits = self.top(aggregate(parts, self.aggregation))
            target = torch.from_numpy(y)
            loss = label_loss(logits, target, self.defense)
            if train:
                loss.backward()
                grads = [self._outgoing(t.grad, target) for t in inputs]
                self.local.apply_update()
            else:
                grads = []
        correct = int((predict(logits.detach(), self.defense) == target).sum())
        return StepResult(grads, float(loss.detach()) * len(y), correct, len(y), logits.detach().numpy())

    def _outgoing(self, grad: torch.Tensor | None, target: torch.Tensor) -> np.ndarray:
        """The gradient as it leaves this party: after the defense's transform, if any."""
        assert grad is not None
        if self.defense is not None:
            grad = self.defense.transform(grad, target).to(torch.float32)
        return grad.numpy()
