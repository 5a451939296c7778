"""A test plug-in protocol, `pull`, loaded through a config's `plugins:` list; it edits nothing in vflnet.

Its step order differs from split's: the active party drives the exchange. Per training step it pulls
every passive party's embeddings over the protocol's own service (``vflnet_plugin_test.Pull/Forward``),
runs the top model and the loss, and pushes each passive party its gradient (``Pull/Backward``), scaled
by the protocol's own setting ``protocol.params.gradient_scale``. A passive party does its work in those
handlers; its RunStep only checks the step. The coordinator side counts the steps it drove.
"""

from __future__ import annotations

import threading
from typing import Any

import grpc
import numpy as np
import torch

from tests.plugins.vflnet_plugin_test import pull_pb2
from vflnet.models.zoo import aggregate
from vflnet.registry import Param
from vflnet.sdk.bridge import add_handlers, unary
from vflnet.sdk.contract import PROTOCOLS, CoordinatorSide, PartySide, Protocol, register_messages
from vflnet.v1 import messages_pb2
from vflnet.wire import tensors
from vflnet.wire.checks import check_run, check_sender
from vflnet.wire.errors import RpcFailure, describe_rpc_error

SERVICE = pull_pb2.DESCRIPTOR.services_by_name["Pull"]
FORWARD = "/vflnet_plugin_test.Pull/Forward"
BACKWARD = "/vflnet_plugin_test.Pull/Backward"
register_messages(SERVICE, {"Forward": {"active"}, "Backward": {"active"}})


class PullPassive(PartySide):
    def __init__(self, host: Any) -> None:
        super().__init__(host)
        self.pending: dict[int, torch.Tensor] = {}  # step -> embeddings with their graph
        self.lock = threading.Lock()

    def add_services(self, server: Any) -> None:
        add_handlers(server, {FORWARD: self.forward, BACKWARD: self.backward})

    def _check(self, h: messages_pb2.Header, context: Any) -> None:
        check_run(self.cfg, h.run_id)
        check_sender(self.cfg, h.sender, {"active"}, context)

    def forward(self, req: pull_pb2.PullRequest, context: Any) -> pull_pb2.PullReply:
        self._check(req.header, context)
        host = self.host
        try:
            rows = host.data.rows(np.asarray(req.sample_ids, dtype=np.int64))
        except KeyError as exc:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc).strip('"')) from exc
        train = req.header.phase == messages_pb2.TRAIN
        bottom = host.local.modules["bottom"]
        with self.lock:
            host.local.train(train)
            with torch.set_grad_enabled(train):
                emb = bottom(torch.from_numpy(host.data.x[rows]))
            if train:
                self.pending[req.header.step] = emb
        reply = pull_pb2.PullReply(header=host.header(req.header), values=tensors.to_proto(emb.detach()))
        host.meter.record("Forward.reply", reply)
        return reply

    def backward(self, req: pull_pb2.PushGradient, context: Any) -> pull_pb2.PushAck:
        self._check(req.header, context)
        with self.lock:
            emb = self.pending.pop(req.header.step, None)
            if emb is None:
                raise RpcFailure(
                    grpc.StatusCode.FAILED_PRECONDITION, f"no forward pass for step {req.header.step}"
                )
            grad = tensors.from_proto(
                req.values, expect_dtype="float32", expect_shape=tuple(emb.shape), what="gradient"
            )
            emb.backward(torch.from_numpy(grad))
            self.host.local.apply_update()
        return pull_pb2.PushAck(header=self.host.header(req.header))

    def step(self, cmd: messages_pb2.StepCommand, rows: np.ndarray) -> dict[str, float]:
        return {}  # the work happens when the active party pulls


class PullActive(PartySide):
    def joined(self, reply: messages_pb2.JoinReply) -> None:
        address = {p.name: p.address for p in reply.roster}
        self.peers = {p.name: self.host.channel(address[p.name], p.name) for p in self.cfg.passives}

    def step(self, cmd: messages_pb2.StepCommand, rows: np.ndarray) -> dict[str, float]:
        host, h = self.host, cmd.header
        timeout = self.cfg.transport.rpc_timeout_s
        train = h.phase == messages_pb2.TRAIN
        request = pull_pb2.PullRequest(header=host.header(h), sample_ids=cmd.sample_ids)
        calls = {}
        for name, channel in self.peers.items():
            host.meter.record("Forward", request)
            calls[name] = unary(channel, FORWARD).future(request, timeout=timeout)
        try:
            received = {
                n: tensors.from_proto(c.result().values, expect_dtype="float32") for n, c in calls.items()
            }
        except grpc.RpcError as exc:
            raise RpcFailure(grpc.StatusCode.ABORTED, f"pull failed: {describe_rpc_error(exc)}") from exc
        inputs = [torch.from_numpy(received[p.name]).requires_grad_(train) for p in self.cfg.passives]
        y = torch.from_numpy(host.data.y[rows])
        top = host.local.modules["top"]
        host.local.train(train)
        with torch.set_grad_enabled(train):
            logits = top(aggregate(inputs, self.cfg.protocol.aggregation))
            loss = torch.nn.functional.cross_entropy(logits, y)
        if train:
            loss.backward()
            scale = float(self.cfg.protocol.params["gradient_scale"])
            for p, t in zip(self.cfg.passives, inputs, strict=True):
                push = pull_pb2.PushGradient(header=host.header(h), values=tensors.to_proto(t.grad * scale))
                host.meter.record("Backward", push)
                unary(self.peers[p.name], BACKWARD)(push, timeout=timeout)
            host.local.apply_update()
        correct = int((logits.argmax(1) == y).sum())
        return {"loss_sum": float(loss.detach()) * len(y), "correct": correct, "count": len(y)}


class PullCoordinator(CoordinatorSide):
    def __init__(self, host: Any) -> None:
        super().__init__(host)
        self.steps = 0

    def after_step(self, phase: int, reports: dict[str, messages_pb2.StepReport]) -> None:
        self.steps += phase == messages_pb2.TRAIN

    def finish(self) -> dict[str, Any]:
        return {"pull": {"train_steps": self.steps}}


@PROTOCOLS.register
class Pull(Protocol):
    name = "pull"
    description = "test plug-in: the active party pulls embeddings and pushes gradients over its own service"
    params = {
        "gradient_scale": Param(
            1.0,
            "factor on every pushed gradient",
            lambda v: isinstance(v, int | float) and v > 0,
            "a positive number",
        )
    }
    coordinator = PullCoordinator
    active = PullActive
    passive = PullPassive
    methods = frozenset({FORWARD, BACKWARD})

    @classmethod
    def check_config(cls, cfg: Any) -> list[tuple[str, str]]:
        if cfg.active.bottom is not None:
            return [("parties", "the pull protocol has no active-party features")]
        return []
