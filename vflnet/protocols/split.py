"""Plaintext split learning: the `split` protocol.

Per step the coordinator sends every party the batch IDs. Each passive party runs its bottom model and
sends its embeddings to the active party (``Active/ExchangeEmbeddings``); the active party waits for
all of them, aggregates them with its own embedding (if any), runs the top model and the loss,
answers each passive party with the gradient of the loss w.r.t. that party's embeddings, then steps its
own optimizer while each passive party backpropagates its gradient and steps its own. Evaluation and
prediction steps run the same exchange forward only (prediction without labels: the active party
keeps the model output, the confidence vector, per sample).

The compute of each role (``PassiveSplit``, ``ActiveSplit``) knows no transport; the sides
(``SplitPassive``, ``SplitActive``) carry it over the wire. split-he and param-server reuse the sides.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from vflnet.protocols.predictions import PredictionsKeeper
from vflnet.sdk import (
    PROTOCOLS,
    CoordinatorSide,
    LabelDefense,
    LocalModel,
    MessageTooLarge,
    OwnStepView,
    PartySide,
    Protocol,
    StepMailbox,
    TopModel,
    aggregate,
    attach_labels,
    call,
    check_and_meter,
    from_proto,
    handles,
    invalid,
    malformed,
    soft_cross_entropy,
    to_proto,
)
from vflnet.v1 import messages_pb2

EXCHANGE = "/vflnet.v1.Active/ExchangeEmbeddings"


# ------------------------------------------------------------------------------- compute
class PassiveSplit:
    def __init__(self, local: LocalModel) -> None:
        self.local = local
        self.bottom = local.modules["bottom"]
        self._pending: torch.Tensor | None = None

    def forward(self, x: np.ndarray, train: bool) -> np.ndarray:
        self.local.train(train)
        with torch.set_grad_enabled(train):
            emb = self.bottom(torch.from_numpy(x).to(self.local.device))
        self._pending = emb if train else None
        return emb.detach().cpu().numpy()

    def backward(self, grad: np.ndarray) -> None:
        if self._pending is None:
            raise RuntimeError("backward without a training forward pass")
        emb, self._pending = self._pending, None
        emb.backward(torch.from_numpy(grad).to(emb.device))
        self.local.apply_update()


@dataclass
class StepResult:
    grads: list[np.ndarray]  # one per received embedding, same order
    loss_sum: float
    correct: int
    count: int
    logits: np.ndarray


def label_loss(logits: torch.Tensor, target: torch.Tensor, defense: LabelDefense | None) -> torch.Tensor:
    """Cross-entropy, against the defense's training targets when it has its own (CAE's soft labels)."""
    if defense is None:
        return F.cross_entropy(logits, target)
    return soft_cross_entropy(logits, defense.train_targets(target))


def predict(logits: torch.Tensor, defense: LabelDefense | None) -> torch.Tensor:
    return logits.argmax(dim=1) if defense is None else defense.predict(logits)


def outcome(
    logits: torch.Tensor,
    loss: torch.Tensor | None,
    y: np.ndarray | None,
    defense: LabelDefense | None,
    grads: list[np.ndarray],
) -> StepResult:
    """A step's result; without labels (prediction) it only carries the logits."""
    n = logits.shape[0]
    out = logits.detach().cpu().numpy()
    if y is None or loss is None:
        return StepResult(grads, 0.0, 0, n, out)
    if defense is None:  # argmax as torch's (the first of equal maxima), on the copy at hand
        correct = int(np.count_nonzero(out.argmax(axis=1) == y))
    else:
        correct = int((predict(logits.detach(), defense).cpu() == torch.from_numpy(y)).sum())
    return StepResult(grads, float(loss.detach()) * n, correct, n, out)


