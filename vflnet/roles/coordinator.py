"""The coordinator: admission against the roster, sample alignment, the seeded batch schedule,
evaluation, metrics, and the run lifecycle. It never sees features, labels or embeddings."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from vflnet.config import Config
from vflnet.crypto import PublicKey, generate_keypair, save_public_key
from vflnet.crypto.masking import ints_to_bytes
from vflnet.crypto.wire import cipher_from_proto
from vflnet.data.alignment import epoch_batches, eval_batches, intersect, split_train_test
from vflnet.interceptors.grpc_adapters import ServerChainInterceptor, intercept_channel
from vflnet.interceptors.setup import party_interception
from vflnet.protocols.param_server import ParamServer, from_tensor_map
from vflnet.roles.common import check_run, check_sender, header, wait_for
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.wire.channels import bind, make_server, open_channel
from vflnet.wire.errors import RpcFailure, describe_rpc_error, permission_denied, servicer_method

log = logging.getLogger("vflnet.coordinator")


class RunFailed(RuntimeError):
    pass


@dataclass
class Admission:
    """Join requests, collected until the whole roster is present."""

    cfg: Config
    public_key: PublicKey | None = None
    joined: dict[str, messages_pb2.JoinRequest] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    complete: threading.Event = field(default_factory=threading.Event)
    reply: messages_pb2.JoinReply | None = None

    def admit(self, req: messages_pb2.JoinRequest) -> None:
        check_run(self.cfg, req.run_id)
        roster = {p.name: p.role for p in self.cfg.parties if p.role != "coordinator"}
        if req.name not in roster:
            raise permission_denied(f"party {req.name!r} is not in the roster ({', '.join(roster)})")
        if req.role != roster[req.name]:
            raise permission_denied(f"party {req.name!r} joined as {req.role!r}; the roster says {roster[req.name]!r}")
        with self.lock:
            if req.name in self.joined:
                raise RpcFailure(grpc.StatusCode.ALREADY_EXISTS, f"party {req.name!r} has already joined")
            self.joined[req.name] = req
            log.info("admitted %s (%s) at %s with %d sample ids", req.name, req.role, req.address, len(req.sample_ids))
            if len(self.joined) == len(roster):
                self.reply = self._plan()
                self.complete.set()

    def _plan(self) -> messages_pb2.JoinReply:
        common = intersect([np.asarray(r.sample_ids, dtype=np.int64) for r in self.joined.values()])
        if len(common) < 2:
            raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, f"only {len(common)} sample ids are common to all parties")
        train, test = split_train_test(common, self.cfg.data.test_fraction, self.cfg.run.seed)
        log.info("aligned %d common samples: %d train, %d test", len(common), len(train), len(test))
        roster = [messages_pb2.PartyInfo(name=r.name, role=r.role, address=r.address) for r in self.joined.values()]
        key = json.dumps(self.public_key.to_json()).encode() if self.public_key else b""
        return messages_pb2.JoinReply(run_id=self.cfg.run.id, roster=roster, train_ids=train, test_ids=test, public_key=key)


class DecryptionService:
    """split-he: the coordinator holds the Paillier private key and decrypts what parties send.

    Parties mask everything before asking (vflnet.crypto.masking), so what it decrypts is
    statistically independent of the values. It checks who may ask for what, and counts it all."""

    PURPOSES = {"aggregate_logits": {"active"}, "masked_gradient": {"active", "passive"}}

    def __init__(self, cfg: Config) -> None:
        he = cfg.protocol.he
        self.cfg = cfg
        self.public_key, self._private_key = generate_keypair(he.key_bits, allow_insecure=he.allow_insecure_keys)
        self.lock = threading.Lock()
        self.requests: dict[str, int] = {}
        self.values: dict[str, int] = {}

    def decrypt(self, req: messages_pb2.DecryptRequest, context: grpc.ServicerContext | None) -> messages_pb2.DecryptReply:
        check_run(self.cfg, req.header.run_id)
        allowed = self.PURPOSES.get(req.purpose)
        if allowed is None:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"unknown decryption purpose {req.purpose!r}; known: {sorted(self.PURPOSES)}")
        check_sender(self.cfg, req.header.sender, allowed, context)
        try:
            masked = cipher_from_proto(req.cipher, self.public_key)
            ints = self._private_key.decrypt_encoded(masked, workers=self.cfg.protocol.he.workers)
        except (ValueError, OverflowError) as exc:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, f"cannot decrypt: {exc}") from exc
        data, width = ints_to_bytes(ints)
        key = f"{req.header.sender}/{req.purpose}"
        with self.lock:
            self.requests[key] = self.requests.get(key, 0) + 1
            self.values[key] = self.values.get(key, 0) + ints.size
        reply_header = header(self.cfg, "coordinator", req.header.step, req.header.epoch, req.header.batch_id, req.header.phase, 0)
        return messages_pb2.DecryptReply(header=reply_header, shape=list(ints.shape), integer_width=width, integers=data)


class CoordinatorServicer(services_pb2_grpc.CoordinatorServicer):
    def __init__(self, admission: Admission, join_timeout_s: float, decryption: DecryptionService | None) -> None:
        self.admission = admission
        self.join_timeout_s = join_timeout_s
        self.decryption = decryption

    @servicer_method
    def Join(self, request: messages_pb2.JoinRequest, context: grpc.ServicerContext) -> messages_pb2.JoinReply:
        self.admission.admit(request)
        wait_for(self.admission.complete, self.join_timeout_s, "the rest of the roster to join")
        assert self.admission.reply is not None
        return self.admission.reply

    @servicer_method
    def Decrypt(self, request: messages_pb2.DecryptRequest, context: grpc.ServicerContext) -> messages_pb2.DecryptReply:
        if self.decryption is None:
            raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, f"protocol {self.admission.cfg.protocol.kind!r} has no decryption service")
        return self.decryption.decrypt(request, context)


class MetricsLog:
    """metrics.jsonl: one JSON object per line, flushed as written so a crash loses nothing."""

    def __init__(self, path: Path) -> None:
        self._fh = path.open("a", buffering=1)

    def write(self, record: dict[str, Any]) -> None:
        self._fh.write(json.dumps(record) + "\n")
        self._fh.flush()

    def close(self) -> None:
        self._fh.close()


class Schedule:
    """Drives the parties through epochs of training steps and evaluation passes."""

    def __init__(self, cfg: Config, stubs: dict[str, services_pb2_grpc.PartyStub], metrics: MetricsLog,
                 reply: messages_pb2.JoinReply, server: ParamServer | None = None) -> None:
        self.cfg, self.stubs, self.metrics, self.server = cfg, stubs, metrics, server
        self.train_ids = np.asarray(reply.train_ids, dtype=np.int64)
        self.test_ids = np.asarray(reply.test_ids, dtype=np.int64)
        self.step = 0
        self.timeout = cfg.transport.rpc_timeout_s

    def plan(self) -> dict[str, int]:
        t = self.cfg.train
        per_epoch = len(epoch_batches(self.train_ids, t.batch_size, 0, self.cfg.run.seed, t.drop_last))
        total = per_epoch * t.epochs
        if t.max_steps:
            total = min(total, t.max_steps)
        return {"n_train": len(self.train_ids), "n_test": len(self.test_ids), "steps_per_epoch": per_epoch, "total_steps": total}

    def _run_step(self, phase: int, epoch: int, batch_id: int, ids: np.ndarray, checkpoint: bool) -> dict[str, messages_pb2.StepReport]:
        self.step += 1
        version = self.server.updates if self.server else 0
        cmd = messages_pb2.StepCommand(
            header=header(self.cfg, "coordinator", self.step, epoch, batch_id, phase, version), sample_ids=ids, checkpoint_after=checkpoint
        )
        commands = {name: cmd for name in self.stubs}
        if self.server is not None:  # param-server: every step carries each party's current parameters
            self.server.enter_epoch(epoch)
            for name in self.stubs:
                commands[name] = messages_pb2.StepCommand()
                commands[name].CopyFrom(cmd)
                commands[name].params.CopyFrom(self.server.broadcast(name))
        calls = {name: stub.RunStep.future(commands[name], timeout=self.timeout) for name, stub in self.stubs.items()}
        settled = threading.Semaphore(0)
        for call in calls.values():
            call.add_done_callback(lambda _c: settled.release())
        reports: dict[str, messages_pb2.StepReport] = {}
        for _ in calls:
            settled.acquire()
            failed = [(n, c) for n, c in calls.items() if c.done() and c.exception() is not None]
            if failed:
                # Stop at the first failure instead of waiting for parties blocked on the failed one.
                for c in calls.values():
                    c.cancel()
                name, call = failed[0]
                raise RunFailed(f"party {name!r} failed at step {self.step} (epoch {epoch}): {describe_rpc_error(call.exception())}")
        for name, call in calls.items():
            reports[name] = call.result()
        if self.server is not None and phase == messages_pb2.TRAIN:
            try:
                self.server.apply({name: from_tensor_map(r.grads, f"{name}'s gradient") for name, r in reports.items()})
            except ValueError as exc:
                raise RunFailed(f"bad gradient upload at step {self.step}: {exc}") from exc
        return reports

    def run(self) -> dict[str, Any]:
        t = self.cfg.train
        trained, final = 0, {}
        totals_bytes: dict[str, int] = {}
        totals_payload: dict[str, int] = {}
        for epoch in range(t.epochs):
            start = time.perf_counter()
            loss_sum = correct = count = 0.0
            batches = epoch_batches(self.train_ids, t.batch_size, epoch, self.cfg.run.seed, t.drop_last)
            for b, ids in enumerate(batches):
                last_of_run = t.max_steps and trained + 1 >= t.max_steps
                ckpt = (b == len(batches) - 1 or bool(last_of_run)) and ((epoch + 1) % t.checkpoint_every == 0)
                step_start = time.perf_counter()
                reports = self._run_step(messages_pb2.TRAIN, epoch, b, ids, ckpt)
                step_time = time.perf_counter() - step_start
                trained += 1
                act = reports[self.cfg.active.name].metrics
                loss_sum += act["loss_sum"]
                correct += act["correct"]
                count += act["count"]
                sent = {f"{n}/{m}": v for n, r in reports.items() for m, v in r.bytes_sent.items()}
                payload = {f"{n}/{m}": v for n, r in reports.items() for m, v in r.payload_bytes.items()}
                for k, v in sent.items():
                    totals_bytes[k] = totals_bytes.get(k, 0) + v
                for k, v in payload.items():
                    totals_payload[k] = totals_payload.get(k, 0) + v
                self.metrics.write({
                    "kind": "step", "step": self.step, "epoch": epoch, "batch": b, "batch_size": len(ids),
                    "loss": act["loss_sum"] / act["count"], "accuracy": act["correct"] / act["count"],
                    "step_time_s": step_time, "bytes_sent": sent, "payload_bytes": payload,
                })
                if last_of_run:
                    break
            record = {"kind": "epoch", "epoch": epoch, "train_loss": loss_sum / max(count, 1),
                      "train_accuracy": correct / max(count, 1), "time_s": time.perf_counter() - start, "steps": trained}
            last_epoch = epoch == t.epochs - 1 or (t.max_steps and trained >= t.max_steps)
            if (epoch + 1) % t.eval_every == 0 or last_epoch:
                record.update(self.evaluate(epoch))
            self.metrics.write(record)
            log.info("epoch %d: %s", epoch, ", ".join(f"{k}={v:.4f}" for k, v in record.items() if isinstance(v, float)))
            final = record
            if last_epoch:
                break
        return {"final": final, "steps": trained, "bytes_sent": totals_bytes, "payload_bytes": totals_payload}

    def evaluate(self, epoch: int) -> dict[str, float]:
        loss_sum = correct = count = 0.0
        for b, ids in enumerate(eval_batches(self.test_ids, self.cfg.train.eval_batch_size)):
            act = self._run_step(messages_pb2.EVAL, epoch, b, ids, False)[self.cfg.active.name].metrics
            loss_sum, correct, count = loss_sum + act["loss_sum"], correct + act["correct"], count + act["count"]
        return {"test_loss": loss_sum / max(count, 1), "test_accuracy": correct / max(count, 1)}


def shutdown_all(cfg: Config, stubs: dict[str, services_pb2_grpc.PartyStub], reason: str, save: bool) -> dict[str, str]:
    paths = {}
    for name, stub in stubs.items():
        try:
            reply = stub.Shutdown(messages_pb2.ShutdownRequest(run_id=cfg.run.id, save_checkpoint=save, reason=reason), timeout=30)
            paths[name] = reply.checkpoint
        except grpc.RpcError as exc:
            log.warning("shutdown of %s failed: %s", name, describe_rpc_error(exc))
    return paths


def deliver_server_knowledge(cfg: Config, knowledge: dict[str, Any], reply: messages_pb2.JoinReply,
                             joined: dict[str, messages_pb2.JoinRequest]) -> None:
    """What the server knows a priori (paper 002's threat model), handed to its attacks explicitly:
    the model architecture (from the run config it coordinates), the training-set IDs it scheduled,
    and which roster address is which party. No data, no labels."""
    knowledge["train_ids"] = np.asarray(reply.train_ids, dtype=np.int64)
    knowledge["party_addresses"] = {p.address: p.name for p in reply.roster}
    knowledge["workers"] = [p.name for p in cfg.passives]
    knowledge["label_holder"] = cfg.active.name
    bottoms = [p.bottom for p in cfg.passives]
    top = joined[cfg.active.name].initial_params.tensors.get("top.net.weight")
    if all(b is not None and b.kind in ("cafe-conv", "cafe-fc") for b in bottoms) and top is not None:
        from vflnet.models.zoo import cafe_config

        region = cfg.passives[0].features.region  # type: ignore[union-attr]
        shape = (1, region[1] - region[0], region[3] - region[2])
        knowledge["architecture"] = cafe_config(bottoms[0], shape, n_workers=len(bottoms), n_classes=int(top.shape[0]))  # type: ignore[arg-type]


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def main(cfg: Config, run_dir: Path, listen: str) -> int:
    decryption = None
    if cfg.protocol.kind == "split-he":
        start = time.perf_counter()
        decryption = DecryptionService(cfg)
        log.info("generated a %d-bit Paillier key pair (key id %s) in %.1f s", cfg.protocol.he.key_bits,
                 decryption.public_key.key_id, time.perf_counter() - start)
        save_public_key(run_dir / "public_key.json", decryption.public_key)
    admission = Admission(cfg, decryption.public_key if decryption else None)
    name = cfg.coordinator.name
    interception = party_interception(cfg, name, run_dir)
    server = make_server(cfg.transport, name, [ServerChainInterceptor(interception.chain, name)] if len(interception.chain) else [])
    services_pb2_grpc.add_CoordinatorServicer_to_server(CoordinatorServicer(admission, cfg.transport.join_timeout_s, decryption), server)
    port = bind(server, listen, cfg.transport, "coordinator")
    server.start()
    address = f"{listen.rsplit(':', 1)[0]}:{port}"
    write_atomic(run_dir / "coordinator.addr", address)
    log.info("coordinator of run %s serving on %s; waiting for %d parties", cfg.run.id, address, len(cfg.parties) - 1)

    metrics = MetricsLog(run_dir / "metrics.jsonl")
    summary: dict[str, Any] = {"run_id": cfg.run.id, "status": "failed", "started": time.time()}
    stubs: dict[str, services_pb2_grpc.PartyStub] = {}
    start = time.perf_counter()
    try:
        if not admission.complete.wait(cfg.transport.join_timeout_s):
            missing = sorted({p.name for p in cfg.parties if p.role != "coordinator"} - set(admission.joined))
            raise RunFailed(f"parties never joined within {cfg.transport.join_timeout_s:.0f} s: {', '.join(missing)}")
        assert admission.reply is not None
        for info in admission.reply.roster:
            channel = intercept_channel(open_channel(info.address, cfg.transport, name), interception.chain, name, info.address)
            stubs[info.name] = services_pb2_grpc.PartyStub(channel)
        deliver_server_knowledge(cfg, interception.knowledge, admission.reply, admission.joined)
        param_server = None
        if cfg.protocol.kind == "param-server":
            initial = {n: from_tensor_map(r.initial_params, f"{n}'s parameter") for n, r in admission.joined.items()}
            param_server = ParamServer(cfg, initial)
        schedule = Schedule(cfg, stubs, metrics, admission.reply, param_server)
        write_atomic(run_dir / "plan.json", json.dumps(schedule.plan()))
        result = schedule.run()
        summary.update(result, status="completed")
        if param_server is not None:
            param_server.save(run_dir / "checkpoints" / "param-server.pt")
            summary["param_server"] = {"updates": param_server.updates, "static": param_server.static}
        if decryption is not None:
            summary["decryptions"] = {"requests": decryption.requests, "values": decryption.values}
        summary["checkpoints"] = shutdown_all(cfg, stubs, "run completed", save=True)
        return 0
    except RunFailed as exc:
        log.error("run failed: %s", exc)
        summary["error"] = str(exc)
        summary["checkpoints"] = shutdown_all(cfg, stubs, f"run failed: {exc}", save=True)
        return 1
    finally:
        summary["wall_time_s"] = time.perf_counter() - start
        interception.finish(run_dir)
        write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
        metrics.close()
        server.stop(grace=2).wait()
