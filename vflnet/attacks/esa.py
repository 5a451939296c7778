"""Paper 003 Sec. IV-A: the equality solving attack (ESA) on logistic regression.

The active party knows the released model theta = (theta_adv, theta_target) (one row per class),
its own features x_adv and the confidence vector v of a prediction. Softmax makes
ln v_k - ln v_{k+1} = z_k - z_{k+1}: c - 1 linear equations in x_target (Eq. 8), solved with the
Moore-Penrose pseudo-inverse; exact when d_target <= c - 1 (and the differences have full column
rank), the minimum-norm solution otherwise. A binary model with one output row (sigmoid) gives the
single equation of Eq. 3.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from vflnet.attacks.prediction_base import PredictionAttack, target_truth
from vflnet.metrics.features import esa_upper_bound
from vflnet.registry import ATTACKS

LOG_FLOOR = 1e-12  # rounded scores can be 0: clip before the log


def equality_solving(
    theta_adv: np.ndarray,
    theta_target: np.ndarray,
    x_adv: np.ndarray,
    v: np.ndarray,
    bias: np.ndarray | None = None,
) -> np.ndarray:
    """x_target estimates (n, d_target) from theta_adv (c, d_adv), theta_target (c, d_target), x_adv
    (n, d_adv), confidence vectors v (n, c) and the known bias (c,). With c = 1 (sigmoid output), v
    holds the positive class's probability in column 0."""
    theta_adv, theta_target = np.asarray(theta_adv, np.float64), np.asarray(theta_target, np.float64)
    x_adv, v = np.asarray(x_adv, np.float64), np.asarray(v, np.float64)
    c = theta_target.shape[0]
    b = np.zeros(c) if bias is None else np.asarray(bias, np.float64)
    logv = np.log(np.clip(v, LOG_FLOOR, 1.0))
    if c == 1:  # sigma^-1(v_1) = x . theta + b
        p = np.clip(v[:, 0], LOG_FLOOR, 1 - LOG_FLOOR)
        lhs = np.log(p / (1 - p))[:, None]
        a = lhs - x_adv @ theta_adv.T - b
        m = theta_target
    else:  # adjacent differences (Eq. 8)
        a = (logv[:, :-1] - logv[:, 1:]) - x_adv @ (theta_adv[:-1] - theta_adv[1:]).T - (b[:-1] - b[1:])
        m = theta_target[:-1] - theta_target[1:]
    return a @ np.linalg.pinv(m).T


@ATTACKS.register
class EqualitySolving(PredictionAttack):
    name = "esa"
    description = "paper 003 equality solving attack: the passive parties' features from LR confidence scores"
    model_needs = ("summed-logits", "linear-model")  # logistic regression: the sum of linear bottoms

    def output(self) -> dict[str, np.ndarray]:
        ids, v, x_adv, own = self.gathered()
        if len(ids) == 0:
            return {"sample_ids": ids, "x_target": np.zeros((0, 0))}
        theta_adv, bias = linear_layer(own.get("bottom"), v.shape[1], x_adv.shape[1])
        parts = []
        for name, got in self.released().items():
            config = got["spec"]["bottom"]["config"]
            if config["kind"] != "linear":
                raise ValueError(f"ESA needs a linear model; {name}'s bottom is {config['kind']!r}")
            parts.append(np.asarray(got["parameters"]["bottom.weight"], np.float64))
            bias = bias + np.asarray(got["parameters"].get("bottom.bias", 0.0), np.float64)
        if not isinstance(own.get("top").net, torch.nn.Identity):
            raise ValueError("ESA needs the sum of linear bottoms as the logits (model.top.kind: none)")
        x_hat = equality_solving(theta_adv, np.concatenate(parts, 1), x_adv, v, bias)
        return {"sample_ids": ids, "x_target": x_hat}

    @classmethod
    def score(cls, output: dict[str, np.ndarray], truth: Any) -> dict[str, float]:
        """The shared scores plus the paper's upper bound of ESA's MSE (Eqs. 11-15)."""
        out = super().score(output, truth)
        if out:
            out["upper_bound"] = esa_upper_bound(target_truth(truth, output["sample_ids"]))
        return out


def linear_layer(module: Any, c: int, d: int) -> tuple[np.ndarray, np.ndarray]:
    """(weight (c, d), bias (c,)) of the active party's own linear bottom (zeros without features)."""
    if module is None:
        return np.zeros((c, d)), np.zeros(c)
    bias = module.bias.detach().double().numpy() if module.bias is not None else np.zeros(c)
    return module.weight.detach().double().numpy(), bias
