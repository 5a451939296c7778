"""The attack plug-in API.

An attack sits on one party's wire. It declares the roles it may sit at, the messages it taps or
rewrites (method, direction, side), what its threat model lets it know beyond the wire, and its
parameters. Online, its host party runs it as a mod in its interceptor chain; offline, `run`
feeds it the events of a recorded trace, and both give the same output on the same traffic.

An attack never receives ground truth: it returns its output (inferred labels, recovered
features, ...), and the runner scores that output against the truth afterwards with the attack's
`score`, in the launcher process, after the parties have exited.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from google.protobuf.message import Message

from vflnet.interceptors.events import WireEvent
from vflnet.registry import Param, validate_params
from vflnet.threat.model_needs import check_declared
from vflnet.v1 import messages_pb2

if TYPE_CHECKING:
    from vflnet.config import Config


@dataclass(frozen=True)
class Tap:
    """Which messages an attack sees: short method name, direction, and the side of the host's channel."""

    method: str
    direction: str  # "request" | "response"
    side: str  # "client" | "server"

    def matches(self, event: WireEvent) -> bool:
        return (
            event.short_method == self.method
            and event.direction == self.direction
            and event.side == self.side
        )


@dataclass(frozen=True)
class AttackContext:
    """Everything an attack is given besides the wire: who hosts it, and knowledge its threat model
    grants, delivered explicitly and recorded in the run (never a handle to another party)."""

    party: str
    role: str
    run_id: str
    knowledge: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class OwnStepView:
    """The host party's own view of one training step, for attacks whose threat model grants it
    (paper 004: the passive attacker controls its own training procedure): its rows of the batch, its
    bottom model as it was in the forward pass, and the batch-level gradient it applied (under
    split-he: what it got back from the masked decryption, unmasked)."""

    step: int
    sample_ids: np.ndarray
    features: np.ndarray
    model: Any  # torch.nn.Module snapshot, taken before the update
    param_grads: dict[str, Any]  # parameter name (as in model.named_parameters()) -> torch.Tensor
    num_classes: int


@dataclass(frozen=True)
class PredictionView:
    """What the active party holds after a prediction step (paper 003's threat model, for attacks that
    declare the ``predictions`` knowledge): the samples, the confidence vectors as released to it (after
    the releasing party's score defenses), its own feature rows of those samples and its own model
    (its modules by name, or the protocol's description of it, e.g. secureboost's trees)."""

    step: int
    sample_ids: np.ndarray
    confidence: np.ndarray
    own_features: np.ndarray
    own_model: Any


