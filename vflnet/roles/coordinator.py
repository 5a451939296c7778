"""The coordinator: admission against the roster, sample alignment, the seeded schedule (training
steps, evaluation, prediction, model release), metrics and the run lifecycle. It never sees features,
labels or embeddings. What a protocol adds at the coordinator (keys, decryption, parameters it holds)
is its ``CoordinatorSide`` (vflnet/protocols/)."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from vflnet.config import Config
from vflnet.data.alignment import epoch_batches, eval_batches, split_train_test
from vflnet.data.plan import aligned_split, plan_facts, refusal, training_steps
from vflnet.durable import WriteFailed, write_durable
from vflnet.interceptors.bridge import Bridge, add_handlers, allow_step_deadline
from vflnet.roles import alignment, checkpoints
from vflnet.roles.alignment import Aligned
from vflnet.roles.common import wait_for
from vflnet.roles.heartbeat import Abort, PartyWatch
from vflnet.roles.step_order import STEPS_IN_FLIGHT
from vflnet.sdk import deadlines
from vflnet.sdk.contract import PROTOCOLS, CoordinatorSide, RunFailed
from vflnet.shared_config import config_mismatch
from vflnet.threat.effects import merge_effects
from vflnet.threat.interception import party_interception
from vflnet.threat.knowledge import deliver_server_knowledge
from vflnet.threat.release import accept_release
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.wire.channels import stop_server
from vflnet.wire.checks import check_run, check_sender, header
from vflnet.wire.errors import RpcFailure, describe_rpc_error, invalid, permission_denied, shown

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
    resume_from: checkpoints.Manifest | None = None  # the checkpoint every party continues from
    failure: str | None = None  # why the run failed at admission: every Join, waiting or later, is told
    # the alignment phase (vflnet/roles/alignment.py), run once the roster is complete; None: the
    # parties joined with their IDs (`plain` over the dataset's integer IDs)
    align: Callable[[dict[str, messages_pb2.JoinRequest]], Aligned] | None = None

    def fail(self, cause: str) -> RpcFailure:
        """The run cannot go on (the roster joined and its plan is degenerate): every party waiting in
        its Join is refused at once with ``cause``, as is any Join after it, and the run fails."""
        self.failure = cause
        self.complete.set()
        return self.refused()

    def refused(self) -> RpcFailure:
        return RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, f"the run failed at admission: {self.failure}")

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
        if self.resume_from is not None and not req.resume:
            raise RpcFailure(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"run {self.cfg.run.id!r} resumes from the checkpoint of step {self.resume_from.step}: "
                f"start {req.name} with --resume",
            )
        if not 0 <= req.step_work_s <= deadlines.MAX_ESTIMATE_S:  # NaN fails too
            raise invalid(
                f"step_work_s of {req.name!r} must lie in [0, {deadlines.MAX_ESTIMATE_S:g}] s, got {req.step_work_s}"
            )
        if self.align is not None and len(req.sample_ids):
            raise invalid(
                f"party {req.name!r} joined with sample IDs, but this run aligns them in the alignment phase "
                "(docs/protocols.md, Alignment): its Join carries none"
            )
        mismatch = config_mismatch(self.cfg, req.name, req.config)
        if mismatch is not None:
            raise RpcFailure(grpc.StatusCode.FAILED_PRECONDITION, mismatch)
        with self.lock:
            if self.failure is not None:
                raise self.refused()
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
            last = len(self.joined) == len(roster)
        if last:  # outside the lock: alignment talks to every party
            self.reply = self._plan()
            self.complete.set()

    def _plan(self) -> messages_pb2.JoinReply:
        if self.align is None:
            held = {n: np.asarray(r.sample_ids, dtype=np.int64) for n, r in self.joined.items()}
            train, test = aligned_split(self.cfg, held)
            sizes = {n: len(i) for n, i in held.items()}
        else:
            try:
                aligned = self.align(self.joined)
            except (RunFailed, WriteFailed) as exc:
                raise self.fail(str(exc)) from exc
            # the run's samples are row indices 0..n-1 (the parties' common order)
            train, test = split_train_test(
                np.arange(aligned.n_common), self.cfg.data.test_fraction, self.cfg.run.seed
            )
            sizes = aligned.held
        # the checks of config check, on the IDs the parties hold (vflnet/data/plan.py)
        why = refusal(self.cfg, plan_facts(self.cfg, sizes, train, test))
        if why is not None:
            raise self.fail(why)
        log.info(
            "aligned %d common samples: %d train, %d test", len(train) + len(test), len(train), len(test)
        )
        roster = [
            messages_pb2.PartyInfo(name=r.name, role=r.role, address=r.address) for r in self.joined.values()
        ]
        reply = messages_pb2.JoinReply(run_id=self.cfg.run.id, roster=roster, train_ids=train, test_ids=test)
        t = self.cfg.transport
        work = {r.name: r.step_work_s for r in self.joined.values()}
        reply.step_deadline_s = deadlines.step_deadline_s(t.rpc_timeout_s, t.work_slack, work)
        if self.resume_from is not None:
            reply.resume_step = self.resume_from.step
            reply.resume_sha256.update(self.resume_from.files)
        self.side.join_reply(reply)
        return reply


class MetricsLog:
    """metrics.jsonl: one JSON object per line, flushed as written so a crash loses nothing."""

    def __init__(self, path: Path, keep_bytes: int | None = None) -> None:
        self.path = path
        if keep_bytes is not None and path.exists():  # a resumed run: drop what came after its checkpoint
            os.truncate(path, keep_bytes)
        self._fh = path.open("ab")

    def write(self, record: dict[str, Any]) -> None:
        try:
            self._fh.write((json.dumps(record) + "\n").encode())
            self._fh.flush()
            if os.fstat(self._fh.fileno()).st_nlink == 0:  # else the records would go to a file no one sees
                raise FileNotFoundError(errno.ENOENT, "the file was removed (the run directory vanished?)")
        except OSError as exc:  # a resumed run cuts a partial line back to its checkpoint's length
            raise WriteFailed("the metrics", self.path, exc) from exc

    def offset(self) -> int:
        return self._fh.tell()

    def close(self) -> None:
        self._fh.close()


@dataclass
class Cursor:
    """Where the schedule stands, kept in every coordinated checkpoint: a resumed run continues with
    the next training step of the same seeded schedule."""

    step: int = 0  # the last training step completed (a resumed run numbers on from it)
    epoch: int = 0
    batch: int = 0  # the next training batch of the epoch
    trained: int = 0
    loss_sum: float = 0.0  # the epoch's sums so far
    correct: float = 0.0
    count: float = 0.0
    bytes_sent: dict[str, int] = field(default_factory=dict)
    payload_bytes: dict[str, int] = field(default_factory=dict)
    released_bytes: dict[str, int] = field(default_factory=dict)
    metrics_bytes: int = 0  # metrics.jsonl's length at the checkpoint


@dataclass(frozen=True)
class Planned:
    """A step of the schedule: its epoch, batch and sample ids; whether a coordinated checkpoint follows
    it; whether it is the last of its epoch; and whether nothing may be sent beyond it until it has
    completed (``hold``: a checkpoint, or epoch-end work that needs the trained model)."""

    epoch: int
    batch: int
    ids: np.ndarray
    checkpoint: bool = False
    last: bool = False
    hold: bool = False


@dataclass
class Sent:
    """A step whose RunStep calls are out: its command, the waves still to send, the calls in flight."""

    cmd: messages_pb2.StepCommand
    waves: list[list[str]]
    planned: Planned
    calls: dict[str, Any] = field(default_factory=dict)
    reports: dict[str, messages_pb2.StepReport] = field(default_factory=dict)
    sent_at: float = field(default_factory=time.perf_counter)


class Schedule:
    """Drives the parties through the run: epochs of training steps, evaluation passes, prediction
    passes and model releases, each step a RunStep to every party at once.

    Steps are pipelined where the protocol allows it (``CoordinatorSide.pipelined``): step n+1's
    RunStep goes out before step n's reports are in, so its delivery overlaps step n's work; each
    party still runs its steps one at a time and in order (vflnet/roles/step_order.py), and the
    reports are taken in order. The messages are the same as without pipelining; only when they
    travel changes. The pipeline runs on across an epoch's end, unless that end evaluates, predicts
    or ends the run: those need the model after the epoch's last step, so they wait for it, as does
    the step after a coordinated checkpoint (a checkpoint is exactly the state after its step
    everywhere)."""

    def __init__(
        self,
        cfg: Config,
        stubs: dict[str, services_pb2_grpc.PartyStub],
        metrics: MetricsLog,
        reply: messages_pb2.JoinReply,
        side: CoordinatorSide,
        run_dir: Path,
        cursor: Cursor | None = None,
    ) -> None:
        self.cfg, self.stubs, self.metrics, self.side, self.run_dir = cfg, stubs, metrics, side, run_dir
        self.train_ids = np.asarray(reply.train_ids, dtype=np.int64)
        self.test_ids = np.asarray(reply.test_ids, dtype=np.int64)
        self.cursor = cursor or Cursor()
        self.step = self.cursor.step
        self.timeout = reply.step_deadline_s  # scaled with the parties' work (vflnet/sdk/deadlines.py)
        self.checkpointed: list[int] = []  # steps with a manifest written by this process, oldest first
        self.abort = Abort()  # heartbeats end a wait on a dead party (vflnet/roles/heartbeat.py)
        self.window: deque[Sent] = deque()  # steps sent and not yet completed, oldest first

    def plan(self) -> dict[str, int]:
        per_epoch, total = training_steps(self.cfg, self.train_ids)
        return {
            "n_train": len(self.train_ids),
            "n_test": len(self.test_ids),
            "steps_per_epoch": per_epoch,
            "total_steps": total,
            "n_predict": len(self.predict_ids()),
            "resumed_after": self.cursor.trained,
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
        # a dead party also ends the calls of the pipelined step behind this one
        self.abort.track([*calls.values(), *(c for s in self.window for c in s.calls.values())])
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

    def _send_wave(self, sent: Sent) -> None:
        # a pipelined call also spans the step before it, which the party finishes first
        timeout = self.timeout * STEPS_IN_FLIGHT if self.side.pipelined else self.timeout
        sent.calls = {
            name: self.stubs[name].RunStep.future(self.side.command(name, sent.cmd), timeout=timeout)
            for name in sent.waves.pop(0)
        }

    def _send(self, phase: int, p: Planned) -> Sent:
        self.step += 1
        cmd = messages_pb2.StepCommand(  # a list fills the repeated field ~2.5x faster than an array
            header=self._header(phase, p.epoch, p.batch),
            sample_ids=p.ids.tolist(),
            checkpoint_after=p.checkpoint,
        )
        sent = Sent(cmd, self.side.waves(list(self.stubs)), p)
        if self.side.pipelined and len(sent.waves) > 1:
            raise RunFailed(f"protocol {self.cfg.protocol.kind!r}: a pipelined step runs in one wave")
        self._send_wave(sent)
        return sent

    def _complete(self, sent: Sent) -> dict[str, messages_pb2.StepReport]:
        h = sent.cmd.header
        while True:
            sent.reports.update(self._all(sent.calls, f"step {h.step} (epoch {h.epoch})"))
            if not sent.waves:
                break
            self._send_wave(sent)
        try:
            self.side.after_step(h.phase, sent.reports)
        except RunFailed as exc:
            raise RunFailed(f"step {h.step}: {exc}") from exc
        return sent.reports

    def _steps(self, phase: int, plan: Iterable[Planned]) -> Iterator[tuple[Sent, float]]:
        """Run ``plan`` as consecutive steps; yield each step with its reports, in order, and its wall
        time: from when it was sent, or when the step before it completed if that was later. Another
        pass (an evaluation between epochs) may only start while no step is out (``hold``)."""
        if self.window:
            raise RuntimeError(f"steps {[s.cmd.header.step for s in self.window]} are still out")
        depth = STEPS_IN_FLIGHT if self.side.pipelined else 1
        todo, last_done = iter(plan), 0.0
        try:
            while True:
                limit = 1 if self.window and self.window[-1].planned.hold else depth
                if len(self.window) < limit and (p := next(todo, None)) is not None:
                    self.window.append(self._send(phase, p))
                    continue
                if not self.window:
                    return
                done = self.window.popleft()
                self._complete(done)
                end = time.perf_counter()
                yield done, end - max(done.sent_at, last_done)
                last_done = end
        finally:  # a failed step (or a stopped run) ends the one pipelined behind it
            for behind in self.window:
                for call in behind.calls.values():
                    call.cancel()
            self.window.clear()

    def _checkpoint_due(self, epoch: int, last_of_epoch: bool, trained: int) -> bool:
        """Whether the training step after ``trained`` earlier ones ends in a coordinated checkpoint."""
        t = self.cfg.train
        at_epoch_end = last_of_epoch and (epoch + 1) % t.checkpoint_every == 0
        return at_epoch_end or bool(
            t.checkpoint_every_steps and (trained + 1) % t.checkpoint_every_steps == 0
        )

    def _evaluates(self, epoch: int, last_epoch: bool) -> bool:
        every = self.cfg.train.eval_every  # 0: never
        return every > 0 and (last_epoch or (epoch + 1) % every == 0)

    def _predicts(self, last_epoch: bool) -> bool:
        return last_epoch or self.cfg.predict.when == "every_epoch"

    def _epoch_end_waits(self, epoch: int, end_of_run: bool) -> bool:
        """Whether ``epoch``'s end needs the model after its last step (nothing is sent beyond it first):
        it evaluates, predicts or (the run's end) releases the model."""
        return self._evaluates(epoch, end_of_run) or self._predicts(end_of_run)

    def _training_plan(self) -> Iterator[Planned]:
        """The run's training steps from the cursor on, across epochs; each epoch's batches are drawn
        when the sender reaches them (it runs ahead of the steps completed)."""
        t, c = self.cfg.train, self.cursor
        trained, first = c.trained, c.batch
        for epoch in range(c.epoch, t.epochs):
            batches = epoch_batches(self.train_ids, t.batch_size, epoch, self.cfg.run.seed, t.drop_last)
            for b in range(first, len(batches)):
                if t.max_steps and trained >= t.max_steps:
                    return  # resumed from the checkpoint of the run's last training step
                end_of_run = (epoch == t.epochs - 1 and b == len(batches) - 1) or bool(
                    t.max_steps and trained + 1 >= t.max_steps
                )
                last = b == len(batches) - 1 or end_of_run
                checkpoint = self._checkpoint_due(epoch, last, trained)
                hold = checkpoint or (last and self._epoch_end_waits(epoch, end_of_run))
                yield Planned(epoch, b, batches[b], checkpoint, last, hold)
                trained += 1
            first = 0

    def save_point(self, reports: dict[str, messages_pb2.StepReport]) -> None:
        """Every party saved this step (its report names the file's digest): save the coordinator's
        own state, then write the manifest that makes the checkpoint usable."""
        missing = sorted(n for n, r in reports.items() if not r.checkpoint_sha256)
        if missing:
            raise RunFailed(f"step {self.cursor.step}: no checkpoint digest from {', '.join(missing)}")
        c = self.cursor
        c.metrics_bytes = self.metrics.offset()
        files = {n: r.checkpoint_sha256 for n, r in reports.items()}
        name = self.cfg.coordinator.name
        state = {
            "cursor": asdict(c),
            "side": self.side.state_dict(),
            "interception": self.side.host.interception.state(),
            "rng": checkpoints.global_rng_state(),
        }
        path = checkpoints.step_dir(self.run_dir, c.step) / f"{name}.pt"
        files[name] = checkpoints.save_state(path, state, f"the checkpoint of step {c.step}")
        checkpoints.write_manifest(
            self.run_dir, checkpoints.Manifest(self.cfg.run.id, c.step, c.epoch, files)
        )
        self.checkpointed.append(c.step)
        if len(self.checkpointed) > checkpoints.KEEP:
            checkpoints.prune(self.run_dir, self.checkpointed[-checkpoints.KEEP])

    def run(self) -> dict[str, Any]:
        steps = self._steps(messages_pb2.TRAIN, self._training_plan())
        try:
            return self._train(steps)
        finally:  # a failed or stopped run ends the steps still out
            steps.close()

    def _train(self, steps: Iterator[tuple[Sent, float]]) -> dict[str, Any]:
        t, c = self.cfg.train, self.cursor
        final: dict[str, Any] = {}
        per_epoch = self.plan()["steps_per_epoch"]
        if c.trained == 0:
            self.release("start")
        for epoch in range(c.epoch, t.epochs):
            c.epoch = epoch
            start = time.perf_counter()
            # the steps of this epoch still to run (none: resumed from a checkpoint at its end)
            due = c.batch < per_epoch and not (t.max_steps and c.trained >= t.max_steps)
            for sent, step_time in steps if due else ():
                h, reports = sent.cmd.header, sent.reports
                act = reports[self.cfg.active.name].metrics
                c.step, c.trained, c.batch = h.step, c.trained + 1, h.batch_id + 1
                c.loss_sum, c.correct, c.count = (
                    c.loss_sum + act["loss_sum"],
                    c.correct + act["correct"],
                    c.count + act["count"],
                )
                sent_bytes = {f"{n}/{m}": v for n, r in reports.items() for m, v in r.bytes_sent.items()}
                payload = {f"{n}/{m}": v for n, r in reports.items() for m, v in r.payload_bytes.items()}
                for k, v in sent_bytes.items():
                    c.bytes_sent[k] = c.bytes_sent.get(k, 0) + v
                for k, v in payload.items():
                    c.payload_bytes[k] = c.payload_bytes.get(k, 0) + v
                self.metrics.write(
                    {
                        "kind": "step",
                        "step": h.step,
                        "epoch": epoch,
                        "batch": h.batch_id,
                        "batch_size": len(sent.cmd.sample_ids),
                        "loss": act["loss_sum"] / act["count"],
                        "accuracy": act["correct"] / act["count"],
                        "step_time_s": step_time,
                        "checkpoint": sent.cmd.checkpoint_after,
                        "bytes_sent": sent_bytes,
                        "payload_bytes": payload,
                    }
                )
                if sent.cmd.checkpoint_after:
                    self.save_point(reports)
                if sent.planned.last:
                    break
            record = {
                "kind": "epoch",
                "epoch": epoch,
                "train_loss": c.loss_sum / max(c.count, 1),
                "train_accuracy": c.correct / max(c.count, 1),
                "time_s": time.perf_counter() - start,
                "steps": c.trained,
            }
            c.batch, c.loss_sum, c.correct, c.count = 0, 0.0, 0.0, 0.0
            last_epoch = epoch == t.epochs - 1 or bool(t.max_steps and c.trained >= t.max_steps)
            if self._evaluates(epoch, last_epoch):
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
            if self._predicts(last_epoch):
                self.predict(epoch)
            if last_epoch:
                break
        totals_bytes = dict(c.bytes_sent)
        for k, v in c.released_bytes.items():
            totals_bytes[k] = totals_bytes.get(k, 0) + v
        return {
            "final": final,
            "steps": c.trained,
            "bytes_sent": totals_bytes,
            "payload_bytes": c.payload_bytes,
        }

    def evaluate(self, epoch: int) -> dict[str, float]:
        loss_sum = correct = count = 0.0
        batches = [
            Planned(epoch, b, ids)
            for b, ids in enumerate(eval_batches(self.test_ids, self.cfg.train.eval_batch_size))
        ]
        for sent, _ in self._steps(messages_pb2.EVAL, batches):
            act = sent.reports[self.cfg.active.name].metrics
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
        batches = [
            Planned(epoch, b, batch) for b, batch in enumerate(eval_batches(ids, self.cfg.predict.batch_size))
        ]
        for sent, _ in self._steps(messages_pb2.PREDICT, batches):
            served += int(sent.reports[self.cfg.active.name].metrics["count"])
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
                released = self.cursor.released_bytes
                released[f"{r.owner}/{m}"] = released.get(f"{r.owner}/{m}", 0) + v
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
    cfg: Config,
    stubs: dict[str, services_pb2_grpc.PartyStub],
    reason: str,
    save: bool,
    timeout: float = 30,
    effects: dict[str, Any] | None = None,
) -> dict[str, str]:
    """Tell every party to stop, all at once, each within ``timeout``: one whose step waits on a dead
    peer abandons it (PartyHost.abandon), so no party's Shutdown waits on another's and when the run
    ends does not depend on the order the parties joined. Returns each party's checkpoint path by
    name (and, into ``effects``, what its attacks and defenses did)."""
    request = messages_pb2.ShutdownRequest(
        run_id=cfg.run.id, save_checkpoint=save, reason=reason, sender=cfg.coordinator.name
    )
    log.info("sending Shutdown to %s at once (each within %g s)", ", ".join(stubs) or "no party", timeout)
    calls = {name: stub.Shutdown.future(request, timeout=timeout) for name, stub in stubs.items()}
    paths = {}
    for name, call in calls.items():
        try:
            reply = call.result()
            paths[name] = reply.checkpoint
            if effects is not None and reply.effects:
                effects[name] = json.loads(reply.effects)
        except grpc.RpcError as exc:
            log.warning("shutdown of %s failed: %s", name, describe_rpc_error(exc))
    return paths


