"""Comparison label attacks of paper 004 (B.3.5) at a passive party, from its own view only.

- `norm-scoring`, `direction-scoring` (Li et al., the MARVELL paper; binary tasks): score every row of
  a training batch from the per-sample gradient the active party returns under plaintext `split`.
  Norm: the rarer (positive) class is predicted with less confidence, so its gradients are larger.
  Direction: gradients of one class point the same way; the score is the cosine similarity to the
  gradient of one training sample the attacker knows to be positive (Li et al.'s threat model; granted
  as `aux_labels` knowledge). That sample rarely shares a batch with the scored rows, so its gradient
  from the nearest training step is the reference. Under `split-he` the gradients are ciphertexts:
  both attacks then guess (uniform random scores, `informed` false), i.e. chance level.
- `passive-model-completion` (Fu et al.): after training, fine-tune a completion head on the
  attacker's own bottom model with a few labelled training samples of its own (`aux_labels`
  knowledge), then label its other training samples. It needs no per-sample gradient, so it works
  under `split-he` too. It labels the training rows it saw (its own view covers training steps only).

Scores (runner, against ground truth): label accuracy, and for the binary scores Li et al.'s leak
AUC, the ROC AUC within each training step averaged over the steps.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np
import torch

from vflnet.attacks.label_inference import (
    DirectionScoring,
    ModelCompletionView,
    NormScoring,
    PassiveModelCompletion,
    SampleGradientView,
)
from vflnet.interceptors.events import WireEvent
from vflnet.metrics.labels import mean_batch_auc
from vflnet.registry import ATTACKS, Param
from vflnet.threat.attack import LabelAttack, OwnStepView, PerSampleGradientAttack, label_scores

_SEED = Param(
    0, "seed of the guesses made when gradients are encrypted", lambda v: isinstance(v, int), "an integer"
)
_POSITIVE = Param(
    1,
    "the label the attacker takes for the rare (positive) class: its scores rank this label",
    lambda v: v in (0, 1) and not isinstance(v, bool),
    "0 or 1",
)


class _GradientScoring(PerSampleGradientAttack):
    """Collects (step, sample ids, per-sample gradient or None when encrypted) per training batch;
    scores them when the output is asked for (direction scoring needs a reference from any step)."""

    def __init__(self, context, **params: Any) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.batches: list[tuple[int, np.ndarray, np.ndarray | None]] = []

    def observe_batch(self, step: int, ids: np.ndarray, reply: WireEvent) -> None:
        self.batches.append((step, ids, reply.tensors().get("values")))

    def output(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.p["seed"])
        positive = self.p["positive_label"]
        cols: dict[str, list[np.ndarray]] = {
            "sample_ids": [],
            "steps": [],
            "scores": [],
            "labels": [],
            "informed": [],
        }
        for step, ids, grad in self.batches:
            scores = self.scores(step, ids, grad) if grad is not None else None
            informed = scores is not None
            if scores is None:  # nothing per sample to score: a guess
                scores = rng.uniform(-1.0, 1.0, size=len(ids))
            labels = np.where(self.says_positive(scores), positive, 1 - positive)
            keep = self.scored_rows(ids)
            for key, value in (
                ("sample_ids", ids),
                ("steps", np.full(len(ids), step)),
                ("scores", scores),
                ("labels", labels),
                ("informed", np.full(len(ids), informed)),
            ):
                cols[key].append(value[keep])
        dtypes = {
            "sample_ids": np.int64,
            "steps": np.int64,
            "scores": np.float64,
            "labels": np.int64,
            "informed": bool,
        }
        out = {
            k: np.concatenate(v).astype(dtypes[k]) if v else np.zeros(0, dtype=dtypes[k])
            for k, v in cols.items()
        }
        return {**out, "positive_label": np.array(positive)}

    @abstractmethod
    def scores(self, step: int, ids: np.ndarray, grad: np.ndarray) -> np.ndarray | None:
        """One score per row (higher = more likely positive), or None if this batch cannot be scored."""

    @abstractmethod
    def says_positive(self, scores: np.ndarray) -> np.ndarray:
        """Which rows of one batch the attack labels positive, from their scores."""

    def scored_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows reported (all but those whose label the attacker was given)."""
        return np.ones(len(ids), dtype=bool)

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: dict[int, int]) -> dict[str, float]:
        ids = output["sample_ids"]
        if len(ids) == 0:
            return {"auc": float("nan"), "label_accuracy": float("nan"), "samples": 0}
        true = np.array([truth[int(i)] for i in ids])
        positive = true == int(output["positive_label"])
        return {
            "auc": mean_batch_auc(output["scores"], positive, output["steps"]),
            "label_accuracy": float((output["labels"] == true).mean()),
            "samples": int(len(np.unique(ids))),
            "observations": int(len(ids)),
            "informed_fraction": float(output["informed"].mean()),
            "chance_auc": 0.5,
        }


@ATTACKS.register
class NormScoringAttack(_GradientScoring):
    name = "norm-scoring"
    description = "Li et al.: binary label score = norm of the per-sample gradient a passive party receives"
    algorithm = NormScoring
    params = {
        "positive_label": _POSITIVE,
        "positive_fraction": Param(
            0.5,
            "the attacker's prior on the positive rate: that share of each batch, the "
            "highest norms, is labelled positive",
            lambda v: isinstance(v, int | float) and 0 < v < 1,
            "a number in (0, 1)",
        ),
        "seed": _SEED,
    }

    def scores(self, step: int, ids: np.ndarray, grad: np.ndarray) -> np.ndarray:
        return (
            self.algorithm()
            .scores(SampleGradientView(torch.from_numpy(ids), torch.from_numpy(grad)))
            .double()
            .numpy()
        )

    def says_positive(self, scores: np.ndarray) -> np.ndarray:
        # NormScoring.infer's rule: the positive_fraction of the batch with the highest norms
        count = max(1, round(self.p["positive_fraction"] * len(scores)))
        positive = np.zeros(len(scores), dtype=bool)
        positive[np.argsort(-scores, kind="stable")[:count]] = True
        return positive


