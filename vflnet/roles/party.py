"""What active and passive parties share: loading their own data, joining the coordinator,
building their model, checkpoints, and the Shutdown RPC."""

from __future__ import annotations

import json
import logging
import threading
import time
from abc import ABC, abstractmethod
from pathlib import Path

import grpc
import numpy as np

from vflnet.config import Config
from vflnet.crypto import CipherArray, PublicKey
from vflnet.crypto.masking import ints_from_bytes
from vflnet.crypto.wire import cipher_to_proto
from vflnet.data.datasets import load_dataset
from vflnet.data.partition import PartyData, normalize, party_view
from vflnet.defenses.base import build_upload_defenses
from vflnet.interceptors.grpc_adapters import intercept_channel
from vflnet.interceptors.setup import party_interception
from vflnet.models.zoo import build_party_modules
from vflnet.protocols.param_server import from_tensor_map, to_tensor_map
from vflnet.protocols.split import LocalModel
from vflnet.roles.common import Liveness, check_run, header, wait_for
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.wire.channels import check_message_size, open_channel
from vflnet.wire.errors import RpcFailure, describe_rpc_error
from vflnet.wire.meter import Meter

log = logging.getLogger("vflnet.party")


class PartyBase(ABC):
    def __init__(self, cfg: Config, name: str, run_dir: Path) -> None:
        self.cfg = cfg
        self.me = cfg.party(name)
        self.name = name
        self.run_dir = run_dir
        self.meter = Meter()
        self.liveness = Liveness(cfg.transport.idle_timeout_s)
        self.ready = threading.Event()
        dataset = load_dataset(cfg.data.dataset, cfg.data.params)
        self.is_image = dataset.is_image
        self.data: PartyData = party_view(cfg, name, dataset)
        self.join_reply: messages_pb2.JoinReply | None = None
        self.local: LocalModel | None = None
        self.step_lock = threading.Lock()  # one step at a time per party
        self.last_step = 0
        self.current: messages_pb2.Header = messages_pb2.Header()
        self.coordinator: services_pb2_grpc.CoordinatorStub | None = None
        self.public_key: PublicKey | None = None
        self.interception = party_interception(cfg, name, run_dir)
        self.upload_defenses = build_upload_defenses(cfg, name)

    # ------------------------------------------------------------------------------- setup
    def join(self, coordinator: str, advertise: str) -> messages_pb2.JoinReply:
        stub = services_pb2_grpc.CoordinatorStub(self.channel(coordinator))
        self.coordinator = stub
        self._build_model()
        req = messages_pb2.JoinRequest(
            run_id=self.cfg.run.id, name=self.name, role=self.me.role, address=advertise, sample_ids=self.data.ids
        )
        if self.central:
            assert self.local is not None
            req.initial_params.CopyFrom(to_tensor_map({n: p.detach().numpy() for n, p in self.local.named_parameters()}))
        deadline = time.monotonic() + self.cfg.transport.join_timeout_s
        while True:  # the coordinator may still be starting: retry until the join deadline
            try:
                reply = stub.Join(req, timeout=max(1.0, deadline - time.monotonic()), wait_for_ready=True)
                break
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                    raise RuntimeError(f"{self.name}: join refused by coordinator at {coordinator}: {describe_rpc_error(exc)}") from exc
                time.sleep(0.5)
        self.join_reply = reply
        if reply.public_key:
            self.public_key = PublicKey.from_json(json.loads(reply.public_key))
            self.interception.knowledge["public_key"] = self.public_key  # public: any attack may use it
        self._prepare(np.asarray(reply.train_ids, dtype=np.int64))
        self.liveness.touch()
        self.ready.set()
        log.info("%s joined run %s: %d train / %d test samples", self.name, reply.run_id, len(reply.train_ids), len(reply.test_ids))
        return reply

    def channel(self, address: str) -> grpc.Channel:
        """A client channel to a peer, with this party's interceptor chain on it."""
        return intercept_channel(open_channel(address, self.cfg.transport, self.name), self.interception.chain, self.name, address)

    @property
    def central(self) -> bool:
        """param-server: the coordinator owns this party's parameters and optimizer."""
        return self.cfg.protocol.kind == "param-server"

    def _build_model(self) -> None:
        input_shape = tuple(self.data.x.shape[1:]) if self.data.x is not None else None
        bottom, top = build_party_modules(self.cfg, self.me, input_shape, self.data.n_classes)
        modules = {k: m for k, m in (("bottom", bottom), ("top", top)) if m is not None}
        self.local = LocalModel(modules, self.cfg.train.optimizer, self.cfg.train.lr_schedule, central=self.central)

    def _prepare(self, train_ids: np.ndarray) -> None:
        if self.local is None:
            self._build_model()
        if self.data.x is not None:
            self.data.x = normalize(self.data.x, self.data.rows(train_ids), self.cfg.data.normalize, self.is_image)
        self.build_protocol()

    @abstractmethod
    def build_protocol(self) -> None:
        """Each role builds its protocol object once its model exists."""

    # ---------------------------------------------------------------------------- per step
    def begin_step(self, cmd: messages_pb2.StepCommand) -> np.ndarray:
        """Checks shared by every role at the start of a step; returns this party's rows."""
        wait_for(self.ready, self.cfg.transport.rpc_timeout_s, f"{self.name} to finish joining")
        self.liveness.touch()
        check_run(self.cfg, cmd.header.run_id)
        if cmd.header.sender != "coordinator" and self.cfg.party(cmd.header.sender).role != "coordinator":
            raise RpcFailure(grpc.StatusCode.PERMISSION_DENIED, "only the coordinator schedules steps")
        if cmd.header.step <= self.last_step:
            raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, f"step {cmd.header.step} is stale: step {self.last_step} is done")
        if len(cmd.sample_ids) == 0:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "a step needs at least one sample id")
        assert self.local is not None
        self.current = cmd.header
        self.local.enter_epoch(cmd.header.epoch)
        if self.central:
            try:
                self.local.load_params(from_tensor_map(cmd.params, "broadcast parameter"))
            except ValueError as exc:
                raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc)) from exc
        try:
            return self.data.rows(np.asarray(cmd.sample_ids, dtype=np.int64))
        except KeyError as exc:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc).strip('"')) from exc

    def end_step(self, cmd: messages_pb2.StepCommand, metrics: dict[str, float]) -> messages_pb2.StepReport:
        self.last_step = cmd.header.step
        if cmd.checkpoint_after:
            self.save_checkpoint()
        assert self.local is not None
        upload = None
        if self.central and cmd.header.phase == messages_pb2.TRAIN:
            upload = to_tensor_map(self.outgoing_gradients(self.local.take_grads()))
            self.meter.record("GradientUpload", upload)
        sent, payload = self.meter.take()
        h = cmd.header
        hdr = header(self.cfg, self.name, h.step, h.epoch, h.batch_id, h.phase, self.local.version)
        report = messages_pb2.StepReport(header=hdr, metrics=metrics, bytes_sent=sent, payload_bytes=payload)
        if upload is not None:
            report.grads.CopyFrom(upload)
        return report

    def outgoing_gradients(self, grads: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """param-server: the upload as it leaves this party, after its upload defenses (fake gradients, DP)."""
        for transform in self.upload_defenses:
            grads = transform(grads)
        return grads

    def decrypt(self, purpose: str, masked: CipherArray) -> np.ndarray:
        """split-he: the coordinator's decryption of masked ciphertexts (exact masked integers)."""
        assert self.coordinator is not None
        h = self.current
        req = messages_pb2.DecryptRequest(
            header=header(self.cfg, self.name, h.step, h.epoch, h.batch_id, h.phase, self.local.version if self.local else 0),
            purpose=purpose, cipher=cipher_to_proto(masked, workers=self.cfg.protocol.he.workers),
        )
        check_message_size(req, self.cfg.transport, f"{self.name}'s {purpose} decryption request")
        self.meter.record("Decrypt", req)
        try:
            reply = self.coordinator.Decrypt(req, timeout=self.cfg.transport.rpc_timeout_s)
        except grpc.RpcError as exc:
            raise RpcFailure(grpc.StatusCode.ABORTED, f"coordinator refused decryption: {describe_rpc_error(exc)}") from exc
        return ints_from_bytes(reply.integers, reply.integer_width, tuple(reply.shape))

    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoints" / f"{self.name}.pt"

    def save_checkpoint(self) -> str:
        if self.local is None:
            return ""
        path = self.checkpoint_path()
        self.local.save(path)
        return str(path)

    def shutdown(self, req: messages_pb2.ShutdownRequest) -> messages_pb2.ShutdownReply:
        check_run(self.cfg, req.run_id)
        log.info("%s: shutdown requested (%s)", self.name, req.reason)
        with self.step_lock:  # never save a half-applied update
            path = self.save_checkpoint() if req.save_checkpoint else ""
            for written in self.interception.finish(self.run_dir):
                log.info("%s: attack output %s", self.name, written)
        self.liveness.shutdown.set()
        return messages_pb2.ShutdownReply(checkpoint=path)

    def add_services(self, server: grpc.Server) -> None:  # noqa: B027 - optional hook, empty by default
        """Role-specific services beyond Party (the active party adds Active)."""
