"""Scoring for label attacks and defenses (paper 004 Sec. 7): run by the experiment runner after the fact,
with ground truth the attacker never had. Plots draw on matplotlib's Agg canvas directly (no pyplot, no
global backend switch) and write PNG files."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vflnet.extras import agg_figure

ArrayLike = torch.Tensor | np.ndarray | Sequence[int]


def _labels(values: ArrayLike, name: str) -> np.ndarray:
    array = values.detach().cpu().numpy() if isinstance(values, torch.Tensor) else np.asarray(values)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}")
    return array.astype(np.int64)


def _pair(inferred: ArrayLike, truth: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    a, b = _labels(inferred, "inferred"), _labels(truth, "truth")
    if a.shape != b.shape:
        raise ValueError(f"inferred has {a.size} labels but truth has {b.size}")
    if a.size == 0:
        raise ValueError("no labels to score")
    return a, b


def label_recovery_accuracy(inferred: ArrayLike, truth: ArrayLike) -> float:
    """Fraction of rows whose inferred label equals the true one (paper 004's attack ACC, top-1)."""
    a, b = _pair(inferred, truth)
    return float((a == b).mean())


def main_task_accuracy(predicted: ArrayLike, truth: ArrayLike) -> float:
    """Test accuracy of the VFL model's predictions (MTA); with CAE, predictions are argmax Dec(softmax(H))."""
    a, b = _pair(predicted, truth)
    return float((a == b).mean())


def confusion_matrix(truth: ArrayLike, inferred: ArrayLike, num_classes: int) -> np.ndarray:
    """Counts C[i, j] of rows with true label i inferred as j."""
    a, b = _pair(inferred, truth)
    if num_classes < 1 or max(a.max(), b.max()) >= num_classes or min(a.min(), b.min()) < 0:
        raise ValueError(f"labels must lie in [0, {num_classes})")
    matrix = np.zeros((num_classes, num_classes), dtype=np.int64)
    np.add.at(matrix, (b, a), 1)
    return matrix


def probability_distribution_matrix(counts: np.ndarray) -> np.ndarray:
    """Paper 004's PD matrix (Fig. 10): each row of a confusion matrix divided by its sum (empty rows stay 0)."""
    sums = counts.sum(axis=1, keepdims=True)
    return np.divide(counts, sums, out=np.zeros(counts.shape, dtype=np.float64), where=sums > 0)


def backdoor_success_rate(
    predicted: ArrayLike, truth: ArrayLike, target_label: int, exclude_target: bool = True
) -> float:
    """Fraction of triggered test rows classified as the attacker's target label. Rows whose true class is
    the target say nothing about the backdoor and are left out unless `exclude_target` is False."""
    a, b = _pair(predicted, truth)
    keep = b != target_label if exclude_target else np.ones_like(b, dtype=bool)
    if not keep.any():
        raise ValueError("no triggered rows outside the target class")
    return float((a[keep] == target_label).mean())


def binary_auc(scores: ArrayLike | torch.Tensor, truth: ArrayLike) -> float:
    """ROC AUC of a binary attack's scores (Li et al. report norm/direction scoring this way)."""
    values = scores.detach().cpu().numpy() if isinstance(scores, torch.Tensor) else np.asarray(scores)
    labels = _labels(truth, "truth")
    if values.shape != labels.shape:
        raise ValueError("scores and truth disagree on the number of rows")
    if len(np.unique(labels)) != 2:
        raise ValueError("AUC needs both classes among the rows")
    # imported here: scikit-learn costs ~1-2 s to import, which every role process and the fork server
    # would pay through the attack registry (datasets read sklearn's arrays from a disk cache for the same
    # reason)
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(labels, values))


def plot_confusion_matrix(counts: np.ndarray, path: str | Path, title: str, normalize: bool = True) -> Path:
    """Save a confusion (or, normalised, PD) matrix as a PNG heat map; rows = true, columns = inferred.
    A PD matrix's colours span [0, 1] whatever its values, so every saved PD matrix (the runs a sweep
    report shows side by side) reads on one colour scale."""
    values = probability_distribution_matrix(counts) if normalize else counts
    fig = agg_figure("the confusion matrix plot", figsize=(5, 4.5))
    ax = fig.subplots()
    image = ax.imshow(values, cmap="Blues", vmin=0, vmax=1 if normalize else None)
    fig.colorbar(image, ax=ax)
    ax.set_xlabel("inferred label")
    ax.set_ylabel("true label")
    ax.set_title(title)
    return _save_png(fig, path)


def _save_png(fig: Any, path: str | Path) -> Path:
    out = Path(path)
    fig.savefig(out, format="png", dpi=100, bbox_inches="tight")
    return out


@dataclass(frozen=True)
class TradeoffPoint:
    """One run of a defense's sweep: its parameter value, main-task accuracy and attack accuracy."""

    parameter: float | str
    main_task_accuracy: float
    attack_accuracy: float


def plot_tradeoff(
    series: Mapping[str, Sequence[TradeoffPoint]],
    path: str | Path,
    title: str,
    attack_label: str = "label recovery accuracy",
) -> Path:
    """Paper 004 Fig. 7-9 style: x = MTA, y = attack accuracy, one line per defense, points annotated with
    the swept parameter. Better defenses sit towards the lower right."""
    if not series:
        raise ValueError("series is empty")
    fig = agg_figure("the trade-off plot", figsize=(6, 4.5))
    ax = fig.subplots()
    for name, points in series.items():
        xs = [p.main_task_accuracy for p in points]
        ys = [p.attack_accuracy for p in points]
        ax.plot(xs, ys, marker="o", label=name)
        for p in points:
            ax.annotate(str(p.parameter), (p.main_task_accuracy, p.attack_accuracy), fontsize=7)
    ax.set_xlabel("main task accuracy")
    ax.set_ylabel(attack_label)
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save_png(fig, path)


def mean_batch_auc(scores: ArrayLike | torch.Tensor, truth: ArrayLike, batches: ArrayLike) -> float:
    """Li et al.'s leak AUC: the ROC AUC of a binary attack's scores within each batch (rows sharing a
    `batches` value, e.g. the training step), averaged over the batches that hold both classes; NaN if none.
    Per batch, because scores of different steps are not on one scale (gradients shrink as training goes)."""
    values = scores.detach().cpu().numpy() if isinstance(scores, torch.Tensor) else np.asarray(scores)
    labels, groups = _labels(truth, "truth"), _labels(batches, "batches")
    if not values.shape == labels.shape == groups.shape:
        raise ValueError("scores, truth and batches disagree on the number of rows")
    aucs = [
        binary_auc(values[groups == g], labels[groups == g])
        for g in np.unique(groups)
        if len(np.unique(labels[groups == g])) == 2
    ]
    return float(np.mean(aucs)) if aucs else float("nan")