@ATTACKS.register
class DirectionScoringAttack(_GradientScoring):
    name = "direction-scoring"
    description = (
        "Li et al.: binary label score = cosine similarity to the gradient of one known positive sample"
    )
    knowledge = ("aux_labels",)
    params = {"positive_label": _POSITIVE, "seed": _SEED}
    algorithm = DirectionScoring

    def __init__(self, context, **params: Any) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.references: dict[int, np.ndarray] = {}  # step -> gradient of the known positive at that step

    def aux_quota(self, num_classes: int) -> dict[int, int]:
        """What this threat model grants: the label of one training sample of the positive class."""
        if num_classes != 2:
            raise ValueError(f"direction-scoring is for binary tasks, this dataset has {num_classes} classes")
        return {self.p["positive_label"]: 1}

    def known_positive(self) -> int:
        known = self.context.knowledge.get("aux_labels", {})
        positives = sorted(i for i, y in known.items() if y == self.p["positive_label"])
        if not positives:
            raise ValueError(
                f"{self.name} at {self.context.party}: no known sample of label {self.p['positive_label']} "
                "was granted (aux_labels knowledge)"
            )
        return positives[0]

    def output(self) -> dict[str, np.ndarray]:
        known = self.known_positive()
        self.references = {
            step: grad[list(ids).index(known)]
            for step, ids, grad in self.batches
            if grad is not None and known in ids
        }
        return {**super().output(), "known_ids": np.array([known], dtype=np.int64)}

    def scores(self, step: int, ids: np.ndarray, grad: np.ndarray) -> np.ndarray | None:
        if not self.references:
            return None  # the known sample never came with a plaintext gradient
        nearest = min(self.references, key=lambda s: (abs(s - step), s))
        view = SampleGradientView(torch.from_numpy(ids), torch.from_numpy(grad))
        return self.algorithm().similarity(view, torch.from_numpy(self.references[nearest])).double().numpy()

    def says_positive(self, scores: np.ndarray) -> np.ndarray:
        return scores > 0

    def scored_rows(self, ids: np.ndarray) -> np.ndarray:
        return ids != self.known_positive()


@ATTACKS.register
class PassiveModelCompletionAttack(LabelAttack):
    name = "passive-model-completion"
    description = "Fu et al.: fine-tune a completion head on the own bottom model with a few labelled samples"
    algorithm = PassiveModelCompletion
    roles = frozenset({"passive"})
    taps = ()
    wants_own_view = True
    knowledge = ("aux_labels",)
    params = {
        "aux_labels_per_class": Param(
            4,
            "labelled training samples per class the attacker is given",
            lambda v: isinstance(v, int) and v >= 1,
            "an integer >= 1",
        ),
        "hidden": Param(
            32,
            "width of the completion head's hidden layer",
            lambda v: isinstance(v, int) and v >= 1,
            "an integer >= 1",
        ),
        "epochs": Param(
            200,
            "fine-tuning steps (full batch of the labelled samples)",
            lambda v: isinstance(v, int) and v >= 1,
            "an integer >= 1",
        ),
        "lr": Param(
            0.01, "Adam learning rate", lambda v: isinstance(v, int | float) and v > 0, "a positive number"
        ),
        "fine_tune_bottom": Param(
            True,
            "also fine-tune (a copy of) the bottom model",
            lambda v: isinstance(v, bool),
            "true or false",
        ),
        "seed": Param(0, "seed of the completion head", lambda v: isinstance(v, int), "an integer"),
    }

    def __init__(self, context, **params: Any) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.features: dict[int, np.ndarray] = {}  # own training rows seen, by sample id
        self.model: torch.nn.Module | None = None

    def aux_quota(self, num_classes: int) -> dict[int, int]:
        return {label: self.p["aux_labels_per_class"] for label in range(num_classes)}

    def observe(self, event: WireEvent) -> None:
        """Works from the party's own view only."""

    def observe_own(self, view: OwnStepView) -> None:
        self.features.update(zip(view.sample_ids.tolist(), view.features, strict=True))
        self.model = view.model  # the latest snapshot: the bottom model as trained so far

    def output(self) -> dict[str, np.ndarray]:
        known = self.context.knowledge.get("aux_labels", {})
        aux = np.array(sorted(i for i in self.features if i in known), dtype=np.int64)
        targets = np.array(sorted(i for i in self.features if i not in known), dtype=np.int64)
        labels = np.zeros(0, dtype=np.int64)
        if self.model is not None and len(aux) and len(targets):
            view = ModelCompletionView(
                model=self.model,
                aux_features=self._rows(aux),
                aux_labels=torch.tensor([known[i] for i in aux]),
                target_features=self._rows(targets),
                num_classes=max(known.values()) + 1,
            )
            attack = self.algorithm(
                self.p["hidden"], self.p["epochs"], self.p["lr"], self.p["fine_tune_bottom"], self.p["seed"]
            )
            labels = attack.infer(view).numpy().astype(np.int64)
        else:
            targets = np.zeros(0, dtype=np.int64)
        return {"sample_ids": targets, "labels": labels, "aux_ids": aux}

    def _rows(self, ids: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.stack([self.features[int(i)] for i in ids]))

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: dict[int, int]) -> dict[str, float]:
        scores = label_scores(output["sample_ids"], output["labels"], truth)
        return {**scores, "aux_samples": int(len(output["aux_ids"]))}
