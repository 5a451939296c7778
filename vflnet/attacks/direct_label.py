"""Direct label inference at a passive party (paper 004, Lemma 1).

With softmax + cross-entropy over summed logits, the per-sample gradient dL/dH_i the active party
returns is negative only at the true class, so the label is its argmin. Under `split-he` the
gradients arrive encrypted: the attack has nothing per sample and can only guess (chance level).
"""

from __future__ import annotations

import numpy as np
import torch

from vflnet.attacks.label_inference import DirectLabelInference, SampleGradientView
from vflnet.interceptors.events import WireEvent
from vflnet.registry import ATTACKS, Param
from vflnet.threat.attack import PerSampleGradientAttack


@ATTACKS.register
class DirectLabelAttack(PerSampleGradientAttack):
    name = "direct-label-inference"
    description = "paper 004 Lemma 1: label = argmin of the per-sample gradient a passive party receives"
    algorithm = DirectLabelInference
    model_needs = ("summed-logits",)  # Lemma 1 reads the label off the gradient of summed logits
    params = {
        "seed": Param(
            0,
            "seed of the guesses made when gradients are encrypted",
            lambda v: isinstance(v, int),
            "an integer",
        )
    }

    def __init__(self, context, **params) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context, **params)
        self.labels: dict[int, int] = {}
        self.informed: dict[int, bool] = {}
        self.rng = np.random.default_rng(self.p["seed"])

    def observe_batch(self, step: int, ids: np.ndarray, reply: WireEvent) -> None:
        grad = reply.tensors().get("values")
        if grad is not None:
            view = SampleGradientView(torch.from_numpy(ids), torch.from_numpy(grad))
            guesses, informed = self.algorithm().infer(view).numpy(), True
        else:
            cipher = reply.ciphertexts()["cipher"]
            n_classes = int(cipher.shape[1])
            guesses, informed = self.rng.integers(0, n_classes, size=len(ids)), False
        for sid, label in zip(ids.tolist(), guesses.tolist(), strict=True):
            self.labels[sid], self.informed[sid] = int(label), informed

    def output(self) -> dict[str, np.ndarray]:
        ids = np.array(sorted(self.labels), dtype=np.int64)
        return {
            "sample_ids": ids,
            "labels": np.array([self.labels[i] for i in ids], dtype=np.int64),
            "informed": np.array([self.informed[i] for i in ids], dtype=bool),
        }

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: dict[int, int]) -> dict[str, float]:
        scores = super().score(output, truth)
        if len(output["sample_ids"]):
            scores["informed_fraction"] = float(output["informed"].mean())
        return scores
