"""The active party: labels, optionally its own features, and the top model. For each step it
collects every passive party's embeddings, runs the top model and the loss, and answers each
passive party with the gradient w.r.t. its own embeddings."""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import torch

from vflnet.config import Config
from vflnet.crypto.wire import cipher_to_proto
from vflnet.data.partition import party_seed
from vflnet.defenses.label_defenses import LabelDefense
from vflnet.protocols.split import ActiveSplit, StepResult, predict
from vflnet.protocols.split_he import ActiveHE
from vflnet.registry import DEFENSES
from vflnet.roles.common import check_run, check_sender, header, wait_for
from vflnet.roles.party import PartyBase
from vflnet.roles.serve import serve_party
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.wire import tensors
from vflnet.wire.channels import MessageTooLarge, check_message_size
from vflnet.wire.ciphers import cipher_from_proto_checked
from vflnet.wire.errors import RpcFailure, invalid, servicer_method, stale_step

log = logging.getLogger("vflnet.active")


@dataclass
class StepSlot:
    """Everything the active party gathers for one step, whichever message arrives first."""

    step: int
    command: messages_pb2.StepCommand | None = None
    embeddings: dict[str, tuple[np.ndarray, Any]] = field(default_factory=dict)  # sender -> (ids, values or CipherArray)
    result: StepResult | None = None
    encrypted_grad: Any = None  # split-he: one fresh encryption of g, shared by every passive party's reply
    replies: dict[str, messages_pb2.EmbeddingGradients] = field(default_factory=dict)  # sender -> its answer
    error: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


