"""What paper 003's attacks share at the active party: the prediction steps' confidence vectors (the
``predictions`` knowledge), the passive parties' released models (``released_model``, every passive
party is the attack target P_target, the active party P_adv), and scoring against the target's true
features as the passive parties hold them."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from vflnet.interceptors.events import WireEvent
from vflnet.metrics.features import mse_per_feature, random_guess
from vflnet.threat.attack import Attack, PredictionView


class PredictionAttack(Attack):
    roles = frozenset({"active"})
    taps = ()
    knowledge = ("released_model", "predictions")
    truth_needed: ClassVar[str] = "normalized-features"  # the inputs as the passive models see them

    def __init__(self, context: Any, **params: Any) -> None:
        super().__init__(context, **params)
        self.views: list[PredictionView] = []

    def observe(self, event: WireEvent) -> None:
        """No wire taps: the confidence vectors come as the active party's ``PredictionView``."""

    def observe_predictions(self, view: PredictionView) -> None:
        self.views.append(view)

    def released(self) -> dict[str, dict[str, Any]]:
        """{passive party: {"parameters": {...}, "spec": {...}}}, in roster order of release."""
        got = self.context.knowledge.get("released_model", {})
        if not got:
            raise RuntimeError(f"{self.name}: no passive party released its model to {self.context.party}")
        return dict(sorted(got.items()))

    def gathered(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
        """(sample ids, confidence vectors, own features, own model) over every prediction step."""
        if not self.views:
            empty = np.zeros((0,))
            return empty.astype(np.int64), empty, empty, None
        v = self.views
        return (
            np.concatenate([x.sample_ids for x in v]),
            np.concatenate([x.confidence for x in v]),
            np.concatenate([x.own_features.reshape(len(x.own_features), -1) for x in v]),
            v[-1].own_model,
        )

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: Any) -> dict[str, float]:
        """MSE per feature (Eq. 10) against the passive parties' features, with the random guesses."""
        x = target_truth(truth, output["sample_ids"])
        if "x_target" not in output or len(x) == 0:
            return {}
        est = output["x_target"]
        return {
            "mse": mse_per_feature(est, x),
            "mse_uniform": mse_per_feature(random_guess(x.shape, "uniform"), x),
            "mse_gaussian": mse_per_feature(random_guess(x.shape, "gaussian"), x),
            # the best constant guess, each feature's mean over these samples: no access beyond the marginal
            "mse_constant": mse_per_feature(np.broadcast_to(x.mean(0), x.shape), x),
            "n": float(len(x)),
            "d_target": float(x.shape[1]),
        }

    @classmethod
    def sample_errors(cls, output: dict[str, np.ndarray], truth: Any) -> np.ndarray | None:
        """Each sample's squared error, averaged over the target features (Eq. 10 before its mean)."""
        x = target_truth(truth, output["sample_ids"])
        if "x_target" not in output or len(x) == 0:
            return None
        return np.mean((np.asarray(output["x_target"], np.float64) - x) ** 2, axis=1)


def target_truth(truth: dict[str, tuple[np.ndarray, np.ndarray]], ids: np.ndarray) -> np.ndarray:
    """The passive parties' features of ``ids``, concatenated in party-name order (the attack's order)."""
    parts = []
    for name in sorted(truth):
        pid, x = truth[name]
        index = {int(i): r for r, i in enumerate(pid)}
        parts.append(x.reshape(len(x), -1)[[index[int(i)] for i in ids]])
    return np.concatenate(parts, 1) if parts else np.zeros((len(ids), 0))


def rebuild_bottom(released: dict[str, Any]) -> nn.Module:
    """A passive party's bottom model from its release: the architecture in the spec, its parameters."""
    from vflnet.config import ModelConfig
    from vflnet.models.zoo import build_bottom

    spec = released["spec"]["bottom"]
    module = build_bottom(ModelConfig(**spec["config"]), tuple(spec["input_shape"]))
    state = {
        k.removeprefix("bottom."): torch.from_numpy(np.asarray(v)) for k, v in released["parameters"].items()
    }
    module.load_state_dict(state)
    return module.eval()
