"""The coordinator: admission against the roster, sample alignment, the seeded schedule (training
steps, evaluation, prediction, model release), metrics and the run lifecycle. It never sees features,
labels or embeddings. What a protocol adds at the coordinator (keys, decryption, parameters it holds)
is its ``CoordinatorSide`` (vflnet/protocols/)."""

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

from vflnet.attacks.knowledge import deliver_server_knowledge
from vflnet.config import Config
from vflnet.data.alignment import epoch_batches, eval_batches, intersect, split_train_test
from vflnet.interceptors.setup import party_interception
from vflnet.protocols.base import PROTOCOLS, CoordinatorSide, RunFailed
from vflnet.roles.common import check_run, check_sender, header, wait_for
from vflnet.roles.heartbeat import Abort, PartyWatch
from vflnet.roles.party import accept_release
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.wire.bridge import Bridge, add_handlers
from vflnet.wire.channels import stop_server
from vflnet.wire.errors import RpcFailure, describe_rpc_error, permission_denied, shown

log = logging.getLogger("vflnet.coordinator")

JOIN = "/vflnet.v1.Coordinator/Join"
RECEIVE_MODEL = "/vflnet.v1.Coordinator/ReceiveModel"


@dataclass
class Admission:
    """Join requests, collected until the whole roster is present."""

    cfg: Config
    side: CoordinatorSide
    joined: dict[str, messages_pb2.JoinRequest] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    complete: threading.Event = field(default_factory=threading.Event)
    reply: messages_pb2.JoinReply | None = None

    def admit(self, req: messages_pb2.JoinRequest, context: Any) -> None:
        check_run(self.cfg, req.run_id)
        roster = {p.name: p.role for p in self.cfg.parties if p.role != "coordinator"}
        if req.name not in roster:
            raise permission_denied(f"party {shown(req.name)} is not in the roster ({', '.join(roster)})")
        if req.role != roster[req.name]:
            raise permission_denied(
                f"party {req.name!r} joined as {shown(req.role)}; the roster says {roster[req.name]!r}"
            )
        # under TLS the name joined must be the certificate's: no party can take another's seat
        check_sender(self.cfg, req.name, {req.role}, context)
        with self.lock:
            if req.name in self.joined:
                raise RpcFailure(grpc.StatusCode.ALREADY_EXISTS, f"party {req.name!r} has already joined")
            self.joined[req.name] = req
            log.info(
                "admitted %s (%s) at %s with %d sample ids",
                req.name,
                req.role,
                req.address,
                len(req.sample_ids),
            )
            if len(self.joined) == len(roster):
                self.reply = self._plan()
                self.complete.set()

    def _plan(self) -> messages_pb2.JoinReply:
        common = intersect([np.asarray(r.sample_ids, dtype=np.int64) for r in self.joined.values()])
        if len(common) < 2:
            raise RpcFailure(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"only {len(common)} sample ids are common to all parties",
            )
        train, test = split_train_test(common, self.cfg.data.test_fraction, self.cfg.run.seed)
        log.info("aligned %d common samples: %d train, %d test", len(common), len(train), len(test))
        roster = [
            messages_pb2.PartyInfo(name=r.name, role=r.role, address=r.address) for r in self.joined.values()
        ]
        reply = messages_pb2.JoinReply(run_id=self.cfg.run.id, roster=roster, train_ids=train, test_ids=test)
        self.side.join_reply(reply)
        return reply


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
    """Drives the parties through the run: epochs of training steps, evaluation passes, prediction
    passes and model releases, each step a RunStep to every party at once."""

    def __init__(
        self,
        cfg: Config,
        stubs: dict[str, services_pb2_grpc.PartyStub],
        metrics: MetricsLog,
        reply: messages_pb2.JoinReply,
        side: CoordinatorSide,
    ) -> None:
        self.cfg, self.stubs, self.metrics, self.side = cfg, stubs, metrics, side
        self.train_ids = np.asarray(reply.train_ids, dtype=np.int64)
        self.test_ids = np.asarray(reply.test_ids, dtype=np.int64)
        self.step = 0
        self.timeout = cfg.transport.rpc_timeout_s
        self.released_bytes: dict[str, int] = {}
        self.abort = Abort()  # heartbeats end a wait on a dead party (vflnet/roles/heartbeat.py)

    def plan(self) -> dict[str, int]:
        t = self.cfg.train
        per_epoch = len(epoch_batches(self.train_ids, t.batch_size, 0, self.cfg.run.seed, t.drop_last))
        total = per_epoch * t.epochs
        if t.max_steps:
            total = min(total, t.max_steps)
        return {
            "n_train": len(self.train_ids),
            "n_test": len(self.test_ids),
            "steps_per_epoch": per_epoch,
            "total_steps": total,
            "n_predict": len(self.predict_ids()),
        }

    def _header(self, phase: int, epoch: int, batch_id: int) -> messages_pb2.Header:
        return header(
            self.cfg, self.cfg.coordinator.name, self.step, epoch, batch_id, phase, self.side.model_version
        )

    def _all(self, calls: dict[str, Any], what: str) -> dict[str, Any]:
        """Wait for every party's call; stop at the first failure instead of waiting for parties
        blocked on the failed one."""
        settled = threading.Semaphore(0)
        for call in calls.values():
            call.add_done_callback(lambda _c: settled.release())
        self.abort.track(calls.values())
        for _ in calls:
            settled.acquire()
            self.abort.check()
            failed = [(n, c) for n, c in calls.items() if c.done() and c.exception() is not None]
            if failed:
                for c in calls.values():
                    c.cancel()
                name, call = failed[0]
                raise RunFailed(f"party {name!r} failed at {what}: {describe_rpc_error(call.exception())}")
        return {name: call.result() for name, call in calls.items()}

    def _run_step(
        self, phase: int, epoch: int, batch_id: int, ids: np.ndarray, checkpoint: bool
    ) -> dict[str, messages_pb2.StepReport]:
        self.step += 1
        cmd = messages_pb2.StepCommand(
            header=self._header(phase, epoch, batch_id), sample_ids=ids, checkpoint_after=checkpoint
        )
        calls = {
            name: stub.RunStep.future(self.side.command(name, cmd), timeout=self.timeout)
            for name, stub in self.stubs.items()
        }
        reports = self._all(calls, f"step {self.step} (epoch {epoch})")
        try:
            self.side.after_step(phase, reports)
        except RunFailed as exc:
            raise RunFailed(f"step {self.step}: {exc}") from exc
        return reports

    def run(self) -> dict[str, Any]:
        t = self.cfg.train
        trained, final = 0, {}
        totals_bytes: dict[str, int] = {}
        totals_payload: dict[str, int] = {}
        self.release("start")
        for epoch in range(t.epochs):
            start = time.perf_counter()
            loss_sum = correct = count = 0.0
            batches = epoch_batches(self.train_ids, t.batch_size, epoch, self.cfg.run.seed, t.drop_last)
            for b, ids in enumerate(batches):
                last_of_run = t.max_steps and trained + 1 >= t.max_steps
                ckpt = (b == len(batches) - 1 or bool(last_of_run)) and (
                    (epoch + 1) % t.checkpoint_every == 0
                )
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
                self.metrics.write(
                    {
                        "kind": "step",
                        "step": self.step,
                        "epoch": epoch,
                        "batch": b,
                        "batch_size": len(ids),
                        "loss": act["loss_sum"] / act["count"],
                        "accuracy": act["correct"] / act["count"],
                        "step_time_s": step_time,
                        "bytes_sent": sent,
                        "payload_bytes": payload,
                    }
                )
                if last_of_run:
                    break
            record = {
                "kind": "epoch",
                "epoch": epoch,
                "train_loss": loss_sum / max(count, 1),
                "train_accuracy": correct / max(count, 1),
                "time_s": time.perf_counter() - start,
                "steps": trained,
            }
            last_epoch = epoch == t.epochs - 1 or bool(t.max_steps and trained >= t.max_steps)
            if (epoch + 1) % t.eval_every == 0 or last_epoch:
                record.update(self.evaluate(epoch))
            self.metrics.write(record)
            log.info(
                "epoch %d: %s",
                epoch,
                ", ".join(f"{k}={v:.4f}" for k, v in record.items() if isinstance(v, float)),
            )
            final = record
            if last_epoch:  # the trained model is released before serving: an attacker may use it there
                self.release("end")
            if self.cfg.predict.when == "every_epoch" or last_epoch:
                self.predict(epoch)
            if last_epoch:
                break
        for k, v in self.released_bytes.items():
            totals_bytes[k] = totals_bytes.get(k, 0) + v
        return {"final": final, "steps": trained, "bytes_sent": totals_bytes, "payload_bytes": totals_payload}

    def evaluate(self, epoch: int) -> dict[str, float]:
        loss_sum = correct = count = 0.0
        for b, ids in enumerate(eval_batches(self.test_ids, self.cfg.train.eval_batch_size)):
            act = self._run_step(messages_pb2.EVAL, epoch, b, ids, False)[self.cfg.active.name].metrics
            loss_sum, correct, count = (
                loss_sum + act["loss_sum"],
                correct + act["correct"],
                count + act["count"],
            )
        return {"test_loss": loss_sum / max(count, 1), "test_accuracy": correct / max(count, 1)}

    # ------------------------------------------------------------------ prediction phase
    def predict_ids(self) -> np.ndarray:
        """The sample IDs served in the prediction phase: the first ``predict.count`` of the set (all if 0)."""
        p = self.cfg.predict
        ids = {"none": np.zeros(0, np.int64), "test": self.test_ids, "train": self.train_ids}[p.set]
        return ids[: p.count] if p.count else ids

    def predict(self, epoch: int) -> None:
        """Prediction requests flow through the parties like evaluation, without labels: the active
        party receives the model output (per-sample confidence vectors) and keeps it."""
        ids = self.predict_ids()
        if len(ids) == 0:
            return
        start, served = time.perf_counter(), 0
        for b, batch in enumerate(eval_batches(ids, self.cfg.predict.batch_size)):
            served += int(
                self._run_step(messages_pb2.PREDICT, epoch, b, batch, False)[self.cfg.active.name].metrics[
                    "count"
                ]
            )
        self.metrics.write(
            {
                "kind": "predict",
                "epoch": epoch,
                "set": self.cfg.predict.set,
                "count": served,
                "time_s": time.perf_counter() - start,
            }
        )

    # ------------------------------------------------------------------------ model release
    def release(self, when: str) -> None:
        """Every configured model release due now: the owner hands its modules to the recipient."""
        for r in self.cfg.model_release:
            if r.when != when:
                continue
            # a release carries the last step's number: step numbers belong to RunStep, which every
            # party receives, so each party can refuse any step but the next one
            cmd = messages_pb2.ReleaseCommand(
                header=self._header(messages_pb2.PHASE_UNSPECIFIED, 0, 0),
                recipient=r.recipient,
                modules=r.modules,
            )
            ack = self._all(
                {r.owner: self.stubs[r.owner].ReleaseModel.future(cmd, timeout=self.timeout)},
                f"model release to {r.recipient}",
            )[r.owner]
            for m, v in ack.bytes_sent.items():
                self.released_bytes[f"{r.owner}/{m}"] = self.released_bytes.get(f"{r.owner}/{m}", 0) + v
            self.metrics.write(
                {
                    "kind": "release",
                    "owner": r.owner,
                    "recipient": r.recipient,
                    "modules": list(r.modules),
                    "when": when,
                    "bytes_sent": dict(ack.bytes_sent),
                }
            )


