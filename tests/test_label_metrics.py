"""Scoring functions and plots for label attacks/defenses (vflnet.metrics.labels)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from vflnet.metrics.labels import (
    TradeoffPoint,
    backdoor_success_rate,
    binary_auc,
    confusion_matrix,
    label_recovery_accuracy,
    main_task_accuracy,
    plot_confusion_matrix,
    plot_tradeoff,
    probability_distribution_matrix,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_accuracies_accept_tensors_arrays_and_lists() -> None:
    assert label_recovery_accuracy(torch.tensor([0, 1, 2, 2]), np.array([0, 1, 1, 2])) == 0.75
    assert main_task_accuracy([1, 1], [1, 0]) == 0.5
    with pytest.raises(ValueError, match="inferred has 2 labels but truth has 3"):
        label_recovery_accuracy([0, 1], [0, 1, 2])
    with pytest.raises(ValueError, match="no labels"):
        main_task_accuracy([], [])


def test_confusion_and_pd_matrix_rows_are_true_labels() -> None:
    counts = confusion_matrix(truth=[0, 0, 1, 2], inferred=[1, 1, 1, 0], num_classes=3)
    assert counts.tolist() == [[0, 2, 0], [0, 1, 0], [1, 0, 0]]
    pd_matrix = probability_distribution_matrix(confusion_matrix([0, 0, 1], [0, 1, 1], 3))
    assert pd_matrix.tolist() == [[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="labels must lie"):
        confusion_matrix([0, 3], [0, 1], 3)


def test_backdoor_success_rate_leaves_out_target_class_rows() -> None:
    predicted = [5, 5, 1, 5]
    truth = [0, 1, 1, 5]
    assert backdoor_success_rate(predicted, truth, target_label=5) == pytest.approx(2 / 3)
    assert backdoor_success_rate(predicted, truth, target_label=5, exclude_target=False) == 0.75
    with pytest.raises(ValueError, match="no triggered rows"):
        backdoor_success_rate([5], [5], target_label=5)


def test_binary_auc() -> None:
    assert binary_auc(torch.tensor([0.1, 0.4, 0.35, 0.8]), [0, 0, 1, 1]) == 0.75
    with pytest.raises(ValueError, match="both classes"):
        binary_auc([0.1, 0.2], [1, 1])


def test_plots_write_png_files(tmp_path: Path) -> None:
    counts = confusion_matrix([0, 1, 2, 2], [0, 2, 2, 1], 3)
    confusion_png = plot_confusion_matrix(counts, tmp_path / "pd.png", "PD matrix")
    series = {
        "DP-G": [TradeoffPoint(0.01, 0.95, 0.9), TradeoffPoint(0.1, 0.7, 0.3)],
        "CAE": [TradeoffPoint(1.0, 0.94, 0.05)],
    }
    tradeoff_png = plot_tradeoff(series, tmp_path / "tradeoff.png", "digits, B = 64")
    for path in (confusion_png, tradeoff_png):
        assert path.read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="series is empty"):
        plot_tradeoff({}, tmp_path / "empty.png", "nothing")
