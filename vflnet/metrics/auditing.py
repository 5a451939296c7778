"""The privacy-auditing figures of an attack's per-sample scores and of a set of verdicts.

- ROC and TPR at a low FPR (ML Privacy Meter, Carlini et al.'s "first principles" figures), with a
  percentile bootstrap interval over the samples;
- the Clopper-Pearson interval of a binomial rate and, from the upper bounds of an attack's FPR and FNR,
  the empirical epsilon lower bound of a (epsilon, delta)-DP mechanism (Jagielski et al. 2020, Nasr et
  al. 2021): any test of a DP mechanism has FPR + e^eps FNR >= 1 - delta and FNR + e^eps FPR >= 1 - delta;
- the empirical p-value of a statistic against a null distribution, and Holm's step-down correction of a
  family of p-values (the rows of one audit).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy.stats import beta


def roc(scores: np.ndarray, positive: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(FPR, TPR) at every threshold "score >= t", from the strictest (0, 0) to (1, 1); ties move
    together. Needs both classes."""
    scores, positive = np.asarray(scores, dtype=float), np.asarray(positive, dtype=bool)
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError(f"a ROC needs positives and negatives, got {n_pos} and {n_neg}")
    order = np.argsort(-scores, kind="stable")
    s, p = scores[order], positive[order]
    last = np.r_[np.flatnonzero(np.diff(s) != 0), len(s) - 1]  # the last index of each distinct score
    tp, fp = np.cumsum(p)[last], np.cumsum(~p)[last]
    return np.r_[0.0, fp / n_neg], np.r_[0.0, tp / n_pos]


def tpr_at_fpr(scores: np.ndarray, positive: np.ndarray, fpr: float) -> float:
    """The highest TPR of a threshold whose FPR is at most ``fpr`` (0 if none but the strictest)."""
    f, t = roc(scores, positive)
    return float(t[f <= fpr + 1e-12].max())


def auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """Area under the ROC (ties count one half)."""
    f, t = roc(scores, positive)
    return float(np.trapezoid(t, f))


def bootstrap(
    stat: Callable[[np.ndarray, np.ndarray], float],
    scores: np.ndarray,
    positive: np.ndarray,
    resamples: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile bootstrap interval of ``stat(scores, positive)``, resampling the samples (a resample
    holding one class only is drawn again)."""
    rng = np.random.default_rng(seed)
    scores, positive = np.asarray(scores, dtype=float), np.asarray(positive, dtype=bool)
    n, values = len(scores), []
    while len(values) < resamples:
        idx = rng.integers(0, n, n)
        if positive[idx].all() or not positive[idx].any():
            continue
        values.append(stat(scores[idx], positive[idx]))
    tail = (1 - level) / 2
    return float(np.quantile(values, tail)), float(np.quantile(values, 1 - tail))


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact two-sided interval of a binomial rate, k successes of n."""
    if n <= 0 or not 0 <= k <= n:
        raise ValueError(f"expected 0 <= k <= n and n > 0, got k={k}, n={n}")
    alpha = 1 - level
    low = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    high = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return low, high


def epsilon_lower_bound(
    false_pos: int, negatives: int, false_neg: int, positives: int, delta: float = 0.0, level: float = 0.95
) -> float:
    """The epsilon any (epsilon, delta)-DP mechanism must at least have for a test to reach these error
    counts, at confidence ``level``: from the Clopper-Pearson upper bounds of its FPR and FNR (the two
    one-sided bounds at (1 + level) / 2 each, so both hold together at ``level``), the larger of
    log((1 - delta - FNR) / FPR) and log((1 - delta - FPR) / FNR); 0 where the bounds admit no leak."""
    both = 1 - (1 - level) / 2
    fpr = clopper_pearson(false_pos, negatives, 2 * both - 1)[1]
    fnr = clopper_pearson(false_neg, positives, 2 * both - 1)[1]
    out = 0.0
    for a, b in ((fnr, fpr), (fpr, fnr)):
        if b > 0 and 1 - delta - a > b:
            out = max(out, math.log((1 - delta - a) / b))
    return out


def empirical_p(value: float, null: Sequence[float], higher_leaks: bool = True) -> float:
    """The one-sided p-value of ``value`` against draws of its null distribution: (1 + the draws at least
    as extreme) / (1 + draws), never 0 (Phipson and Smyth 2010)."""
    if not null:
        raise ValueError("an empirical p-value needs at least one null draw")
    beyond = sum(1 for v in null if (v >= value if higher_leaks else v <= value))
    return (1 + beyond) / (1 + len(null))


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error control), in the order given: the i-th
    smallest is multiplied by (m - i), made monotone, and capped at 1."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted
