"""A passive party: its own feature columns and bottom model; sends embeddings, applies gradients."""

from __future__ import annotations

import copy
import logging
import time
from pathlib import Path

import grpc
import numpy as np

from vflnet.attacks.base import OwnStepView
from vflnet.config import Config
from vflnet.crypto import CipherArray
from vflnet.crypto.wire import cipher_to_proto
from vflnet.protocols.split import PassiveSplit
from vflnet.protocols.split_he import PassiveHE
from vflnet.roles.common import header
from vflnet.roles.party import PartyBase
from vflnet.roles.serve import serve_party
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.wire import tensors
from vflnet.wire.channels import check_message_size
from vflnet.wire.ciphers import cipher_from_proto_checked
from vflnet.wire.errors import RpcFailure, describe_rpc_error

log = logging.getLogger("vflnet.passive")


class PassiveParty(PartyBase):
    def _prepare(self, train_ids: np.ndarray) -> None:
        if self.data.x is not None:  # an attack controlling this party's raw data (backdoor trigger), before normalising
            self.data.x = self.interception.own_data(self.data.ids, self.data.x)
        super()._prepare(train_ids)

    def build_protocol(self) -> None:
        assert self.local is not None and self.join_reply is not None
        he = self.cfg.protocol.he
        if self.cfg.protocol.kind == "split-he":
            assert self.public_key is not None
            self.protocol: PassiveSplit | PassiveHE = PassiveHE(self.local, self.public_key, he.frac_bits, self.decrypt, he.workers)
        else:
            self.protocol = PassiveSplit(self.local)
        active = next(p for p in self.join_reply.roster if p.role == "active")
        self.active = services_pb2_grpc.ActiveStub(self.channel(active.address))

    def run_step(self, cmd: messages_pb2.StepCommand) -> messages_pb2.StepReport:
        with self.step_lock:
            rows = self.begin_step(cmd)
            assert self.data.x is not None and self.local is not None
            train = cmd.header.phase == messages_pb2.TRAIN
            start = time.perf_counter()
            own_view = train and self.interception.wants_own_view
            snapshot = copy.deepcopy(self.local.modules["bottom"]) if own_view else None
            self.local.keep_last_grads = own_view
            emb = self.protocol.forward(self.data.x[rows], train)
            h = cmd.header
            msg = messages_pb2.Embeddings(
                header=header(self.cfg, self.name, h.step, h.epoch, h.batch_id, h.phase, self.local.version),
                sample_ids=cmd.sample_ids,
            )
            if isinstance(emb, CipherArray):
                msg.cipher.CopyFrom(cipher_to_proto(emb, workers=self.cfg.protocol.he.workers))
            else:
                msg.values.CopyFrom(tensors.to_proto(emb))
            check_message_size(msg, self.cfg.transport, f"{self.name}'s embeddings for step {h.step}")
            self.meter.record("ExchangeEmbeddings", msg)
            try:
                reply = self.active.ExchangeEmbeddings(msg, timeout=self.cfg.transport.rpc_timeout_s)
            except grpc.RpcError as exc:
                raise RpcFailure(grpc.StatusCode.ABORTED, f"active party refused embeddings: {describe_rpc_error(exc)}") from exc
            if reply.header.step != h.step:
                raise RpcFailure(grpc.StatusCode.DATA_LOSS, f"gradients for step {reply.header.step}, expected {h.step}")
            if train and isinstance(self.protocol, PassiveHE):
                assert self.public_key is not None
                if reply.WhichOneof("payload") != "cipher":
                    raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "split-he expects encrypted gradients from the active party")
                grad = cipher_from_proto_checked(reply.cipher, self.public_key, emb.shape, "gradients from the active party")
                self.protocol.backward(grad)
            elif train:
                grad = tensors.from_proto(reply.values, expect_dtype="float32", expect_shape=emb.shape, what="gradients from the active party")
                self.protocol.backward(grad)
            if own_view:
                grads = {n.removeprefix("bottom."): g for n, g in self.local.last_grads.items() if n.startswith("bottom.")}
                self.interception.deliver_own_view(OwnStepView(
                    h.step, np.asarray(cmd.sample_ids, dtype=np.int64), self.data.x[rows], snapshot, grads, int(emb.shape[1])))
            return self.end_step(cmd, {"compute_s": time.perf_counter() - start})


def main(cfg: Config, name: str, run_dir: Path, listen: str, coordinator: str, advertise: str) -> int:
    return serve_party(PassiveParty(cfg, name, run_dir), listen, coordinator, advertise)
