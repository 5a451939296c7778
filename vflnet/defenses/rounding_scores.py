"""Paper 003 Sec. VII: round the confidence scores to b decimals before they are released."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from vflnet.config import Config
from vflnet.defenses.base import Defense
from vflnet.registry import DEFENSES, Param


def round_scores(v: np.ndarray, decimals: int) -> np.ndarray:
    """round(v * 10^b) / 10^b, as the authors' code does."""
    scale = 10.0**decimals
    return np.round(np.asarray(v, np.float64) * scale) / scale


class RoundScores(Defense):
    name = "round-scores"
    description = "paper 003: round the released confidence scores to `decimals` decimals (PREDICT phase)"
    roles = frozenset({"active"})
    acts_on = "scores"
    implementation = staticmethod(round_scores)
    params = {
        "decimals": Param(
            1,
            "decimals kept (b)",
            lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "an integer >= 0",
        )
    }

    @classmethod
    def check_config(cls, cfg: Config, party: str) -> list[tuple[str, str]]:
        """Only the prediction phase's scores are rounded: a run without one would round nothing."""
        problems = super().check_config(cfg, party)
        if cfg.predict.set == "none":
            problems.append(
                (
                    "predict.set",
                    "rounds the scores of the prediction phase, and this run has none: set test or train",
                )
            )
        return problems

    def build(self, num_classes: int, seed: int) -> Callable[[np.ndarray], np.ndarray]:
        decimals = int(self.p["decimals"])
        return lambda v: round_scores(v, decimals)


DEFENSES.register(RoundScores)
