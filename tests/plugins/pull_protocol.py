"""A test plug-in protocol, `pull`, loaded through a config's `plugins:` list; it edits nothing in vflnet.

Its step order differs from split's: the active party drives the exchange. Per training step it pulls
every passive party's embeddings over the protocol's own service (``vflnet_plugin_test.Pull/Forward``),
runs the top model and the loss, and pushes each passive party its gradient (``Pull/Backward``), scaled
by the protocol's own setting ``protocol.params.gradient_scale``. A passive party does its work in those
handlers; its RunStep only checks the step. The coordinator side counts the steps it drove.

Written on the SDK alone (``vflnet.sdk``) and its own messages: the host checks each request's run
and sender, meters every message and answers errors with a status; nothing here touches gRPC.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from tests.plugins.vflnet_plugin_test import pull_pb2
from vflnet import sdk

SERVICE = pull_pb2.DESCRIPTOR.services_by_name["Pull"]
FORWARD = "/vflnet_plugin_test.Pull/Forward"
BACKWARD = "/vflnet_plugin_test.Pull/Backward"
sdk.register_messages(SERVICE)


class PullPassive(sdk.PartySide):
    def __init__(self, host: sdk.PartyContext) -> None:
        super().__init__(host)
        self.pending: dict[int, torch.Tensor] = {}  # step -> embeddings with their graph
        self.lock = threading.Lock()

    @sdk.handles(FORWARD, callers={"active"})
    def forward(self, req: pull_pb2.PullRequest, context: Any) -> pull_pb2.PullReply:
        host = self.host
        try:
            rows = host.data.rows(np.asarray(req.sample_ids, dtype=np.int64))
        except KeyError as exc:
            raise sdk.invalid(str(exc).strip('"')) from exc
        train = req.header.phase == sdk.TRAIN
        bottom = host.local.modules["bottom"]
        with self.lock:
            host.local.train(train)
            with torch.set_grad_enabled(train):
                emb = bottom(torch.from_numpy(host.data.x[rows]))
            if train:
                self.pending[req.header.step] = emb
        return pull_pb2.PullReply(header=host.header(req.header), values=sdk.to_proto(emb.detach()))

    @sdk.handles(BACKWARD, callers={"active"})
    def backward(self, req: pull_pb2.PushGradient, context: Any) -> pull_pb2.PushAck:
        with self.lock:
            emb = self.pending.pop(req.header.step, None)
            if emb is None:
                raise sdk.stale_step(f"no forward pass for step {req.header.step}")
            grad = sdk.from_proto(
                req.values, expect_dtype="float32", expect_shape=tuple(emb.shape), what="gradient"
            )
            emb.backward(torch.from_numpy(grad))
            self.host.local.apply_update()
        return pull_pb2.PushAck(header=self.host.header(req.header))

    def step(self, cmd: sdk.StepCommand, rows: np.ndarray) -> dict[str, float]:
        return {}  # the work happens when the active party pulls


class PullActive(sdk.PartySide):
    def joined(self, reply: sdk.JoinReply) -> None:
        address = {p.name: p.address for p in reply.roster}
        self.peers = {p.name: self.host.channel(address[p.name], p.name) for p in self.cfg.passives}

    def step(self, cmd: sdk.StepCommand, rows: np.ndarray) -> dict[str, float]:
        host, h = self.host, cmd.header
        train = h.phase == sdk.TRAIN
        request = pull_pb2.PullRequest(header=host.header(h), sample_ids=cmd.sample_ids)
        calls = {
            name: sdk.send(host, channel, name, FORWARD, request) for name, channel in self.peers.items()
        }
        received = {n: sdk.from_proto(c.result().values, expect_dtype="float32") for n, c in calls.items()}
        inputs = [torch.from_numpy(received[p.name]).requires_grad_(train) for p in self.cfg.passives]
        y = torch.from_numpy(host.data.y[rows])
        top = host.local.modules["top"]
        host.local.train(train)
        with torch.set_grad_enabled(train):
            logits = top(sdk.aggregate(inputs, self.cfg.protocol.aggregation))
            loss = torch.nn.functional.cross_entropy(logits, y)
        if train:
            loss.backward()
            scale = float(self.cfg.protocol.params["gradient_scale"])
            for p, t in zip(self.cfg.passives, inputs, strict=True):
                push = pull_pb2.PushGradient(header=host.header(h), values=sdk.to_proto(t.grad * scale))
                sdk.send(host, self.peers[p.name], p.name, BACKWARD, push).result()
            host.local.apply_update()
        correct = int((logits.argmax(1) == y).sum())
        return {"loss_sum": float(loss.detach()) * len(y), "correct": correct, "count": len(y)}


class PullCoordinator(sdk.CoordinatorSide):
    def __init__(self, host: sdk.CoordinatorContext) -> None:
        super().__init__(host)
        self.steps = 0

    def after_step(self, phase: int, reports: dict[str, sdk.StepReport]) -> None:
        self.steps += phase == sdk.TRAIN

    def finish(self) -> dict[str, Any]:
        return {"pull": {"train_steps": self.steps}}


@sdk.PROTOCOLS.register
class Pull(sdk.Protocol):
    name = "pull"
    settings = frozenset({"aggregation"})  # the shared protocol settings it reads
    description = "test plug-in: the active party pulls embeddings and pushes gradients over its own service"
    params = {
        "gradient_scale": sdk.Param(
            1.0,
            "factor on every pushed gradient",
            lambda v: isinstance(v, int | float) and v > 0,
            "a positive number",
        )
    }
    coordinator = PullCoordinator
    active = PullActive
    passive = PullPassive

    @classmethod
    def check_config(cls, cfg: Any) -> list[tuple[str, str]]:
        if cfg.active.bottom is not None:
            return [("parties", "the pull protocol has no active-party features")]
        return []