class ActiveSplit:
    def __init__(self, local: LocalModel, aggregation: str, defense: LabelDefense | None = None) -> None:
        self.local = local
        self.defense = defense
        self.bottom: nn.Module | None = local.modules.get("bottom")
        self.top: TopModel = local.modules["top"]  # type: ignore[assignment]
        self.aggregation = aggregation

    def step(
        self, x_own: np.ndarray | None, received: list[np.ndarray], y: np.ndarray | None, train: bool
    ) -> StepResult:
        """One step up to the gradients it sends; ``y`` is None in a prediction step (no loss, no
        gradients). A training step's own update is ``update``, once those gradients are out."""
        train = train and y is not None
        self.local.train(train)
        with torch.set_grad_enabled(train):
            device = self.local.device  # on the CPU, .to() is the tensor itself: no copy
            inputs = [torch.from_numpy(e).to(device).requires_grad_(train) for e in received]
            target = None if y is None else torch.from_numpy(y).to(device)
            parts, penalty = (
                (inputs, None) if self.defense is None else self.defense.embeddings(inputs, target)
            )
            parts = list(parts)
            if self.bottom is not None:
                assert x_own is not None
                parts.insert(0, self.bottom(torch.from_numpy(x_own).to(device)))
            logits = self.top(aggregate(parts, self.aggregation))
            loss = None if target is None else label_loss(logits, target, self.defense)
            if loss is not None and penalty is not None:
                loss = loss + penalty
            grads = []
            if train:
                assert loss is not None and target is not None
                noise = None if self.defense is None else self.defense.gradient_noise(logits)
                loss.backward(retain_graph=noise is not None)
                sent = [t.grad for t in inputs]
                if noise is not None:  # GradPerturb: on what is sent only, not on this party's update
                    sent = [g + n for g, n in zip(sent, torch.autograd.grad(noise, inputs), strict=True)]
                grads = [self._outgoing(g, target) for g in sent]
        return outcome(logits, loss, y, self.defense, grads)

    def update(self) -> None:
        """The optimizer step of a training step's gradients."""
        self.local.apply_update()

    def _outgoing(self, grad: torch.Tensor | None, target: torch.Tensor) -> np.ndarray:
        """The gradient as it leaves this party: after the defense's transform, if any."""
        assert grad is not None
        if self.defense is not None:
            grad = self.defense.transform(grad, target).to(torch.float32)
        return grad.cpu().numpy()


# --------------------------------------------------------------------------------- sides
class SplitPassive(PartySide):
    """Send embeddings, backpropagate the gradient the active party returns."""

    def joined(self, reply: messages_pb2.JoinReply) -> None:
        self.compute = self.make_compute()
        active = next(p for p in reply.roster if p.role == "active")
        self.active, self.active_channel = active.name, self.host.channel(active.address, active.name)

    def make_compute(self) -> Any:
        return PassiveSplit(self.host.local)

    def own_model(self) -> nn.Module:
        """A copy of the model whose output this party sends (its own view's ``model``), taken before
        the update."""
        return copy.deepcopy(self.host.local.modules["bottom"])

    def encode(self, msg: messages_pb2.Embeddings, emb: Any) -> None:
        to_proto(emb, into=msg.values)

    def decode_gradient(self, reply: messages_pb2.EmbeddingGradients, shape: tuple[int, ...]) -> Any:
        if reply.WhichOneof("payload") != "values":
            raise invalid("split expects plaintext gradients from the active party")
        return from_proto(
            reply.values, expect_dtype="float32", expect_shape=shape, what="gradients from the active party"
        )

    def step(self, cmd: messages_pb2.StepCommand, rows: np.ndarray) -> dict[str, float]:
        host, h = self.host, cmd.header
        assert host.data.x is not None
        train = h.phase == messages_pb2.TRAIN
        start = time.perf_counter()
        own_view = train and host.interception.wants_own_view
        snapshot = self.own_model() if own_view else None
        host.local.keep_last_grads = own_view
        emb = self.compute.forward(host.data.x[rows], train)
        msg = messages_pb2.Embeddings(header=host.header(h), sample_ids=cmd.sample_ids)
        self.encode(msg, emb)
        reply = call(host, self.active_channel, self.active, EXCHANGE, msg)
        if reply.header.step != h.step:
            raise malformed(f"gradients for step {reply.header.step}, expected {h.step}")
        if train:
            self.compute.backward(self.decode_gradient(reply, tuple(emb.shape)))
        if own_view:
            grads = {
                n.removeprefix("bottom."): g
                for n, g in host.local.last_grads.items()
                if n.startswith("bottom.")
            }
            host.interception.deliver_own_view(
                OwnStepView(
                    h.step,
                    np.asarray(cmd.sample_ids, dtype=np.int64),
                    host.data.x[rows],
                    snapshot,
                    grads,
                    int(emb.shape[1]),
                )
            )
        return {"compute_s": time.perf_counter() - start}