def write_atomic(path: Path, text: str, what: str) -> None:
    write_durable(path, text.encode(), what)


class CoordinatorHost:
    """The coordinator process's state: its protocol side, admission, and its interception."""

    def __init__(self, cfg: Config, run_dir: Path | None, bridge: Bridge) -> None:
        self.cfg, self.run_dir, self.bridge = cfg, run_dir, bridge
        self.name = cfg.coordinator.name
        self.interception = party_interception(cfg, self.name, run_dir or Path("."))
        self.side = PROTOCOLS.get(cfg.protocol.kind).coordinator(self)
        self.admission = Admission(cfg, self.side, align=self.align if cfg.alignment_phase else None)

    def align(self, joined: dict[str, messages_pb2.JoinRequest]) -> Aligned:
        """The alignment phase with every party, on this process's channels (its interceptors, trace and
        chunking), within the admission's deadline; a resumed run takes the alignment it recorded."""
        method = self.cfg.alignment.method
        if self.admission.resume_from is not None:
            return alignment.load(self.run_dir or Path("."), method)
        channels = {
            n: self.bridge.open_channel(r.address, self.name, self.interception.chain, n)
            for n, r in joined.items()
        }
        hdr = lambda: header(self.cfg, self.name, 0, 0, 0, messages_pb2.PHASE_UNSPECIFIED, 0)  # noqa: E731
        start, cpu = time.perf_counter(), time.process_time()
        try:
            stubs = {n: services_pb2_grpc.PartyStub(c) for n, c in channels.items()}
            aligned = alignment.align(self.cfg, stubs, hdr, self.cfg.transport.join_timeout_s)
        finally:  # the schedule opens its own
            for channel in channels.values():
                channel.close()
        aligned = replace(aligned, seconds=time.perf_counter() - start, cpu_s=time.process_time() - cpu)
        log.info(
            "aligned by %s in %.1f s: %d common of %s",
            method,
            aligned.seconds,
            aligned.n_common,
            aligned.held,
        )
        alignment.save(self.run_dir or Path("."), aligned, method)
        return aligned

    def join(self, req: messages_pb2.JoinRequest, context: Any) -> messages_pb2.JoinReply:
        self.admission.admit(req, context)
        wait_for(
            self.admission.complete,
            self.cfg.transport.join_timeout_s,
            "the rest of the roster to join (transport.join_timeout_s)",
        )
        if self.admission.failure is not None:
            raise self.admission.refused()
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


