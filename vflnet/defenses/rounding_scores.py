"""Paper 003 Sec. VII: round the confidence scores to b decimals before they are released."""

from __future__ import annotations

import numpy as np


def round_scores(v: np.ndarray, decimals: int) -> np.ndarray:
    """round(v * 10^b) / 10^b, as the authors' code does."""
    scale = 10.0**decimals
    return np.round(np.asarray(v, np.float64) * scale) / scale
