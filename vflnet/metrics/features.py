"""Scoring for feature inference on predictions (paper 003 Sec. VI): run after the attack, with the
ground truth the attacker never had."""

from __future__ import annotations

import numpy as np


def mse_per_feature(inferred: np.ndarray, truth: np.ndarray) -> float:
    """Paper 003 Eq. 10: mean over samples and target features of the squared error."""
    inferred, truth = np.asarray(inferred, np.float64), np.asarray(truth, np.float64)
    if inferred.shape != truth.shape:
        raise ValueError(f"inferred shape {inferred.shape} != truth shape {truth.shape}")
    return float(np.mean((inferred - truth) ** 2))


def esa_upper_bound(truth: np.ndarray) -> float:
    """Paper 003 Eqs. 11-15: MSE <= (1/d_target) sum_i 2 x_i^2 (features in (0, 1)), averaged over samples."""
    truth = np.asarray(truth, np.float64)
    return float(np.mean(2.0 * truth**2))


def random_guess(shape: tuple[int, ...], kind: str, seed: int = 0) -> np.ndarray:
    """The paper's baselines: U(0, 1) or N(0.5, 0.25^2) guesses, independent of the truth."""
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.uniform(0.0, 1.0, shape)
    if kind == "gaussian":
        return rng.normal(0.5, 0.25, shape)
    raise ValueError(f"unknown random guess {kind!r} (uniform, gaussian)")


def _abs_pearson(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|r| between every column of a and every column of b: shape (a cols, b cols); 0 for constant columns."""
    a = a - a.mean(0)
    b = b - b.mean(0)
    na, nb = np.linalg.norm(a, axis=0), np.linalg.norm(b, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = (a.T @ b) / np.outer(na, nb)
    return np.nan_to_num(np.abs(r))


def correlation_diagnostics(
    x_adv: np.ndarray, v: np.ndarray, x_target: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Paper 003 Eqs. 16-17, per target feature i: mean_j |r(x_adv_j, x_target_i)| and mean_j |r(v_j, x_target_i)|."""
    return _abs_pearson(x_adv, x_target).mean(0), _abs_pearson(v, x_target).mean(0)
