"""The parameter-server protocol (paper 002's setting), the coordinator's side.

The coordinator holds every party's parameters and optimizer. Each step it broadcasts each party's
parameters with the batch IDs; the parties run the split exchange among themselves and upload
their batch-averaged parameter gradients instead of updating; the coordinator applies the
optimizer, or in `static` mode keeps the parameters fixed (CAFE's strongest setting). Parameters and
gradients are thus the honest-but-curious server's legitimate view.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from vflnet.config import Config
from vflnet.models.optim import build_optimizer, build_schedule
from vflnet.v1 import tensor_pb2
from vflnet.wire import tensors


def to_tensor_map(values: dict[str, np.ndarray]) -> tensor_pb2.TensorMap:
    out = tensor_pb2.TensorMap()
    for name, value in values.items():
        out.tensors[name].CopyFrom(tensors.to_proto(value))
    return out


def from_tensor_map(msg: tensor_pb2.TensorMap, what: str) -> dict[str, np.ndarray]:
    return {name: tensors.from_proto(t, expect_dtype="float32", what=f"{what} {name}") for name, t in msg.tensors.items()}


class ParamServer:
    def __init__(self, cfg: Config, initial: dict[str, dict[str, np.ndarray]]) -> None:
        self.static = cfg.protocol.static
        self.params = {party: {n: torch.nn.Parameter(torch.from_numpy(v.copy())) for n, v in named.items()}
                       for party, named in initial.items()}
        self.optimizers = {}
        self.schedules = {}
        for party, named in self.params.items():
            if named:
                opt = build_optimizer(named.values(), cfg.train.optimizer)
                self.optimizers[party] = opt
                self.schedules[party] = build_schedule(opt, cfg.train.lr_schedule)
        self.epoch = 0
        self.updates = 0

    def broadcast(self, party: str) -> tensor_pb2.TensorMap:
        return to_tensor_map({n: p.detach().numpy() for n, p in self.params[party].items()})

    def enter_epoch(self, epoch: int) -> None:
        while self.epoch < epoch:
            self.epoch += 1
            for schedule in self.schedules.values():
                if schedule is not None:
                    schedule.step()

    def apply(self, uploads: dict[str, dict[str, np.ndarray]]) -> None:
        """One optimizer step from every party's uploaded gradients (nothing in static mode)."""
        for party, grads in uploads.items():
            own = self.params[party]
            if set(grads) != set(own):
                raise ValueError(f"{party} uploaded gradients for {sorted(grads)}, expected {sorted(own)}")
            for name, p in own.items():
                if grads[name].shape != tuple(p.shape):
                    raise ValueError(f"{party} gradient {name} has shape {grads[name].shape}, expected {tuple(p.shape)}")
                p.grad = torch.from_numpy(grads[name])
        if not self.static:
            for opt in self.optimizers.values():
                opt.step()
            self.updates += 1
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)

    def save(self, path: Path) -> None:
        tmp = path.with_suffix(".tmp")
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({party: {n: p.detach().clone() for n, p in named.items()} for party, named in self.params.items()}, tmp)
        os.replace(tmp, path)
