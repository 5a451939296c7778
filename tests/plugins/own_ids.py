"""A test dataset, ``own-ids``, whose sample IDs differ in one party's process: what each party of a
real deployment holds in its own files, which the config check on another machine cannot see.

In the process started as ``--name <own_ids_at>`` (a `vflnet run` cold start), every row outside
class ``keep_class`` has an ID of its own (shifted by 10000; ``keep_class: -1``: every row). Each
process's config check sees one consistent dataset; only at admission do the IDs differ. In the
process of ``missing_at`` the data cannot be read at all.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from vflnet.data.datasets import Dataset, register_dataset
from vflnet.registry import Param

N, FEATURES, CLASSES = 120, 6, 3


def _own_process(name: str) -> bool:
    argv = sys.argv
    return any(a == "--name" and b == name for a, b in zip(argv, argv[1:], strict=False))


@register_dataset(
    "own-ids",
    "test only: one party's process holds other sample IDs",
    {
        "own_ids_at": Param("", "the party whose process holds other IDs", lambda v: isinstance(v, str)),
        "keep_class": Param(-1, "rows of this class keep their IDs there (-1: none)", lambda v: v >= -1),
        "missing_at": Param("", "the party whose process cannot read the data", lambda v: isinstance(v, str)),
    },
)
def own_ids(params: dict[str, Any]) -> Dataset:
    if params["missing_at"] and _own_process(params["missing_at"]):
        raise OSError(f"the data file of {params['missing_at']} is not there")
    rng = np.random.default_rng(0)
    labels = np.arange(N, dtype=np.int64) % CLASSES
    features = (rng.normal(size=(N, FEATURES)) + labels[:, None]).astype(np.float32)
    ids = np.arange(N, dtype=np.int64)
    if params["own_ids_at"] and _own_process(params["own_ids_at"]):
        ids = np.where(labels == params["keep_class"], ids, ids + 10000)
    return Dataset("own-ids", ids, features, labels, CLASSES, is_image=False)