class Attack(ABC):
    name: ClassVar[str]
    description: ClassVar[str]
    roles: ClassVar[frozenset[str]]
    taps: ClassVar[tuple[Tap, ...]]
    rewrites: ClassVar[tuple[Tap, ...]] = ()
    knowledge: ClassVar[tuple[str, ...]] = ()  # names of what the threat model delivers
    # names of what its algorithm needs of the model (vflnet.threat.model_needs: summed-logits,
    # input-layer-cut, linear-model, plaintext-embeddings, tree): config check and the audit refuse the rest
    model_needs: ClassVar[tuple[str, ...]] = ()
    wants_own_view: ClassVar[bool] = (
        False  # receive an OwnStepView of the host party after each training step
    )
    changes_own_data: ClassVar[bool] = False  # rewrites the host party's own feature rows (`own_data`)
    params: ClassVar[dict[str, Param]] = {}
    # the view-level algorithm this attack runs, if it is one of vflnet.attacks.label_inference's
    algorithm: ClassVar[type | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        check_declared(f"attack class {cls.__name__}", cls.model_needs)

    def __init__(self, context: AttackContext, **params: Any) -> None:
        if context.role not in self.roles:
            raise ValueError(
                f"attack {self.name!r} sits at {sorted(self.roles)}, not at a {context.role} party"
            )
        self.context = context
        self.p = validate_params("attack", self.name, self.params, params)

    # ----------------------------------------------------------------- hooks
    def sees(self, event: WireEvent) -> bool:
        return any(t.matches(event) for t in self.taps + self.rewrites)

    def __call__(self, event: WireEvent) -> Message | None:
        """The mod: observe what it taps; return a changed message where it rewrites."""
        if not self.sees(event):
            return None
        changed = self.rewrite(event) if any(t.matches(event) for t in self.rewrites) else None
        if any(t.matches(event) for t in self.taps):
            self.observe(event)
        return changed

    @classmethod
    def check_config(cls, cfg: Config, party: str) -> list[tuple[str, str]]:
        """(config key, problem) pairs that make this attack at ``party`` impossible in the run
        (``vflnet config check`` reports the first), beyond its ``model_needs``; none by default."""
        return []

    def required_effects(self) -> dict[str, str]:
        """What this attack must have done at least once in a run, as the host counts it
        (``vflnet.threat.effects.ATTACK_COUNTS``) -> what zero of it means: by default everything it
        declares (its taps, its rewrites, the own view, the prediction phase, its own data). A run in
        which one stays zero fails, naming the attack and this reason."""
        out = {}
        if self.taps:
            out["tapped"] = f"observed 0 messages: none matched its taps ({_taps(self.taps)})"
        if self.rewrites:
            out["rewritten"] = f"rewrote 0 messages of {_taps(self.rewrites)}"
        if self.wants_own_view:
            out["own_views"] = "received 0 views of its party's own training steps"
        if "predictions" in self.knowledge:
            out["prediction_views"] = "received the confidence vectors of 0 prediction steps"
        if self.changes_own_data:
            out["own_rows"] = "changed 0 rows of its party's own data"
        return out

    @abstractmethod
    def observe(self, event: WireEvent) -> None:
        """Online hook: one tapped message."""

    def observe_own(self, view: OwnStepView) -> None:  # noqa: B027 - optional hook
        """The host party's own view of a finished training step (only if `wants_own_view`)."""

    def observe_predictions(self, view: PredictionView) -> None:  # noqa: B027 - optional hook
        """The confidence vectors of one prediction step (only with the ``predictions`` knowledge)."""

    def rewrite(self, event: WireEvent) -> Message | None:
        """Return the message to send instead (rewriting attacks), or None."""
        return None

    def own_data(self, ids: np.ndarray, x: np.ndarray) -> np.ndarray:
        """The host party's own feature rows as its (malicious) training procedure uses them, from
        the time it has joined (only if `changes_own_data`; paper 004's backdoor trigger)."""
        return x

    def state(self) -> dict[str, Any]:
        """What a coordinated checkpoint keeps of this attack (a resumed run continues it): by default
        every attribute but its context and parameters, which the resumed run builds again."""
        return {k: v for k, v in vars(self).items() if k not in ("context", "p")}

    def load_state(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    @abstractmethod
    def output(self) -> dict[str, np.ndarray]:
        """What the attack produced, as named arrays (saved in the run directory)."""

    # --------------------------------------------------------------- offline
    def run(self, events: Iterable[WireEvent]) -> dict[str, np.ndarray]:
        for event in events:
            if any(t.matches(event) for t in self.taps):
                self.observe(event)
        return self.output()

    # --------------------------------------------------------------- scoring
    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: Any) -> dict[str, float]:
        """Metrics of an output against ground truth; called by the runner, never by the attack."""
        return {}

    @classmethod
    def sample_errors(cls, output: dict[str, np.ndarray], truth: Any) -> np.ndarray | None:
        """Per-sample values of its error metric (lower: closer to the truth; the audit tests them pooled
        against its null runs'), or None where its metric is no mean over samples."""
        return None

    # what the runner loads for `score`: "labels", "images" / "features" (each passive party's raw
    # region or columns), "normalized-features" (as its model takes them), "labels+predictions", ""
    truth_needed: ClassVar[str] = ""


def _taps(taps: tuple[Tap, ...]) -> str:
    return ", ".join(f"{t.method} {t.direction} at the {t.side}" for t in taps)


def label_confusion_picture(
    name: str, output: dict[str, np.ndarray], truth: dict[int, int], out_dir: Any
) -> list[Any]:
    """Confusion matrix (true vs inferred label) of a label-inference attack's output, as a PNG."""
    from pathlib import Path

    from vflnet.metrics.labels import confusion_matrix, plot_confusion_matrix

    ids = output.get("sample_ids")
    if ids is None or len(ids) == 0:
        return []
    n_classes = len(set(truth.values()))
    true = np.array([truth[int(i)] for i in ids])
    counts = confusion_matrix(true, output["labels"], n_classes)
    path = Path(out_dir) / f"{name}-confusion.png"
    return [plot_confusion_matrix(counts, path, name)]


def label_scores(ids: np.ndarray, labels: np.ndarray, truth: dict[int, int]) -> dict[str, float]:
    """Accuracy of inferred labels against the truth, how many, and the baselines of an attacker with no
    access: ``chance`` (one over the classes) and ``majority_baseline``, the accuracy on the same samples of
    always guessing the task's majority class (``majority_class``, the most frequent label of the data set):
    the stronger of the two on an imbalanced task. Labels outside the task's classes are no labels of it
    (behind a top model the batch-level attacks return embedding units): a ValueError, never a score."""
    if len(ids) == 0:
        return {"label_accuracy": float("nan"), "samples": 0}
    classes = np.bincount(np.fromiter(truth.values(), dtype=np.int64))
    if labels.min() < 0 or labels.max() >= len(classes):
        raise ValueError(
            f"inferred labels span {int(labels.min())}..{int(labels.max())}, outside the task's classes "
            f"0..{len(classes) - 1}: the attack's output is no label of this task"
        )
    true = np.array([truth[int(i)] for i in ids])
    majority = int(classes.argmax())
    return {
        "label_accuracy": float((labels == true).mean()),
        "samples": int(len(ids)),
        "chance": 1.0 / int((classes > 0).sum()),
        "majority_class": majority,
        "majority_baseline": float((true == majority).mean()),
    }


class LabelAttack(Attack):
    """An attack whose output is inferred labels (``sample_ids``, ``labels``): the runner scores it
    against the true labels and saves the confusion matrix of its output."""

    truth_needed: ClassVar[str] = "labels"

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: dict[int, int]) -> dict[str, float]:
        """``label_scores`` of its output."""
        return label_scores(output["sample_ids"], output["labels"], truth)

    @classmethod
    def pictures(cls, output: dict[str, np.ndarray], truth: dict[int, int], out_dir: Any) -> list[Any]:
        return label_confusion_picture(cls.name, output, truth, out_dir)


class PerSampleGradientAttack(LabelAttack):
    """A label attack on a passive party's wire that pairs the sample IDs of each training
    ``ExchangeEmbeddings`` request it sends with the gradients in the reply it gets."""

    roles = frozenset({"passive"})
    taps = (Tap("ExchangeEmbeddings", "request", "client"), Tap("ExchangeEmbeddings", "response", "client"))

    def __init__(self, context: AttackContext, **params: Any) -> None:
        super().__init__(context, **params)
        self.pending: dict[int, np.ndarray] = {}  # step -> sample ids sent

    def observe(self, event: WireEvent) -> None:
        if event.phase != messages_pb2.TRAIN:
            return
        if event.direction == "request":
            self.pending[int(event.step)] = event.sample_ids
            return
        ids = self.pending.pop(int(event.step), None)
        if ids is not None:
            self.observe_batch(int(event.step), ids, event)

    @abstractmethod
    def observe_batch(self, step: int, ids: np.ndarray, reply: WireEvent) -> None:
        """One training batch: the IDs this party sent and the reply event (plaintext or encrypted gradients)."""
