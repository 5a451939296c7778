"""Degenerate runs, refused before training: the facts of a run's plan (the aligned samples, the
train/test split, the training steps, the classes in the training labels) and what makes one of
them unable to give a meaningful result (no common sample id, zero training steps, an empty test
split, one class to learn).

One computation, from the functions the coordinator's schedule uses (vflnet/data/alignment.py),
checked at two places: at config check, where the dataset gives every party's IDs and the labels
(`vflnet.validation.check_against_dataset`), and at admission, from the IDs the parties joined with
(`vflnet.roles.coordinator.Admission`; the active party checks its own labels on the split it is
given, since the coordinator never sees them). Each refusal names the config keys that cause it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from vflnet.config import Config, ConfigError
from vflnet.data.alignment import epoch_batches, intersect, split_train_test
from vflnet.data.datasets import Dataset
from vflnet.data.partition import held_rows


@dataclass(frozen=True)
class PlanFacts:
    held: dict[str, int]  # party -> how many sample ids it holds
    n_common: int
    n_train: int
    n_test: int
    steps_per_epoch: int
    total_steps: int
    train_classes: list[int] | None  # the classes in the training labels; None where unknown


@dataclass(frozen=True)
class Degenerate:
    """Why a run cannot train, and the config keys that decide it."""

    keys: tuple[str, ...]
    message: str

    def __str__(self) -> str:
        return f"{self.message} (set by {', '.join(self.keys)})"


def aligned_split(cfg: Config, held: Mapping[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The run's training and test IDs from the IDs each party holds."""
    return split_train_test(intersect(list(held.values())), cfg.data.test_fraction, cfg.run.seed)


def training_steps(cfg: Config, train_ids: np.ndarray) -> tuple[int, int]:
    """Training steps per epoch and in all, as the coordinator's schedule runs them."""
    t = cfg.train
    per_epoch = len(epoch_batches(train_ids, t.batch_size, 0, cfg.run.seed, t.drop_last))
    total = per_epoch * t.epochs
    return per_epoch, min(total, t.max_steps) if t.max_steps else total


def plan_facts(
    cfg: Config,
    held: Mapping[str, int],
    train_ids: np.ndarray,
    test_ids: np.ndarray,
    train_labels: np.ndarray | None = None,
) -> PlanFacts:
    per_epoch, total = training_steps(cfg, train_ids)
    return PlanFacts(
        held=dict(held),
        n_common=len(train_ids) + len(test_ids),
        n_train=len(train_ids),
        n_test=len(test_ids),
        steps_per_epoch=per_epoch,
        total_steps=total,
        train_classes=None if train_labels is None else sorted(np.unique(train_labels).tolist()),
    )


def _sample_keys(cfg: Config) -> tuple[str, ...]:
    """The keys that decide which samples the run has: the parties' own files, or the dataset and each
    party's sample_fraction."""
    if cfg.sources:
        return tuple(f"parties[{i}].source.path" for i, p in enumerate(cfg.parties) if p.source is not None)
    fractions = [f"parties[{i}].sample_fraction" for i, p in enumerate(cfg.parties) if p.sample_fraction < 1]
    return (*fractions, "data.dataset")


def degenerate(cfg: Config, facts: PlanFacts) -> list[Degenerate]:
    """Every fact of the plan that leaves the run nothing meaningful to do, with its cause."""
    t, samples = cfg.train, _sample_keys(cfg)
    if facts.n_common == 0:
        held = ", ".join(f"{p.name} holds {facts.held[p.name]}" for p in cfg.parties if p.name in facts.held)
        return [Degenerate(samples, f"no sample id is common to all parties ({held})")]
    found = []
    split = (
        f"{facts.n_common} common samples split by data.test_fraction {cfg.data.test_fraction:g} into "
        f"{facts.n_train} for training and {facts.n_test} for testing"
    )
    if facts.n_train == 0:
        found.append(Degenerate(("data.test_fraction", *samples), f"0 training steps: {split}"))
    elif facts.total_steps == 0:
        found.append(
            Degenerate(
                ("train.batch_size", "train.drop_last"),
                f"0 training steps: train.batch_size {t.batch_size} is larger than the {facts.n_train} "
                "training samples and train.drop_last is true, so the only batch of each epoch is dropped",
            )
        )
    if facts.n_test == 0 and (t.eval_every > 0 or cfg.predict.set == "test"):  # a run that uses it
        found.append(Degenerate(("data.test_fraction", *samples), f"an empty test split: {split}"))
    if facts.train_classes is not None and facts.n_train and len(facts.train_classes) < 2:
        found.append(
            Degenerate(
                samples,
                f"the {facts.n_train} training labels hold one class only (class {facts.train_classes[0]}): "
                "there is nothing to learn",
            )
        )
    return found


def refusal(cfg: Config, facts: PlanFacts) -> str | None:
    """Why the run cannot train (every cause found, each with its keys), or None."""
    found = degenerate(cfg, facts)
    return f"run {cfg.run.id!r} cannot train: " + "; ".join(map(str, found)) if found else None


def check_dataset_plan(cfg: Config, data: Dataset) -> None:
    """At config check: the plan of the run from the dataset, as the parties will hold it; its first
    degenerate fact is a ConfigError naming its key (and the others that decide it)."""
    rows = {p.name: held_rows(cfg, p, data) for p in cfg.parties if p.role != "coordinator"}
    train, test = aligned_split(cfg, {n: data.ids[r] for n, r in rows.items()})
    active = rows[cfg.active.name]  # held_rows: sorted by id, and only the active party holds labels
    labels = data.labels[active][np.searchsorted(data.ids[active], train)]
    facts = plan_facts(cfg, {n: len(r) for n, r in rows.items()}, train, test, labels)
    for found in degenerate(cfg, facts):
        raise ConfigError(cfg.source, found.keys[0], f"the run cannot train: {found}")