class SplitActive(PartySide):
    """Gather every passive party's embeddings for the step the coordinator announced, run the top
    model, answer each passive party with its gradient; keep per-sample predictions."""

    def __init__(self, host: Any) -> None:
        super().__init__(host)
        cfg = self.cfg
        self.passives = [p.name for p in cfg.passives]
        self.embedding_dims = {p.name: p.bottom.out for p in cfg.passives if p.bottom is not None}
        # every passive party's embeddings of a step, answered with its gradients
        self.mailbox: StepMailbox[Any, messages_pb2.EmbeddingGradients] = StepMailbox(
            self.passives, "embeddings", "the active party"
        )
        self.keeper = PredictionsKeeper(host)
        self.defense = self._defense()

    def _defense(self) -> LabelDefense | None:
        host = self.host
        built = attach_labels(self.cfg, host.name, host.data.n_classes)
        if len(built) > 1:
            raise ValueError(f"{host.name}: one label defense at a time, got {len(built)}")
        if built:
            host.log.info("%s defends its labels with %s", host.name, type(built[0]).__name__)
        return built[0] if built else None

    def joined(self, reply: messages_pb2.JoinReply) -> None:
        self.compute = self.make_compute()

    def make_local(self, modules: dict[str, Any]) -> LocalModel:
        """The party's model, with the modules its label defense trains (MID's bottleneck), if any."""
        if self.defense is not None:
            added = self.defense.trainable([self.embedding_dims[p] for p in self.passives])
            if added is not None:
                modules["defense"] = added
        return super().make_local(modules)

    def make_compute(self) -> Any:
        return ActiveSplit(self.host.local, self.cfg.protocol.aggregation, self.defense)

    # ------------------------------------------------------------ hooks for split-he
    def decode(self, msg: messages_pb2.Embeddings, expect: tuple[int, int], what: str) -> Any:
        if msg.WhichOneof("payload") != "values":
            raise invalid(f"split protocol expects plaintext embeddings, got {msg.WhichOneof('payload')}")
        return from_proto(msg.values, expect_dtype="float32", expect_shape=expect, what=what)

    def precheck(self, msg: messages_pb2.Embeddings, expect: tuple[int, int], what: str) -> None:
        """Before this party has joined: what ``decode`` checks that needs nothing from admission."""
        self.decode(msg, expect, what)

    def run(
        self, x_own: np.ndarray | None, received: list[Any], y: np.ndarray | None, train: bool
    ) -> StepResult:
        return self.compute.step(x_own, received, y, train)

    def fill_reply(self, reply: messages_pb2.EmbeddingGradients, index: int, result: StepResult) -> None:
        to_proto(result.grads[index], into=reply.values)

    # ------------------------------------------------------------------ passive -> active
    # the replies are metered as they are built (``_build_replies``), so their bytes count in this step's report
    @handles(EXCHANGE, callers={"passive"}, meter_reply=False)
    def receive(self, msg: messages_pb2.Embeddings, context: Any) -> messages_pb2.EmbeddingGradients:
        h = msg.header
        ids = np.asarray(msg.sample_ids, dtype=np.int64)
        expect, what = (len(ids), self.embedding_dims[h.sender]), f"embeddings from {h.sender}"
        if not self.host.ready.is_set():  # malformed messages are refused now, not after the wait
            self.precheck(msg, expect, what)
            self.host.waitroom.wait(h.sender, context, self.host.step_deadline_s)
        values = self.decode(msg, expect, what)
        return self.mailbox.put(h.step, h.sender, ids, values, self.host.step_deadline_s)

    # -------------------------------------------------------------- coordinator -> active
    def step(self, cmd: messages_pb2.StepCommand, rows: np.ndarray) -> dict[str, float]:
        host, step = self.host, cmd.header.step
        ids = np.asarray(cmd.sample_ids, dtype=np.int64)
        received = self.mailbox.collect(step, ids, host.step_deadline_s)
        start = time.perf_counter()
        phase = cmd.header.phase
        assert host.data.y is not None
        x_own = host.data.x[rows] if host.data.x is not None else None
        y = None if phase == messages_pb2.PREDICT else host.data.y[rows]
        try:
            r = self.run(x_own, received, y, phase == messages_pb2.TRAIN)
            replies = self._build_replies(r, cmd.header)
        except Exception as exc:  # a failed step must release the waiting passive calls, with the reason
            self.mailbox.fail(
                step, str(exc) if isinstance(exc, MessageTooLarge) else f"{type(exc).__name__}: {exc}"
            )
            raise
        self.mailbox.answer(step, replies)
        if phase == messages_pb2.TRAIN:
            # after the replies are out: this update runs while the passive parties backpropagate
            # (the next step's top model waits for their next embeddings anyway)
            self.compute.update()
        if phase != messages_pb2.TRAIN:
            self._record_predictions(cmd, r, rows)
        return {
            "loss_sum": r.loss_sum,
            "correct": r.correct,
            "count": r.count,
            "compute_s": time.perf_counter() - start,
        }

    def _build_replies(
        self, result: StepResult, h: messages_pb2.Header
    ) -> dict[str, messages_pb2.EmbeddingGradients]:
        """Every passive party's answer, built and metered before the step completes, so the bytes
        count in this step's report."""
        replies = {}
        for index, sender in enumerate(self.passives):
            reply = messages_pb2.EmbeddingGradients(header=self.host.header(h))
            if h.phase == messages_pb2.TRAIN:
                self.fill_reply(reply, index, result)
            check_and_meter(
                self.host,
                "ExchangeEmbeddings.reply",
                reply,
                f"{self.host.name}'s gradients for {sender} at step {h.step}",
            )
            replies[sender] = reply
        return replies

    def _record_predictions(
        self, cmd: messages_pb2.StepCommand, result: StepResult, rows: np.ndarray
    ) -> None:
        """Per-sample outputs of an evaluation or prediction step: the predicted class (CAE: decoded)
        and the confidence vector (softmax of the logits), as a deployed model returns them."""
        logits = torch.from_numpy(result.logits)
        predicted = predict(logits, self.defense).numpy()
        confidence = torch.softmax(logits.double(), dim=1).numpy()
        self.keeper.keep(cmd, confidence, rows, self.host.local.modules, predicted)

    def stop(self, reason: str) -> None:
        self.mailbox.stop(reason)

    def finish(self) -> None:
        """<run>/predictions/: test-epoch-NNN.npz per evaluation and predict-epoch-NNN.npz per
        prediction pass, each with sample_ids, predicted and confidence."""
        self.keeper.write()

    def state_dict(self) -> dict[str, Any]:
        return {"completed_step": self.mailbox.completed_step, "predictions": self.keeper.parts}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mailbox.completed_step = int(state["completed_step"])
        self.keeper.parts = state["predictions"]


# What a SplitActive / SplitPassive side applies: the active party's label defense, the passive party's
# bottom defenses (the host builds its bottom with them), score defenses (PredictionsKeeper).
SPLIT_HOOKS = frozenset({"labels", "bottom", "scores"})


class SplitCoordinator(CoordinatorSide):
    """The generic schedule, pipelined: a passive party's whole part of a step is its step, and the
    active party takes the next step's embeddings as soon as this step completes (its mailbox)."""

    pipelined = True


@PROTOCOLS.register
class Split(Protocol):
    trains_on_device = True
    name = "split"
    settings = frozenset({"aggregation"})
    description = (
        "plaintext split learning: embeddings up, gradients down (concat + top model, or sum of logits)"
    )
    coordinator = SplitCoordinator
    active = SplitActive
    passive = SplitPassive
    defense_hooks = SPLIT_HOOKS | {
        "plaintext-embeddings"
    }  # MID, dCor, GradPerturb need the embeddings in the clear