def shutdown_all(
    cfg: Config, stubs: dict[str, services_pb2_grpc.PartyStub], reason: str, save: bool
) -> dict[str, str]:
    paths = {}
    for name, stub in stubs.items():
        try:
            reply = stub.Shutdown(
                messages_pb2.ShutdownRequest(
                    run_id=cfg.run.id, save_checkpoint=save, reason=reason, sender=cfg.coordinator.name
                ),
                timeout=30,
            )
            paths[name] = reply.checkpoint
        except grpc.RpcError as exc:
            log.warning("shutdown of %s failed: %s", name, describe_rpc_error(exc))
    return paths


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class CoordinatorHost:
    """The coordinator process's state: its protocol side, admission, and its interception."""

    def __init__(self, cfg: Config, run_dir: Path | None, bridge: Bridge) -> None:
        self.cfg, self.run_dir, self.bridge = cfg, run_dir, bridge
        self.name = cfg.coordinator.name
        self.interception = party_interception(cfg, self.name, run_dir or Path("."))
        self.side = PROTOCOLS.get(cfg.protocol.kind).coordinator(self)
        self.admission = Admission(cfg, self.side)

    def join(self, req: messages_pb2.JoinRequest, context: Any) -> messages_pb2.JoinReply:
        self.admission.admit(req, context)
        wait_for(self.admission.complete, self.cfg.transport.join_timeout_s, "the rest of the roster to join")
        assert self.admission.reply is not None
        return self.admission.reply

    def receive_model(self, msg: messages_pb2.ModelRelease, context: Any) -> messages_pb2.ReleaseAck:
        accept_release(self.cfg, self.name, msg, context, self.interception.knowledge)
        return messages_pb2.ReleaseAck(
            header=header(self.cfg, self.name, msg.header.step, 0, 0, msg.header.phase, 0)
        )

    def add_services(self, server: Any) -> None:
        add_handlers(server, {JOIN: self.join, RECEIVE_MODEL: self.receive_model})
        self.side.add_services(server)


