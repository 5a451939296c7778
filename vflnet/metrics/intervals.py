"""Confidence intervals of a figure measured over several trials or seeds."""

from __future__ import annotations

import numpy as np


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """The mean over trials and the half-width of its t-based confidence interval (Student's t with
    k - 1 degrees of freedom, the sample standard deviation); nan for the half-width with one trial."""
    import scipy.stats  # only where an interval is asked for: scipy is slow to import

    x = np.asarray(values, dtype=float)
    if len(x) < 2:
        return float(x.mean()), float("nan")
    t = scipy.stats.t.ppf(0.5 + level / 2, len(x) - 1)
    return float(x.mean()), float(t * x.std(ddof=1) / np.sqrt(len(x)))
