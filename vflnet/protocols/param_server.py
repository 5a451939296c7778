"""The parameter-server protocol (paper 002's setting), the coordinator's side.

The coordinator holds every party's parameters and optimizer. Each step it broadcasts each party's
parameters with the batch IDs; the parties run the split exchange among themselves and upload
their batch-averaged parameter gradients instead of updating; the coordinator applies the
optimizer, or in `static` mode keeps the parameters fixed (CAFE's strongest setting). Parameters and
gradients are thus the honest-but-curious server's legitimate view.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vflnet.config import Config
from vflnet.defenses.base import attach
from vflnet.durable import write_durable
from vflnet.models.local import LocalModel
from vflnet.models.optim import build_optimizer, build_schedule
from vflnet.protocols.split import SPLIT_HOOKS, SplitActive, SplitPassive
from vflnet.sdk import PROTOCOLS, CoordinatorSide, Param, Protocol, RunFailed, invalid
from vflnet.v1 import messages_pb2, tensor_pb2
from vflnet.wire.tensors import from_tensor_map, to_tensor_map


class ParamServer:
    """Every party's parameters and optimizer, held by the coordinator."""

    def __init__(self, cfg: Config, initial: dict[str, dict[str, np.ndarray]]) -> None:
        self.static = cfg.protocol.params["static"]
        # sorted: a TensorMap has no order, and optimizer state (saved in checkpoints) is by position
        self.params = {
            party: {n: torch.nn.Parameter(torch.from_numpy(v.copy())) for n, v in sorted(named.items())}
            for party, named in sorted(initial.items())
        }
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
                    raise ValueError(
                        f"{party} gradient {name} has shape {grads[name].shape}, expected {tuple(p.shape)}"
                    )
                p.grad = torch.from_numpy(grads[name])
        if not self.static:
            for opt in self.optimizers.values():
                opt.step()
            self.updates += 1
        for opt in self.optimizers.values():
            opt.zero_grad(set_to_none=True)

    def state_dict(self) -> dict[str, Any]:
        return {
            "params": {
                party: {n: p.detach().clone() for n, p in named.items()}
                for party, named in self.params.items()
            },
            "optimizers": {party: opt.state_dict() for party, opt in self.optimizers.items()},
            "schedules": {party: s.state_dict() for party, s in self.schedules.items() if s is not None},
            "epoch": self.epoch,
            "updates": self.updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with torch.no_grad():
            for party, named in self.params.items():
                for n, p in named.items():
                    p.copy_(state["params"][party][n])
        for party, opt in self.optimizers.items():
            opt.load_state_dict(state["optimizers"][party])
        for party, schedule in self.schedules.items():
            if schedule is not None:
                schedule.load_state_dict(state["schedules"][party])
        self.epoch, self.updates = int(state["epoch"]), int(state["updates"])

    def save(self, path: Path) -> None:
        buf = io.BytesIO()
        torch.save(self.state_dict()["params"], buf)
        write_durable(path, buf.getvalue(), "the final model")


class ParamServerCoordinator(CoordinatorSide):
    def start(self, joined: dict[str, messages_pb2.JoinRequest]) -> None:
        initial = {n: from_tensor_map(r.protocol.tensors, f"{n}'s parameter") for n, r in joined.items()}
        self.server = ParamServer(self.cfg, initial)

    def command(self, party: str, cmd: messages_pb2.StepCommand) -> messages_pb2.StepCommand:
        """Every step carries each party's current parameters."""
        self.server.enter_epoch(cmd.header.epoch)
        out = messages_pb2.StepCommand()
        out.CopyFrom(cmd)
        out.protocol.tensors.CopyFrom(self.server.broadcast(party))
        return out

    def after_step(self, phase: int, reports: dict[str, messages_pb2.StepReport]) -> None:
        if phase != messages_pb2.TRAIN:
            return
        try:
            self.server.apply(
                {
                    name: from_tensor_map(r.protocol.tensors, f"{name}'s gradient")
                    for name, r in reports.items()
                }
            )
        except ValueError as exc:
            raise RunFailed(f"bad gradient upload: {exc}") from exc

    @property
    def model_version(self) -> int:
        return self.server.updates if hasattr(self, "server") else 0

    def state_dict(self) -> dict[str, Any]:
        return self.server.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.server.load_state_dict(state)

    def finish(self) -> dict[str, Any]:
        if self.host.run_dir is not None:
            self.server.save(self.host.run_dir / "checkpoints" / "param-server.pt")
        return {"param_server": {"updates": self.server.updates, "static": self.server.static}}


class CentralParams:
    """A party side whose parameters and optimizer the coordinator holds: it joins with its initial
    parameters, loads the broadcast ones each step and uploads its gradients (after its upload
    defenses: fake gradients, DP) instead of updating."""

    host: Any
    cfg: Config

    def make_local(self, modules: dict[str, Any]) -> LocalModel:
        self.upload_defenses = attach(self.cfg, self.host.name, "upload")
        return LocalModel(modules, self.cfg.train.optimizer, self.cfg.train.lr_schedule, own_optimizer=False)

    def join_request(self, req: messages_pb2.JoinRequest) -> None:
        req.protocol.tensors.CopyFrom(
            to_tensor_map({n: p.detach().numpy() for n, p in self.host.local.named_parameters()})
        )

    def step(self, cmd: messages_pb2.StepCommand, rows: np.ndarray) -> dict[str, float]:
        try:
            self.host.local.load_params(from_tensor_map(cmd.protocol.tensors, "broadcast parameter"))
        except ValueError as exc:
            raise invalid(str(exc)) from exc
        return super().step(cmd, rows)  # type: ignore[misc]

    def report(self, cmd: messages_pb2.StepCommand, report: messages_pb2.StepReport) -> None:
        if cmd.header.phase != messages_pb2.TRAIN:
            return
        grads = self.host.local.take_grads()
        for transform in self.upload_defenses:
            grads = transform(grads)
        report.protocol.tensors.CopyFrom(to_tensor_map(grads))


class ParamServerPassive(CentralParams, SplitPassive):
    pass


class ParamServerActive(CentralParams, SplitActive):
    pass


@PROTOCOLS.register
class ParamServerProtocol(Protocol):
    trains_on_device = True
    name = "param-server"
    settings = frozenset({"aggregation"})
    provides = frozenset({"architecture"})  # the coordinator holds every party's parameters
    params = {
        "static": Param(
            False,
            "the coordinator never applies updates (CAFE's strongest setting)",
            lambda v: isinstance(v, bool),
            "true or false",
        )
    }
    description = "paper 002's setting: the coordinator broadcasts parameters and applies the uploaded gradients (or keeps them static)"
    coordinator = ParamServerCoordinator
    active = ParamServerActive
    passive = ParamServerPassive
    defense_hooks = SPLIT_HOOKS | {"upload"}  # CentralParams: the upload defenses