def main(cfg: Config, run_dir: Path, listen: str, bridge: Bridge) -> int:
    host = CoordinatorHost(cfg, run_dir, bridge)
    admission, name = host.admission, host.name
    server = bridge.make_server(name, host.interception.chain)
    host.add_services(server)
    address = bridge.bind(server, name, listen)
    server.start()
    write_atomic(run_dir / "coordinator.addr", address)
    log.info(
        "coordinator of run %s serving on %s; waiting for %d parties",
        cfg.run.id,
        address,
        len(cfg.parties) - 1,
    )

    metrics = MetricsLog(run_dir / "metrics.jsonl")
    summary: dict[str, Any] = {"run_id": cfg.run.id, "status": "failed", "started": time.time()}
    stubs: dict[str, services_pb2_grpc.PartyStub] = {}
    watch = PartyWatch(cfg.transport, bridge, name)  # heartbeats to every party while the schedule runs
    start = time.perf_counter()
    try:
        if not admission.complete.wait(cfg.transport.join_timeout_s):
            missing = sorted({p.name for p in cfg.parties if p.role != "coordinator"} - set(admission.joined))
            raise RunFailed(
                f"parties never joined within {cfg.transport.join_timeout_s:.0f} s: {', '.join(missing)}"
            )
        assert admission.reply is not None
        for info in admission.reply.roster:
            stubs[info.name] = services_pb2_grpc.PartyStub(
                bridge.open_channel(info.address, name, host.interception.chain, info.name)
            )
        deliver_server_knowledge(cfg, host.interception.knowledge, admission.reply, admission.joined)
        host.side.start(admission.joined)
        schedule = Schedule(cfg, stubs, metrics, admission.reply, host.side)
        write_atomic(run_dir / "plan.json", json.dumps(schedule.plan()))
        with watch.watching(admission.reply.roster, schedule.abort):
            result = schedule.run()
        summary.update(result, status="completed")
        summary.update(host.side.finish())
        summary["checkpoints"] = shutdown_all(cfg, stubs, "run completed", save=True)
        return 0
    except RunFailed as exc:
        log.error("run failed: %s", exc)
        summary["error"] = str(exc)
        summary["checkpoints"] = shutdown_all(cfg, watch.alive(stubs), f"run failed: {exc}", save=True)
        return 1
    finally:
        summary["wall_time_s"] = time.perf_counter() - start
        host.interception.finish(run_dir)
        write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
        metrics.close()
        stop_server(server, grace=2)