class Interrupted(Exception):
    """SIGTERM: stop the run, saying so in summary.json."""


def _interrupt(signum: int, frame: Any) -> None:
    # the first signal is the one recorded: a second (Ctrl-C reaches the process group, then the
    # launcher passes it on) must not cut the unwinding or summary.json short
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    raise Interrupted(f"stopped by signal {signal.Signals(signum).name}")


def resume_point(cfg: Config, run_dir: Path, name: str) -> tuple[checkpoints.Manifest, dict[str, Any]] | None:
    """The newest valid coordinated checkpoint of this run directory and the coordinator's state in it."""
    if not PROTOCOLS.get(cfg.protocol.kind).resumable:
        raise RunFailed(
            f"protocol {cfg.protocol.kind!r} cannot resume from a checkpoint (docs/reliability.md)"
        )
    manifest, skipped = checkpoints.newest_valid(run_dir, cfg.run.id, name)
    for why in skipped:
        log.warning("skipping checkpoint %s", why)
    if manifest is None and skipped:
        raise checkpoints.CheckpointInvalid(checkpoints.none_valid(skipped))
    if manifest is None:
        log.warning("no checkpoint in %s: the run starts from the beginning", run_dir)
        return None
    state = checkpoints.load_state(
        checkpoints.step_dir(run_dir, manifest.step) / f"{name}.pt", manifest.files[name]
    )
    checkpoints.drop_after(run_dir, manifest.step)
    log.info("resuming run %s after step %d (epoch %d)", cfg.run.id, manifest.step, manifest.epoch)
    return manifest, state


