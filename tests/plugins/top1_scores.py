"""A test plug-in defense, written on the defense API alone: the active party releases, in place of
its confidence vectors, a one-hot vector of the top class (the extreme of paper 003's rounding)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from vflnet.defenses.base import Defense
from vflnet.registry import DEFENSES


def top1(scores: np.ndarray) -> np.ndarray:
    scores = np.asarray(scores)
    out = np.zeros_like(scores)
    out[np.arange(len(scores)), scores.argmax(axis=1)] = 1.0
    return out


@DEFENSES.register
class Top1Scores(Defense):
    name = "top1-scores"
    description = "test plug-in: release a one-hot vector of the top class instead of the confidence scores"
    roles = frozenset({"active"})
    acts_on = "scores"  # applied by any protocol that declares the hook point (Protocol.defense_hooks)
    implementation = staticmethod(top1)

    def build(self, num_classes: int, seed: int) -> Callable[[np.ndarray], np.ndarray]:
        return top1
