"""Sample alignment and the batch schedule: pure, seeded functions shared by the coordinator and the
in-process reference trainer, so both see exactly the same batches."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np


def intersect(id_sets: Sequence[np.ndarray]) -> np.ndarray:
    """IDs every party holds, sorted (the run's aligned sample set)."""
    common = np.asarray(id_sets[0], dtype=np.int64)
    for ids in id_sets[1:]:
        common = np.intersect1d(common, np.asarray(ids, dtype=np.int64))
    return np.unique(common)


def split_train_test(ids: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 1])
    order = rng.permutation(len(ids))
    n_test = int(round(len(ids) * test_fraction))
    return np.sort(ids[order[n_test:]]), np.sort(ids[order[:n_test]])


def epoch_batches(
    train_ids: np.ndarray, batch_size: int, epoch: int, seed: int, drop_last: bool
) -> list[np.ndarray]:
    """The seeded shuffle of one epoch, cut into batches of sample IDs."""
    rng = np.random.default_rng([seed, 2, epoch])
    shuffled = train_ids[rng.permutation(len(train_ids))]
    batches = [shuffled[i : i + batch_size] for i in range(0, len(shuffled), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


def eval_batches(ids: np.ndarray, batch_size: int) -> Iterator[np.ndarray]:
    for i in range(0, len(ids), batch_size):
        yield ids[i : i + batch_size]