def _effects_into(
    summary: dict[str, Any], host: CoordinatorHost, run_dir: Path, reports: dict[str, Any], check: bool
) -> int:
    """Every role's counts of what its attacks and defenses did into ``summary["effects"]``; with
    ``check``, a run in which one acted zero times fails (exit code 1) naming each."""
    host.interception.finish(run_dir)  # its own attacks' outputs: their samples count
    effects = merge_effects({host.name: host.interception.effects_report(), **reports})
    for entry in [*host.cfg.attacks, *host.cfg.defenses]:
        if entry.party != host.name and entry.party not in reports:
            key = f"{entry.name}@{entry.party}"
            effects["never_acted"].setdefault(key, f"{key}: {entry.party} sent no counts at Shutdown")
    summary["effects"] = effects
    if not check or not effects["never_acted"]:
        return 0
    error = "never acted: " + "; ".join(effects["never_acted"].values())
    log.error("run failed: %s", error)
    summary.update(status="failed", error=error)
    return 1


def main(cfg: Config, run_dir: Path, listen: str, bridge: Bridge, resume: bool = False) -> int:
    """The coordinator's process; a file it cannot write (summary.json on a full disk, or its address
    before the run starts) ends it with that one line, naming the file."""
    try:
        return _main(cfg, run_dir, listen, bridge, resume)
    except (RunFailed, WriteFailed) as exc:
        log.error("run failed: %s", exc)
        return 1


