"""vflnet.metrics.auditing against hand-computed values: ROC, TPR at a low FPR, Clopper-Pearson, the
empirical epsilon lower bound, the empirical p-value and Holm's correction."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vflnet.metrics.auditing import (
    auc,
    bootstrap,
    clopper_pearson,
    empirical_p,
    epsilon_lower_bound,
    holm,
    roc,
    tpr_at_fpr,
)

SCORES = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4])
POSITIVE = np.array([1, 1, 0, 1, 0, 0], dtype=bool)


def test_roc_and_tpr_at_low_fpr_by_hand() -> None:
    fpr, tpr = roc(SCORES, POSITIVE)
    assert fpr.tolist() == pytest.approx([0, 0, 0, 1 / 3, 1 / 3, 2 / 3, 1])
    assert tpr.tolist() == pytest.approx([0, 1 / 3, 2 / 3, 2 / 3, 1, 1, 1])
    assert tpr_at_fpr(SCORES, POSITIVE, 0.0) == pytest.approx(2 / 3)  # two positives above every negative
    assert tpr_at_fpr(SCORES, POSITIVE, 0.01) == pytest.approx(2 / 3)
    assert tpr_at_fpr(SCORES, POSITIVE, 0.34) == pytest.approx(1.0)
    assert auc(SCORES, POSITIVE) == pytest.approx(8 / 9)  # 8 of the 9 (positive, negative) pairs ordered
    tied = np.array([0.5, 0.5, 0.5, 0.5])
    assert tpr_at_fpr(tied, POSITIVE[:4], 0.01) == 0.0 and auc(tied, POSITIVE[:4]) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="positives and negatives"):
        roc(SCORES, np.ones(6, dtype=bool))


def test_bootstrap_interval_holds_the_figure() -> None:
    rng = np.random.default_rng(1)
    positive = rng.random(400) < 0.5
    scores = positive + rng.normal(0, 1, 400)
    low, high = bootstrap(auc, scores, positive, resamples=200)
    assert low < auc(scores, positive) < high and high - low < 0.2
    assert bootstrap(auc, scores, positive, resamples=200) == (low, high)  # seeded


def test_clopper_pearson_by_hand() -> None:
    # k = 0 and k = n have closed forms: (alpha/2)^(1/n)
    assert clopper_pearson(0, 10) == pytest.approx((0.0, 1 - 0.025 ** (1 / 10)))
    assert clopper_pearson(10, 10) == pytest.approx((0.025 ** (1 / 10), 1.0))
    assert clopper_pearson(5, 10) == pytest.approx((0.18709, 0.81291), abs=1e-5)  # tabulated
    with pytest.raises(ValueError):
        clopper_pearson(3, 2)


def test_epsilon_lower_bound_by_hand() -> None:
    # no error on 100 positives and 100 negatives: both rates are bounded by the one-sided 97.5% bound
    bound = 1 - 0.025 ** (1 / 100)
    assert epsilon_lower_bound(0, 100, 0, 100) == pytest.approx(math.log((1 - bound) / bound))
    # a coin: errors at half the samples admit epsilon 0
    assert epsilon_lower_bound(50, 100, 50, 100) == 0.0
    # delta lowers it
    assert epsilon_lower_bound(0, 100, 0, 100, delta=0.1) < epsilon_lower_bound(0, 100, 0, 100)


def test_holm_on_a_synthetic_family() -> None:
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # 30 rows of a null at 95%: a raw p of 0.02 is no finding once corrected
    family = [0.02] + [0.5] * 29
    assert holm(family)[0] == pytest.approx(0.6)
    assert holm([0.3, 0.2]) == pytest.approx([0.4, 0.4])  # monotone: 0.3 x 1 is raised to 0.2 x 2
    assert holm([0.9, 0.8]) == [1.0, 1.0]  # capped at 1
    assert holm([]) == []


def test_empirical_p_value() -> None:
    assert empirical_p(0.9, [0.1] * 19) == pytest.approx(1 / 20)
    assert empirical_p(0.1, [0.1] * 19) == 1.0  # ties count as extreme
    assert empirical_p(0.1, [0.5, 0.6, 0.05], higher_leaks=False) == pytest.approx(2 / 4)
