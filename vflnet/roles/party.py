"""A party process (active or passive): the generic host its protocol side plugs into.

The host loads the party's own data, builds its model, joins the coordinator, checks every step
command, meters what the party sends, checkpoints, takes part in model releases and serves. What the
party does within a step, and which services it offers beyond ``Party``, is its protocol side's
(vflnet/protocols/): the host never branches on the protocol.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from vflnet.config import Config
from vflnet.data.datasets import load_dataset
from vflnet.data.partition import PartyData, normalize, party_view
from vflnet.data.plan import plan_facts, refusal
from vflnet.models.device import resolve_device
from vflnet.models.zoo import build_party_modules
from vflnet.roles import checkpoints
from vflnet.roles.common import Liveness
from vflnet.roles.heartbeat import watch_coordinator
from vflnet.roles.step_order import STEPS_IN_FLIGHT, StepTurns
from vflnet.sdk.bridge import Bridge, add_handlers, allow_step_deadline
from vflnet.sdk.contract import PROTOCOLS, PartySide
from vflnet.shared_config import shared_json
from vflnet.threat.interception import party_interception
from vflnet.threat.release import accept_release
from vflnet.v1 import messages_pb2, services_pb2_grpc
from vflnet.wire.channels import stop_server
from vflnet.wire.checks import JoinWaitroom, check_run, check_sender, header
from vflnet.wire.errors import RpcFailure, describe_rpc_error, shown
from vflnet.wire.meter import Meter

log = logging.getLogger("vflnet.party")

RUN_STEP = "/vflnet.v1.Party/RunStep"
SHUTDOWN = "/vflnet.v1.Party/Shutdown"
RELEASE_MODEL = "/vflnet.v1.Party/ReleaseModel"
RECEIVE_MODEL = "/vflnet.v1.Party/ReceiveModel"
LOST_COORDINATOR = 3  # a party's exit code when it stopped without the coordinator's Shutdown


class PartyHost:
    log = log

    def __init__(self, cfg: Config, name: str, run_dir: Path, bridge: Bridge, resume: bool = False) -> None:
        self.cfg = cfg
        self.resume = resume  # may continue from the checkpoint the coordinator names on admission
        self.me = cfg.party(name)
        self.name = name
        self.role = self.me.role
        self.run_dir = run_dir
        self.bridge = bridge
        self.meter = Meter()
        self.liveness = Liveness(cfg.transport.idle_timeout_s)
        self.ready = threading.Event()
        # messages before it is ready, at most one per step in flight from each sender
        self.waitroom = JoinWaitroom(self.ready, name, per_sender=STEPS_IN_FLIGHT)
        dataset = load_dataset(cfg.data.dataset, cfg.data.params)
        self.is_image = dataset.is_image
        self.data: PartyData = party_view(cfg, name, dataset)
        self.join_reply: messages_pb2.JoinReply = messages_pb2.JoinReply()
        self.step_lock = threading.Lock()  # one step at a time per party
        self.turns = StepTurns()  # steps in order, also when the next command arrives early
        self.replies: dict[bytes, messages_pb2.StepReport] = {}  # the latest steps' reports: answer a retry
        self.saved_steps: list[int] = []  # this party's coordinated checkpoints, oldest first
        self.current: messages_pb2.Header = messages_pb2.Header()
        self.interception = party_interception(cfg, name, run_dir)
        self.coordinator_channel: grpc.Channel | None = None
        self.channels: list[grpc.Channel] = []  # every channel it opened: closed when it stops (abandon)
        self.stopping: str | None = None  # why the party is stopping, once it is
        self.side: PartySide = PROTOCOLS.get(cfg.protocol.kind).side(self.role)(self)
        input_shape = tuple(self.data.x.shape[1:]) if self.data.x is not None else None
        bottom, top = build_party_modules(cfg, self.me, input_shape, self.data.n_classes)
        device = resolve_device(cfg.device(self.me))  # before the optimizer sees the parameters
        self.local = self.side.make_local(
            {k: m.to(device) for k, m in (("bottom", bottom), ("top", top)) if m is not None}
        )

    # ------------------------------------------------------------------------------- setup
    def channel(self, address: str, peer: str) -> grpc.Channel:
        """A client channel to roster party ``peer`` at ``address``, with this party's interceptor chain
        on it (under TLS the server must hold ``peer``'s certificate)."""
        channel = self.bridge.open_channel(address, self.name, self.interception.chain, peer)
        self.channels.append(channel)
        return channel

    @property
    def step_deadline_s(self) -> float:
        """The deadline of every RPC and wait within a step: the coordinator's, from the parties' work
        estimates (vflnet/sdk/deadlines.py); before admission, the config's floor."""
        return self.join_reply.step_deadline_s or self.cfg.transport.rpc_timeout_s

    def header(self, h: messages_pb2.Header) -> messages_pb2.Header:
        """The header of a message this party sends within the step (or phase) of ``h``."""
        return header(self.cfg, self.name, h.step, h.epoch, h.batch_id, h.phase, self.local.version)

    def model_spec(self, module: str) -> dict[str, Any]:
        """A module's architecture as the run config gives it (for a model release)."""
        cfg = self.cfg.model.top if module == "top" else self.me.bottom
        shape = list(self.data.x.shape[1:]) if module == "bottom" and self.data.x is not None else None
        return {"config": dataclasses.asdict(cfg) if cfg is not None else None, "input_shape": shape}

    def join(self, coordinator: str, advertise: str, server: Any) -> messages_pb2.JoinReply:
        self.coordinator_channel = self.channel(coordinator, self.cfg.coordinator.name)
        stub = services_pb2_grpc.CoordinatorStub(self.coordinator_channel)
        req = messages_pb2.JoinRequest(
            run_id=self.cfg.run.id,
            name=self.name,
            role=self.role,
            address=advertise,
            sample_ids=self.data.ids,
            resume=self.resume,
            step_work_s=self.side.step_work_s(),
            config=shared_json(self.cfg),
        )
        self.side.join_request(req)
        deadline = time.monotonic() + self.cfg.transport.join_timeout_s
        while True:  # the coordinator may still be starting: retry until the join deadline
            try:
                reply = stub.Join(req, timeout=max(1.0, deadline - time.monotonic()), wait_for_ready=True)
                break
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{self.name}: not admitted by coordinator at {coordinator} within "
                        f"transport.join_timeout_s ({self.cfg.transport.join_timeout_s:g} s; raise it on a "
                        f"loaded machine): {describe_rpc_error(exc)}"
                    ) from exc
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise RuntimeError(
                        f"{self.name}: join refused by coordinator at {coordinator}: {describe_rpc_error(exc)}"
                    ) from exc
                time.sleep(0.5)
        allow_step_deadline(server, reply.step_deadline_s)  # before anything can start the first step
        self.check_labels(reply)
        self.prepare(reply)
        log.info(
            "%s joined run %s: %d train / %d test samples",
            self.name,
            reply.run_id,
            len(reply.train_ids),
            len(reply.test_ids),
        )
        return reply

    def check_labels(self, reply: messages_pb2.JoinReply) -> None:
        """The check of the run's plan that only the label holder can make, on the split it is given:
        the training labels hold more than one class (vflnet/data/plan.py)."""
        if self.data.y is None:
            return
        train = np.asarray(reply.train_ids, dtype=np.int64)
        labels = self.data.y[self.data.rows(train)]
        why = refusal(self.cfg, plan_facts(self.cfg, {}, train, np.asarray(reply.test_ids), labels))
        if why is not None:
            raise RuntimeError(f"{self.name}: {why}")

    def prepare(self, reply: messages_pb2.JoinReply) -> None:
        """Admission is done: normalise the features over the training rows, let the side open its channels."""
        self.join_reply = reply
        if self.data.x is not None:
            # an attack controlling this party's raw data (backdoor trigger) rewrites it before normalising
            self.data.x = self.interception.own_data(self.data.ids, self.data.x)
            train_rows = self.data.rows(np.asarray(reply.train_ids, dtype=np.int64))
            self.data.x = normalize(self.data.x, train_rows, self.cfg.data.normalize, self.is_image)
        self.side.joined(reply)
        if reply.resume_step:
            self.restore(reply)
        elif self.resume:  # no checkpoint yet: the run starts from its first step again
            self.interception.start_over()
        self.liveness.touch()
        self.ready.set()

    def add_services(self, server: Any) -> None:
        add_handlers(
            server,
            {
                RUN_STEP: self.run_step,
                SHUTDOWN: self.shutdown,
                RELEASE_MODEL: lambda req, ctx: self.release_model(req, ctx),
                RECEIVE_MODEL: lambda req, ctx: self.receive_model(req, ctx),
            },
        )
        self.side.add_services(server)

    # ---------------------------------------------------------------------------- per step
    @property
    def last_step(self) -> int:
        """The last step this party completed."""
        return self.turns.done

    def begin_step(self, cmd: messages_pb2.StepCommand) -> np.ndarray:
        """Checks shared by every protocol at the start of a step, all before any effect; returns this
        party's rows. Steps are numbered 1, 2, ... across phases, so only the next one is accepted: a
        replayed or stale step, or one from the future that would park the party, is refused."""
        expected = self.last_step + 1
        if cmd.header.step != expected:
            why = "is stale" if cmd.header.step <= self.last_step else "is out of order"
            raise RpcFailure(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"step {cmd.header.step} {why}: step {self.last_step} is done, {expected} is next",
            )
        if len(cmd.sample_ids) == 0:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, "a step needs at least one sample id")
        try:
            rows = self.data.rows(np.asarray(cmd.sample_ids, dtype=np.int64))
        except KeyError as exc:
            raise RpcFailure(grpc.StatusCode.INVALID_ARGUMENT, str(exc.args[0] if exc.args else exc)) from exc
        self.current = cmd.header
        self.local.enter_epoch(cmd.header.epoch)
        return rows

    def _from_coordinator(self, h: messages_pb2.Header, context: Any) -> None:
        """Run id, sender (under TLS: its certificate) and role are checked before anything happens; only
        then does the message count as a sign of life from the coordinator."""
        check_run(self.cfg, h.run_id)
        check_sender(self.cfg, h.sender, {"coordinator"}, context)
        self.waitroom.wait(h.sender, context, self.step_deadline_s)
        self.liveness.touch()

    def run_step(self, cmd: messages_pb2.StepCommand, context: Any = None) -> messages_pb2.StepReport:
        self._from_coordinator(cmd.header, context)
        self.turns.wait(cmd.header.step, self.step_deadline_s)  # the step before it may still run
        with self.step_lock:
            # the step id (its whole header) again: a retry after a lost reply; the step is done, so it
            # is answered from the stored report instead of being refused as stale
            wire = cmd.header.SerializeToString(deterministic=True)
            if wire in self.replies:
                log.info("%s: step %d retried; answering from the stored report", self.name, cmd.header.step)
                return self.replies[wire]
            rows = self.begin_step(cmd)
            try:
                metrics = self.side.step(cmd, rows)
            except BaseException as exc:
                self.turns.fail()
                if self.stopping is not None:
                    log.warning(
                        "%s: step %d abandoned: %s (%s)", self.name, cmd.header.step, self.stopping, exc
                    )
                raise
            report = messages_pb2.StepReport(header=self.header(cmd.header), metrics=metrics)
            if cmd.checkpoint_after:
                report.checkpoint_sha256 = self.save_resume_point(cmd.header)
            self.side.report(cmd, report)
            self.meter.record(
                "RunStep.reply", report
            )  # with what the protocol added (param-server: the upload)
            sent, payload = self.meter.take()
            report.bytes_sent.update(sent)
            report.payload_bytes.update(payload)
            self.replies[wire] = report
            while len(self.replies) > STEPS_IN_FLIGHT:
                del self.replies[next(iter(self.replies))]
        # after the lock is free: the next step's command, if waiting, takes it at once
        self.turns.complete(cmd.header.step)
        return report

    # ----------------------------------------------------------------------- model release
    def release_model(self, cmd: messages_pb2.ReleaseCommand, context: Any) -> messages_pb2.ReleaseAck:
        """The coordinator's order to hand ``cmd.modules`` to ``cmd.recipient`` (the config's model_release)."""
        self._from_coordinator(cmd.header, context)
        granted = {
            m
            for r in self.cfg.model_release
            if r.owner == self.name and r.recipient == cmd.recipient
            for m in r.modules
        }
        if not set(cmd.modules) <= granted or not cmd.modules:
            raise RpcFailure(
                grpc.StatusCode.PERMISSION_DENIED,
                f"the run config grants {shown(cmd.recipient)} {sorted(granted) or 'no'} modules of {self.name}'s "
                f"model; the command asks for {shown(', '.join(cmd.modules))}",
            )
        # the recipient's address comes from the roster, never from the command
        if cmd.recipient == self.cfg.coordinator.name:
            channel = self.coordinator_channel
        else:
            roster = {p.name: p.address for p in self.join_reply.roster}
            channel = self.channel(roster[cmd.recipient], cmd.recipient)
        with self.step_lock:
            missing = [m for m in cmd.modules if m not in self.local.modules]
            if missing:
                raise RpcFailure(
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"{self.name} has no module(s) {shown(', '.join(missing))} to release",
                )
            params, spec = self.side.release(list(cmd.modules))
            msg = messages_pb2.ModelRelease(
                header=self.header(cmd.header), modules=cmd.modules, parameters=params, spec=json.dumps(spec)
            )
            self.meter.record("ReceiveModel", msg)
            service = (
                services_pb2_grpc.CoordinatorStub
                if cmd.recipient == self.cfg.coordinator.name
                else services_pb2_grpc.PartyStub
            )
            stub = service(channel)
            try:
                stub.ReceiveModel(msg, timeout=self.step_deadline_s)
            except grpc.RpcError as exc:
                raise RpcFailure(
                    grpc.StatusCode.ABORTED,
                    f"{cmd.recipient} refused the model release: {describe_rpc_error(exc)}",
                ) from exc
            log.info("%s released %s to %s", self.name, list(cmd.modules), cmd.recipient)
            sent, _ = self.meter.take()
            return messages_pb2.ReleaseAck(header=self.header(cmd.header), bytes_sent=sent)

    def receive_model(self, msg: messages_pb2.ModelRelease, context: Any) -> messages_pb2.ReleaseAck:
        accept_release(self.cfg, self.name, msg, context, self.interception.knowledge)
        return messages_pb2.ReleaseAck(header=self.header(msg.header))

    # --------------------------------------------------------------------------- lifecycle
    def checkpoint_path(self) -> Path:
        return self.run_dir / "checkpoints" / f"{self.name}.pt"

    def save_resume_point(self, h: messages_pb2.Header) -> str:
        """This party's part of the coordinated checkpoint of step ``h.step``: everything it needs to
        continue after it (model, optimizer and schedule, RNG and generator states, the protocol side's
        and the attacks' state, the trace's length). Returns the file's SHA-256 for the manifest."""
        state = {
            "step": h.step,
            "epoch": h.epoch,
            "local": self.local.state(),
            "side": self.side.state_dict(),
            "generators": checkpoints.generator_states(self.side),
            "rng": checkpoints.global_rng_state(),
            "interception": self.interception.state(),
        }
        path = checkpoints.step_dir(self.run_dir, h.step) / f"{self.name}.pt"
        digest = checkpoints.save_state(path, state, f"the checkpoint of step {h.step}")
        self.saved_steps.append(h.step)
        checkpoints.prune_after_party_save(self.run_dir, self.saved_steps)
        return digest

    def restore(self, reply: messages_pb2.JoinReply) -> None:
        """Continue from the checkpoint the coordinator resumes from (its manifest names our file's digest)."""
        step = reply.resume_step
        if not self.resume:
            raise RuntimeError(
                f"{self.name}: the coordinator resumes run {reply.run_id} from the checkpoint of step {step}; "
                "start this party with --resume"
            )
        if self.name not in reply.resume_sha256:
            raise RuntimeError(f"{self.name}: the resume manifest of step {step} has no file of this party")
        path = checkpoints.step_dir(self.run_dir, step) / f"{self.name}.pt"
        try:
            state = checkpoints.load_state(path, reply.resume_sha256[self.name])
        except checkpoints.CheckpointInvalid as exc:
            raise RuntimeError(f"{self.name}: cannot resume: {exc}") from exc
        self.local.load_state(state["local"])
        self.side.load_state_dict(state["side"])
        checkpoints.restore_generators(self.side, state["generators"])
        self.interception.load_state(state["interception"], int(state["step"]))
        checkpoints.restore_global_rng(state["rng"])  # last: nothing may draw from them before step 1
        self.turns.complete(int(state["step"]))
        self.saved_steps = [self.last_step]
        checkpoints.drop_after(self.run_dir, self.last_step)
        log.info("%s resumes after step %d (epoch %d)", self.name, self.last_step, state["epoch"])

    def save_checkpoint(self) -> str:
        path = self.checkpoint_path()
        self.side.checkpoint(path)
        return str(path)

    def shutdown(self, req: messages_pb2.ShutdownRequest, context: Any = None) -> messages_pb2.ShutdownReply:
        """The final model (``checkpoints/<name>.pt``), attack outputs and predictions, then exit."""
        check_run(self.cfg, req.run_id)
        check_sender(self.cfg, req.sender, {"coordinator"}, context)
        log.info("%s: shutdown requested (%s)", self.name, req.reason)
        self.abandon(req.reason)
        try:
            with self.step_lock:  # never save a half-applied update
                self.side.finish()
                path = self.save_checkpoint() if req.save_checkpoint else ""
                for written in self.interception.finish(self.run_dir):
                    log.info("%s: attack output %s", self.name, written)
        finally:  # a file it cannot write (a full disk) fails the reply, naming the file; it exits all the same
            self.liveness.shutdown.set()
        # what its attacks and defenses did travels to the coordinator (summary.json) in the reply
        effects = json.dumps(self.interception.effects_report())
        log.info("%s: shut down%s", self.name, f"; final model {path}" if path else "")
        return messages_pb2.ShutdownReply(checkpoint=path, effects=effects)

    def abandon(self, reason: str) -> None:
        """The run is ending: nothing this party waits on may hold it up. Steps queued behind the
        current one stop waiting, the side releases its own waits, and closing every channel this
        party opened ends any call still out to a peer (one that waits on a dead party, or is dead),
        so the current step fails at once, before its update, and the step lock comes free."""
        self.stopping = reason
        self.turns.stop(reason)
        self.side.stop(reason)
        for channel in self.channels:
            channel.close()


def serve(host: PartyHost, listen: str, coordinator: str, advertise: str) -> int:
    """Serve, join the run, and stay up until the coordinator says shutdown (or goes silent)."""
    server = host.bridge.make_server(host.name, host.interception.chain)
    host.add_services(server)
    address = host.bridge.bind(server, host.name, listen, advertise)
    server.start()
    log.info("%s (%s) serving, advertised as %s", host.name, host.role, address)
    try:
        host.join(coordinator, address, server)
    except RuntimeError as exc:
        log.error("%s", exc)
        server.stop(grace=0)
        return 2
    heartbeat = watch_coordinator(
        host.cfg, host.name, host.bridge, host.liveness, coordinator
    )  # a dead coordinator ends the wait below
    why = host.liveness.wait()
    if heartbeat is not None:
        heartbeat.stop()
    if why != "shutdown":
        log.error("%s: stopping: %s", host.name, why)
        host.abandon(why)  # a step waiting on a peer must not hold the process up
    stop_server(server, grace=2)
    return 0 if why == "shutdown" else LOST_COORDINATOR