class ActiveParty(PartyBase):
    def __init__(self, cfg: Config, name: str, run_dir: Path) -> None:
        super().__init__(cfg, name, run_dir)
        self.passives = [p.name for p in cfg.passives]
        self.embedding_dims = {p.name: p.bottom.out for p in cfg.passives if p.bottom is not None}
        self.cond = threading.Condition()
        self.slots: dict[int, StepSlot] = {}
        self.completed_step = 0
        self.test_predictions: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}  # eval epoch -> (ids, predicted class)

    def build_protocol(self) -> None:
        assert self.local is not None
        he = self.cfg.protocol.he
        defense = self._defense()
        if self.cfg.protocol.kind == "split-he":
            assert self.public_key is not None
            self.protocol: ActiveSplit | ActiveHE = ActiveHE(self.local, self.public_key, he.frac_bits, self.decrypt, he.workers, defense)
        else:
            self.protocol = ActiveSplit(self.local, self.cfg.protocol.aggregation, defense)

    def _defense(self) -> LabelDefense | None:
        entries = [d for d in self.cfg.defenses if d.party == self.name and DEFENSES.get(d.name).acts_on == "labels"]
        if not entries:
            return None
        if len(entries) > 1:
            raise ValueError(f"{self.name}: one label defense at a time, got {[d.name for d in entries]}")
        entry = entries[0]
        built = DEFENSES.get(entry.name)(**entry.params).build(self.data.n_classes, party_seed(self.cfg, self.me))
        log.info("%s defends with %s (%s)", self.name, entry.name, entry.params)
        return built

    def add_services(self, server: grpc.Server) -> None:
        services_pb2_grpc.add_ActiveServicer_to_server(ActiveServicer(self), server)

    def _slot(self, step: int) -> StepSlot:
        if step <= self.completed_step:
            raise stale_step(f"step {step} is not current: step {self.completed_step} is already done")
        if step not in self.slots:
            self.slots[step] = StepSlot(step)
        return self.slots[step]

    # ------------------------------------------------------------------ passive -> active
    def receive(self, msg: messages_pb2.Embeddings, context: grpc.ServicerContext | None) -> messages_pb2.EmbeddingGradients:
        h = msg.header
        check_run(self.cfg, h.run_id)
        check_sender(self.cfg, h.sender, {"passive"}, context)
        ids = np.asarray(msg.sample_ids, dtype=np.int64)
        expect = (len(ids), self.embedding_dims[h.sender])
        what = f"embeddings from {h.sender}"
        if self.cfg.protocol.kind == "split-he":
            if msg.WhichOneof("payload") != "cipher":
                raise invalid(f"split-he expects encrypted embeddings, got {msg.WhichOneof('payload')}")
            wait_for(self.ready, self.cfg.transport.rpc_timeout_s, "the run's public key")
            assert self.public_key is not None
            values: Any = cipher_from_proto_checked(msg.cipher, self.public_key, expect, what)
        else:
            if msg.WhichOneof("payload") != "values":
                raise invalid(f"split protocol expects plaintext embeddings, got {msg.WhichOneof('payload')}")
            values = tensors.from_proto(msg.values, expect_dtype="float32", expect_shape=expect, what=what)
        with self.cond:
            slot = self._slot(h.step)
            if h.sender in slot.embeddings:
                raise RpcFailure(grpc.StatusCode.ALREADY_EXISTS, f"{h.sender} already sent embeddings for step {h.step}")
            if slot.command is not None and not np.array_equal(ids, slot.command.sample_ids):
                raise invalid(f"{h.sender} sent embeddings for other sample ids than step {h.step} schedules")
            slot.embeddings[h.sender] = (ids, values)
            self.cond.notify_all()
        if not slot.done.wait(self.cfg.transport.rpc_timeout_s):
            raise TimeoutError(f"step {h.step} did not complete within {self.cfg.transport.rpc_timeout_s:.0f} s")
        if slot.error is not None:
            raise RpcFailure(grpc.StatusCode.ABORTED, f"step {h.step} failed at the active party: {slot.error}")
        return slot.replies[h.sender]

    # -------------------------------------------------------------- coordinator -> active
    def run_step(self, cmd: messages_pb2.StepCommand) -> messages_pb2.StepReport:
        with self.step_lock:
            rows = self.begin_step(cmd)
            step = cmd.header.step
            deadline = time.monotonic() + self.cfg.transport.rpc_timeout_s
            with self.cond:
                slot = self._slot(step)
                slot.command = cmd
                for sender, (ids, _) in slot.embeddings.items():
                    if not np.array_equal(ids, cmd.sample_ids):
                        self._fail(slot, f"{sender} sent embeddings for other sample ids than step {step} schedules")
                while slot.error is None and len(slot.embeddings) < len(self.passives):
                    if not self.cond.wait(timeout=max(0.0, deadline - time.monotonic())):
                        missing = [p for p in self.passives if p not in slot.embeddings]
                        self._fail(slot, f"no embeddings from {', '.join(missing)} within {self.cfg.transport.rpc_timeout_s:.0f} s")
            if slot.error is not None:
                raise RpcFailure(grpc.StatusCode.ABORTED, slot.error)
            start = time.perf_counter()
            train = cmd.header.phase == messages_pb2.TRAIN
            assert self.data.y is not None
            x_own = self.data.x[rows] if self.data.x is not None else None
            received = [slot.embeddings[p][1] for p in self.passives]
            try:
                if isinstance(self.protocol, ActiveHE):
                    grad, slot.result = self.protocol.step(x_own, received, self.data.y[rows], train)
                    if grad is not None:  # every passive party receives the same dL/dH
                        slot.encrypted_grad = cipher_to_proto(grad, workers=self.cfg.protocol.he.workers)
                else:
                    slot.result = self.protocol.step(x_own, received, self.data.y[rows], train)
            except Exception as exc:  # a failed step must release the waiting passive calls
                self._fail(slot, f"{type(exc).__name__}: {exc}")
                raise
            try:
                self._build_replies(slot, cmd.header)
            except MessageTooLarge as exc:  # release the waiting passive calls with the reason
                self._fail(slot, str(exc))
                raise
            with self.cond:
                self.completed_step = step
                del self.slots[step]
                slot.done.set()
            r = slot.result
            if not train:
                self._record_predictions(cmd, r)
            return self.end_step(cmd, {"loss_sum": r.loss_sum, "correct": r.correct, "count": r.count,
                                       "compute_s": time.perf_counter() - start})

    def _build_replies(self, slot: StepSlot, h: messages_pb2.Header) -> None:
        """Every passive party's answer, built and metered before the step completes, so the bytes
        count in this step's report."""
        assert slot.result is not None and self.local is not None
        for index, sender in enumerate(self.passives):
            reply = messages_pb2.EmbeddingGradients(
                header=header(self.cfg, self.name, h.step, h.epoch, h.batch_id, h.phase, self.local.version)
            )
            if h.phase == messages_pb2.TRAIN:
                if slot.encrypted_grad is not None:
                    reply.cipher.CopyFrom(slot.encrypted_grad)
                else:
                    reply.values.CopyFrom(tensors.to_proto(slot.result.grads[index]))
            check_message_size(reply, self.cfg.transport, f"{self.name}'s gradients for {sender} at step {h.step}")
            self.meter.record("ExchangeEmbeddings.reply", reply)
            slot.replies[sender] = reply

    def _record_predictions(self, cmd: messages_pb2.StepCommand, result: StepResult) -> None:
        """Per-sample test predictions (CAE: the decoded class), for scoring that needs them (backdoor ASR)."""
        predicted = predict(torch.from_numpy(result.logits), self.protocol.defense).numpy()
        self.test_predictions.setdefault(cmd.header.epoch, []).append((np.asarray(cmd.sample_ids, dtype=np.int64), predicted))

    def save_predictions(self) -> None:
        """<run>/predictions/test-epoch-NNN.npz per evaluation: sample_ids, predicted."""
        out = self.run_dir / "predictions"
        for epoch, parts in self.test_predictions.items():
            out.mkdir(parents=True, exist_ok=True)
            np.savez(out / f"test-epoch-{epoch:03d}.npz", sample_ids=np.concatenate([p[0] for p in parts]),
                     predicted=np.concatenate([p[1] for p in parts]))

    def _fail(self, slot: StepSlot, error: str) -> None:
        slot.error = error
        slot.done.set()
        self.slots.pop(slot.step, None)

    def shutdown(self, req: messages_pb2.ShutdownRequest) -> messages_pb2.ShutdownReply:
        with self.cond:  # release any step still waiting, so shutdown is not held up by a dead peer
            for slot in list(self.slots.values()):
                self._fail(slot, f"run is shutting down: {req.reason}")
            self.cond.notify_all()
        with self.step_lock:
            self.save_predictions()
        return super().shutdown(req)


class ActiveServicer(services_pb2_grpc.ActiveServicer):
    def __init__(self, party: ActiveParty) -> None:
        self.party = party

    @servicer_method
    def ExchangeEmbeddings(self, request: messages_pb2.Embeddings, context: grpc.ServicerContext) -> messages_pb2.EmbeddingGradients:
        return self.party.receive(request, context)


def main(cfg: Config, name: str, run_dir: Path, listen: str, coordinator: str, advertise: str) -> int:
    return serve_party(ActiveParty(cfg, name, run_dir), listen, coordinator, advertise)
