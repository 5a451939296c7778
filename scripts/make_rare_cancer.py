"""Write runs/cancer-rare.npz: breast_cancer with malignant = 1 kept rare (all 357 benign + 40 random
malignant, 10% positives), Li et al.'s rare-positive setting for configs/scoring-cancer.yaml."""

from pathlib import Path

import numpy as np
from sklearn.datasets import load_breast_cancer

data = load_breast_cancer()
y = 1 - data.target  # malignant = 1
malignant = np.random.default_rng(0).choice(np.flatnonzero(y == 1), 40, replace=False)
keep = np.sort(np.concatenate([np.flatnonzero(y == 0), malignant]))
out = Path("runs/cancer-rare.npz")
out.parent.mkdir(parents=True, exist_ok=True)
np.savez(out, x=data.data[keep], y=y[keep])
print(f"wrote {out} ({len(keep)} samples, {int(y[keep].sum())} positive)")
