"""One party's trainable state: its modules, optimizer, LR schedule and update counter."""

from __future__ import annotations

import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vflnet.config import LRScheduleConfig, OptimizerConfig
from vflnet.durable import write_durable
from vflnet.models.optim import build_optimizer, build_schedule


@dataclass
class LocalModel:
    """The modules one party trains, its optimizer and LR schedule, and its update counter."""

    modules: dict[str, nn.Module]
    optimizer_cfg: OptimizerConfig
    schedule_cfg: LRScheduleConfig
    version: int = 0  # optimizer updates applied: the `model_version` in message headers
    epoch: int = 0
    own_optimizer: bool = (
        True  # False: another party (param-server: the coordinator) holds parameters and optimizer
    )
    keep_last_grads: bool = (
        False  # keep a copy of each step's gradients (for an attack granted the party's own view)
    )
    last_grads: dict[str, torch.Tensor] = field(default_factory=dict)
    optimizer: torch.optim.Optimizer | None = field(init=False)
    device: torch.device = field(init=False)
    schedule: Any = field(init=False)
    _parts: list[nn.Module] = field(init=False, repr=False)  # every module and submodule, for ``train``

    def __post_init__(self) -> None:
        # An active party with no features and no top model ("sum" of passive logits) has no parameters.
        params = [p for m in self.modules.values() for p in m.parameters()]
        # where the modules are (`train.device`, moved there before): inputs go there, outputs come back
        self.device = params[0].device if params else torch.device("cpu")
        self.optimizer = (
            build_optimizer(params, self.optimizer_cfg) if params and self.own_optimizer else None
        )
        self.schedule = build_schedule(self.optimizer, self.schedule_cfg) if self.optimizer else None
        self._parts = [part for m in self.modules.values() for part in m.modules()]

    def enter_epoch(self, epoch: int) -> None:
        """Advance the LR schedule once per epoch boundary the coordinator announces."""
        while self.epoch < epoch:
            self.epoch += 1
            if self.schedule is not None:
                self.schedule.step()

    def apply_update(self) -> None:
        """Step the optimizer (without one, the gradients stay for ``take_grads``)."""
        if self.keep_last_grads:
            self.last_grads = {
                n: p.grad.detach().clone() for n, p in self.named_parameters() if p.grad is not None
            }
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
                    raise ValueError(
                        f"broadcast parameter {name} has shape {values[name].shape}, expected {tuple(p.shape)}"
                    )
                p.copy_(torch.from_numpy(values[name]))

    def take_grads(self) -> dict[str, np.ndarray]:
        """The batch-averaged parameter gradients of the last step (param-server upload), then cleared."""
        out = {}
        for name, p in self.named_parameters():
            out[name] = (
                p.grad.detach().cpu().numpy().copy()
                if p.grad is not None
                else np.zeros(tuple(p.shape), np.float32)
            )
            p.grad = None
        return out

    def train(self, mode: bool) -> None:
        """Every module in training (or evaluation) mode. Nothing to do when each one and each of
        their parts is already: the case of every step but a phase's first, where ``Module.train``
        would walk and set them all again."""
        if all(m.training == mode for m in self._parts):
            return
        for m in self.modules.values():
            m.train(mode)

    def state(self) -> dict[str, Any]:
        return {
            "modules": {k: m.state_dict() for k, m in self.modules.items()},
            "optimizer": self.optimizer.state_dict() if self.optimizer else None,
            "schedule": self.schedule.state_dict() if self.schedule else None,
            "version": self.version,
            "epoch": self.epoch,
            "generators": {name: g.get_state() for name, g in self.generators().items()},
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Continue from ``state()`` of the same model (a resumed run)."""
        for key, module in self.modules.items():
            module.load_state_dict(state["modules"][key])
        if self.optimizer is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        if self.schedule is not None:
            self.schedule.load_state_dict(state["schedule"])
        self.version, self.epoch = int(state["version"]), int(state["epoch"])
        saved = state.get("generators", {})
        for name, generator in self.generators().items():
            if name not in saved:
                raise ValueError(
                    f"the checkpoint holds no state of {name}'s generator (written by an older vflnet)"
                )
            generator.set_state(saved[name])

    def generators(self) -> dict[str, torch.Generator]:
        """The model parts' own generators (dropout, random shifts: vflnet/models/zoo.py), by path."""
        return {
            f"{key}.{name}" if name else key: part.generator
            for key, module in self.modules.items()
            for name, part in module.named_modules()
            if isinstance(getattr(part, "generator", None), torch.Generator)
        }

    def save(self, path: Path) -> None:
        """Atomic: a crash mid-write never leaves a truncated checkpoint."""
        buf = io.BytesIO()
        torch.save(self.state(), buf)
        write_durable(path, buf.getvalue(), "the final model")
