"""The correctness oracle: the same VFL model trained in one process, end to end with autograd,
with no transport, no roles and no protocol code. Same seeds, same alignment, same batch schedule.

A distributed `split` run must end with the same parameters as this trainer (tests check it), which
is what shows the wire, the roles and the step protocol neither drop nor corrupt anything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.nn import functional as F

from vflnet.config import Config
from vflnet.data.alignment import epoch_batches, eval_batches, intersect, split_train_test
from vflnet.data.datasets import load_dataset
from vflnet.data.partition import normalize, party_view
from vflnet.models.optim import build_optimizer, build_schedule
from vflnet.models.zoo import aggregate, build_party_modules
from vflnet.threat.knowledge import run_split


@dataclass
class ReferenceResult:
    states: dict[str, dict[str, dict[str, torch.Tensor]]]  # party -> module name -> state dict
    steps: int
    train_seconds: float
    history: list[dict[str, Any]] = field(default_factory=list)
    predictions: dict[str, np.ndarray] = field(default_factory=dict)  # sample_ids, confidence (softmax)

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.train_seconds if self.train_seconds else float("nan")


def train_reference(
    cfg: Config, *, evaluate: bool = True, predict_ids: np.ndarray | None = None
) -> ReferenceResult:
    """Train as the distributed run does; with ``predict_ids``, also the trained model's confidence
    vectors on those samples (what the prediction phase must deliver to the active party)."""
    torch.set_num_threads(cfg.runtime.torch_threads)
    dataset = load_dataset(cfg.data.dataset, cfg.data.params)
    holders = [p for p in cfg.parties if p.role != "coordinator"]
    views = {p.name: party_view(cfg, p.name, dataset) for p in holders}
    common = intersect([v.ids for v in views.values()])
    train_ids, test_ids = split_train_test(common, cfg.data.test_fraction, cfg.run.seed)

    feature_parties = cfg.feature_parties  # aggregation order: active (if it has features), passives
    xs, modules, optimizers, schedules = {}, {}, [], []
    for p in holders:
        view = views[p.name]
        if view.x is not None:
            xs[p.name] = torch.from_numpy(
                normalize(view.x, view.rows(train_ids), cfg.data.normalize, dataset.is_image)
            )
        bottom, top = build_party_modules(
            cfg, p, tuple(view.x.shape[1:]) if view.x is not None else None, view.n_classes
        )
        own = {k: m for k, m in (("bottom", bottom), ("top", top)) if m is not None}
        modules[p.name] = own
        params = [q for m in own.values() for q in m.parameters()]
        if params:
            opt = build_optimizer(params, cfg.train.optimizer)
            optimizers.append(opt)
            schedules.append(build_schedule(opt, cfg.train.lr_schedule))
    active = views[cfg.active.name]
    assert active.y is not None
    labels = torch.from_numpy(active.y)

    def logits_for(ids: np.ndarray) -> torch.Tensor:
        parts = [modules[p.name]["bottom"](xs[p.name][views[p.name].rows(ids)]) for p in feature_parties]
        return modules[cfg.active.name]["top"](aggregate(parts, cfg.protocol.aggregation))

    t = cfg.train
    steps, seconds, history = 0, 0.0, []
    for epoch in range(t.epochs):
        if epoch > 0:
            for s in schedules:
                if s is not None:
                    s.step()
        start = time.perf_counter()
        for ids in epoch_batches(train_ids, t.batch_size, epoch, cfg.run.seed, t.drop_last):
            loss = F.cross_entropy(logits_for(ids), labels[active.rows(ids)])
            for opt in optimizers:
                opt.zero_grad(set_to_none=True)
            loss.backward()
            for opt in optimizers:
                opt.step()
            steps += 1
            if t.max_steps and steps >= t.max_steps:
                break
        seconds += time.perf_counter() - start
        if evaluate:
            history.append(
                {"epoch": epoch, **_evaluate(logits_for, labels, active.rows, test_ids, t.eval_batch_size)}
            )
        if t.max_steps and steps >= t.max_steps:
            break
    predictions = {}
    if predict_ids is not None:
        for own in modules.values():
            for m in own.values():
                m.eval()
        with torch.no_grad():
            logits = torch.cat(
                [logits_for(chunk) for chunk in eval_batches(predict_ids, cfg.predict.batch_size)]
            )
        predictions = {"sample_ids": predict_ids, "confidence": torch.softmax(logits.double(), dim=1).numpy()}
    states = {
        name: {k: {n: v.detach().clone() for n, v in m.state_dict().items()} for k, m in own.items()}
        for name, own in modules.items()
    }
    return ReferenceResult(states, steps, seconds, history, predictions)


def _evaluate(
    logits_for: Any, labels: torch.Tensor, rows: Any, ids: np.ndarray, batch: int
) -> dict[str, float]:
    correct, loss_sum = 0, 0.0
    with torch.no_grad():
        for chunk in eval_batches(ids, batch):
            logits, y = logits_for(chunk), labels[rows(chunk)]
            loss_sum += float(F.cross_entropy(logits, y)) * len(chunk)
            correct += int((logits.argmax(1) == y).sum())
    return {"test_loss": loss_sum / len(ids), "test_accuracy": correct / len(ids)}


@dataclass
class TreeViews:
    """What the `secureboost` parties hold, in the protocol's party order (the label holder first when
    it has features, then the passive parties): normalised features over the same rows, the labels,
    and the run's train/test rows."""

    xs: list[np.ndarray]
    y: np.ndarray
    n_classes: int
    train_rows: np.ndarray
    test_rows: np.ndarray
    test_ids: np.ndarray


def tree_views(cfg: Config) -> TreeViews:
    """The parties' data as the run holds it, for the one-process tree (`train_local`)."""
    dataset = load_dataset(cfg.data.dataset, cfg.data.params)
    views = [party_view(cfg, p.name, dataset) for p in [cfg.active, *cfg.passives]]
    train_ids, test_ids = run_split(cfg, dataset)
    if any(not np.array_equal(v.ids, views[0].ids) for v in views):
        raise ValueError("the one-process tree needs every party's rows in the same order")
    xs = [
        normalize(v.x, v.rows(train_ids), cfg.data.normalize, dataset.is_image)
        for v in views
        if v.x is not None
    ]
    y = views[0].y
    assert y is not None
    return TreeViews(xs, y, dataset.n_classes, views[0].rows(train_ids), views[0].rows(test_ids), test_ids)