def _main(cfg: Config, run_dir: Path, listen: str, bridge: Bridge, resume: bool) -> int:
    summary: dict[str, Any] = {"run_id": cfg.run.id, "status": "failed", "started": time.time()}
    try:
        restored = resume_point(cfg, run_dir, cfg.coordinator.name) if resume else None
    except (RunFailed, checkpoints.CheckpointInvalid) as exc:
        log.error("cannot resume: %s", exc)
        summary["error"] = f"cannot resume: {exc}"
        write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2), "the summary")
        return 2
    host = CoordinatorHost(cfg, run_dir, bridge)
    admission, name = host.admission, host.name
    if restored is not None:
        admission.resume_from = restored[0]
        summary["resumed_from_step"] = restored[0].step
    server = bridge.make_server(name, host.interception.chain)
    host.add_services(server)
    address = bridge.bind(server, name, listen)
    server.start()
    write_atomic(run_dir / "coordinator.addr", address, "the coordinator's address")
    log.info(
        "coordinator of run %s serving on %s; waiting for %d parties",
        cfg.run.id,
        address,
        len(cfg.parties) - 1,
    )

    cursor = Cursor(**restored[1]["cursor"]) if restored is not None else None
    # a resumed run keeps metrics.jsonl up to its checkpoint (all of it is redone without one)
    metrics = MetricsLog(run_dir / "metrics.jsonl", cursor.metrics_bytes if cursor else 0 if resume else None)
    stubs: dict[str, services_pb2_grpc.PartyStub] = {}
    watch = PartyWatch(cfg.transport, bridge, name)  # heartbeats to every party while the schedule runs
    start = time.perf_counter()
    # SIGTERM (vflnet run's teardown, docker stop) and SIGINT (Ctrl-C reaches the whole process group);
    # only a process's main thread may set handlers (the loopback bridge runs roles in threads)
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if not admission.complete.wait(cfg.transport.join_timeout_s):
            missing = sorted({p.name for p in cfg.parties if p.role != "coordinator"} - set(admission.joined))
            raise RunFailed(
                f"parties never joined within transport.join_timeout_s ({cfg.transport.join_timeout_s:g} s): "
                f"{', '.join(missing)}; on a loaded machine starting them may take longer: raise "
                "transport.join_timeout_s"
            )
        if admission.failure is not None:
            raise RunFailed(f"at admission: {admission.failure}")
        assert admission.reply is not None
        summary["step_deadline_s"] = admission.reply.step_deadline_s
        allow_step_deadline(server, admission.reply.step_deadline_s)
        for info in admission.reply.roster:
            stubs[info.name] = services_pb2_grpc.PartyStub(
                bridge.open_channel(info.address, name, host.interception.chain, info.name)
            )
        deliver_server_knowledge(cfg, host.interception.knowledge, admission.reply, admission.joined)
        host.side.start(admission.joined)
        if resume and restored is None:  # no checkpoint yet: the run starts from its first step again
            host.interception.start_over()
        if restored is not None:
            host.side.load_state_dict(restored[1]["side"])
            assert cursor is not None
            host.interception.load_state(restored[1]["interception"], cursor.step)
            checkpoints.restore_global_rng(restored[1]["rng"])
        schedule = Schedule(cfg, stubs, metrics, admission.reply, host.side, run_dir, cursor)
        write_atomic(run_dir / "plan.json", json.dumps(schedule.plan()), "the plan")
        with watch.watching(admission.reply.roster, schedule.abort):
            result = schedule.run()
        summary.update(result, status="completed")
        summary.update(host.side.finish())
        reports: dict[str, Any] = {}
        summary["checkpoints"] = shutdown_all(cfg, stubs, "run completed", save=True, effects=reports)
        return _effects_into(summary, host, run_dir, reports, check=True)
    except (RunFailed, WriteFailed) as exc:  # WriteFailed: its metrics or checkpoint on a full disk
        log.error("run failed: %s", exc)
        summary["error"] = str(exc)
        reports = {}
        alive = watch.alive(stubs)
        summary["checkpoints"] = shutdown_all(cfg, alive, f"run failed: {exc}", save=True, effects=reports)
        _effects_into(summary, host, run_dir, reports, check=False)
        return 1
    except Interrupted as exc:
        log.error("run interrupted: %s", exc)
        summary.update(status="interrupted", error=str(exc))
        # before anything can hang
        write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2), "the summary")
        # brief: parties being stopped beside it (vflnet run, docker stop) must not hold it up
        shutdown_all(cfg, stubs, f"run interrupted: {exc}", save=False, timeout=2)
        return 143
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        summary["wall_time_s"] = time.perf_counter() - start
        try:
            host.interception.finish(run_dir)
            write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2), "the summary")
        except WriteFailed as exc:  # the run's own cause first: the launcher shows this one line
            cause = summary.get("error")
            raise RunFailed(f"{cause}; and {exc}" if cause else str(exc)) from exc
        finally:
            metrics.close()
            stop_server(server, grace=2)
