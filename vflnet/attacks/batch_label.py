"""Batch-level label inference at a passive party (paper 004, Theorem 1 and Algorithm 2).

Both work from what the passive attacker legitimately has even under split-he: its own rows of the
batch, its own bottom model as it was in the forward pass, and the batch-averaged gradient of its
own parameters (delivered by the host party as its own view, `OwnStepView`). Neither needs a
per-sample gradient.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np
import torch

from vflnet.attacks.label_inference import (
    AnalyticLabelRecovery,
    BatchGradientView,
    GradientInversionLabelInference,
    last_layer_view,
)
from vflnet.interceptors.events import WireEvent
from vflnet.registry import ATTACKS, Param
from vflnet.threat.attack import LabelAttack, OwnStepView, label_scores


class _BatchLabelAttack(LabelAttack):
    roles = frozenset({"passive"})
    taps = ()
    wants_own_view = True
    # Theorem 1 and Algorithm 2 read the class logits' gradient off the last layer of the party's own
    # bottom: behind a top model that layer's units are embedding units, not classes
    model_needs = ("summed-logits",)

    def __init__(self, context, **params: Any) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.labels: dict[int, int] = {}
        self.batches = 0

    def observe(self, event: WireEvent) -> None:
        """Works from the party's own view only."""

    def observe_own(self, view: OwnStepView) -> None:
        if self.p["max_batches"] and self.batches >= self.p["max_batches"]:
            return
        batch = BatchGradientView(
            sample_ids=torch.from_numpy(view.sample_ids),
            features=torch.from_numpy(view.features),
            model=view.model,
            param_grads=view.param_grads,
            num_classes=view.num_classes,
        )
        inferred = self.infer(batch)
        for sid, label in zip(view.sample_ids.tolist(), inferred.tolist(), strict=True):
            self.labels[sid] = int(label)
        self.batches += 1

    @abstractmethod
    def infer(self, view: BatchGradientView) -> torch.Tensor:
        """One inferred label per row of the batch."""

    def output(self) -> dict[str, np.ndarray]:
        ids = np.array(sorted(self.labels), dtype=np.int64)
        return {
            "sample_ids": ids,
            "labels": np.array([self.labels[i] for i in ids], dtype=np.int64),
            "batches": np.array(self.batches),
        }

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: dict[int, int]) -> dict[str, float]:
        return {
            **label_scores(output["sample_ids"], output["labels"], truth),
            "batches": int(output["batches"]),
        }


# Past ~2M entries (16 MiB of float64) building and multiplying the Jacobian costs more than double backprop.
_JACOBIAN_ENTRIES = 2**21

_MAX_BATCHES = Param(
    0,
    "attack at most this many training batches (0 = all)",
    lambda v: isinstance(v, int) and v >= 0,
    "an integer >= 0",
)


@ATTACKS.register
class AnalyticBatchLabels(_BatchLabelAttack):
    name = "analytic-label-recovery"
    description = "paper 004 Theorem 1: per-sample logit gradients from the last layer's batch gradient (exact when B <= rank)"
    params = {"max_batches": _MAX_BATCHES}
    algorithm = AnalyticLabelRecovery

    def infer(self, view: BatchGradientView) -> torch.Tensor:
        return self.algorithm().infer(last_layer_view(view))


@ATTACKS.register
class GradientInversionBatchLabels(_BatchLabelAttack):
    name = "gradient-inversion-label-inference"
    description = (
        "paper 004 Algorithm 2: dummy labels optimised to reproduce the batch-level parameter gradient"
    )
    algorithm = GradientInversionLabelInference
    params = {
        "max_batches": _MAX_BATCHES,
        "iterations": Param(
            1500, "optimisation steps per batch", lambda v: isinstance(v, int) and v > 0, "a positive integer"
        ),
        "lr": Param(
            0.05, "Adam learning rate", lambda v: isinstance(v, int | float) and v > 0, "a positive number"
        ),
        "seed": Param(0, "dummy initialisation seed", lambda v: isinstance(v, int), "an integer"),
        "method": Param(
            "auto",
            "dummy-gradient computation: jacobian (fast for small batches), double_backprop "
            "(no B*C x P Jacobian in memory), or auto (jacobian while it has <= 2^21 entries)",
            lambda v: v in ("auto", *GradientInversionLabelInference.methods),
            "auto, jacobian or double_backprop",
        ),
    }

    def infer(self, view: BatchGradientView) -> torch.Tensor:
        method = self.p["method"]
        if method == "auto":
            entries = (
                view.features.shape[0] * view.num_classes * sum(g.numel() for g in view.param_grads.values())
            )
            method = "jacobian" if entries <= _JACOBIAN_ENTRIES else "double_backprop"
        attack = self.algorithm(
            iterations=self.p["iterations"], lr=self.p["lr"], seed=self.p["seed"], method=method
        )
        return attack.infer(view)
