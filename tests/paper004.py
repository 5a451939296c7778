"""Paper 004's two-party VFL as real runs, for the label attack and defense unit tests.

The `split` (or `split-he`) protocol runs with every role in this process over the loopback bridge
(vflnet.runner.loopback): the active party holds the left 8x4 half of each sklearn digit and the
labels, the passive party `passive-1` the right half; each runs paper 004's per-party MLP (32 -> 32 ->
ReLU -> C logits), the logits are summed (no top model), Adam 0.01, a quarter of the samples held out;
each party standardises its own pixels with its own training rows' statistics (`normalize: standard`:
on raw [0, 1] pixels some hidden ReLU units die within 20 steps and Theorem 1's rank condition fails
already at B = 32).
The active party's label defense, if any, is a configured defense. The passive attacker's views come
from its own wire and own view, recorded by the `view-recorder` test attack (tests/plugins/
view_recorder.py) exactly as the real label attacks receive them; the tests run the algorithm cores
on them. Ground-truth labels are loaded only to score.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from vflnet.attacks.label_inference import BatchGradientView, SampleGradientView
from vflnet.config import Config, ModelConfig
from vflnet.data.datasets import load_dataset
from vflnet.data.partition import party_view
from vflnet.models.zoo import build_bottom
from vflnet.runner.loopback import run_loopback
from vflnet.threat.knowledge import run_split
from vflnet.validation import config_from_dict

HIDDEN = 32
ATTACKER = "passive-1"


def config(
    *,
    batch: int,
    record: tuple[int, int] = (1, 0),
    max_steps: int = 0,
    epochs: int = 1,
    defense: tuple[str, dict[str, Any]] | None = None,
    positive_class: int | None = None,
    protocol: str = "split",
    seed: int = 0,
) -> dict[str, Any]:
    """The run config; ``record`` = (first, last) training step the attacker's views are kept for
    (last 0: to the end); ``positive_class``: that digit against the rest (a binary task)."""
    classes = 10 if positive_class is None else 2
    bottom = {"kind": "mlp", "hidden": [HIDDEN], "out": classes}
    proto: dict[str, Any] = {"kind": protocol, "aggregation": "sum"}
    if protocol == "split-he":
        proto["params"] = {"key_bits": 512, "allow_insecure_keys": True}
    data: dict[str, Any] = {"dataset": "digits", "test_fraction": 0.25, "normalize": "standard"}
    if positive_class is not None:
        data["params"] = {"positive_class": positive_class}
    return {
        "run": {"id": "paper004", "seed": seed},
        "protocol": proto,
        "data": data,
        "parties": [
            {"name": "coordinator", "role": "coordinator"},
            {"name": "active", "role": "active", "features": {"region": [0, 8, 0, 4]}, "bottom": bottom},
            {
                "name": ATTACKER,
                "role": "passive",
                "features": {"region": [0, 8, 4, 8]},
                "bottom": dict(bottom),
            },
        ],
        "model": {"top": {"kind": "none"}},
        "train": {
            "epochs": epochs,
            "batch_size": batch,
            "max_steps": max_steps,
            "eval_every": 1000,
            "optimizer": {"kind": "adam", "lr": 0.01},
        },
        "transport": {"bridge": "loopback", "rpc_timeout_s": 120, "join_timeout_s": 120},
        "plugins": ["tests.plugins.view_recorder"],
        "attacks": [
            {
                "name": "view-recorder",
                "party": ATTACKER,
                "params": {"first_step": record[0], "last_step": record[1]},
            }
        ],
        "defenses": []
        if defense is None
        else [{"name": defense[0], "party": "active", "params": defense[1]}],
    }


@dataclass(frozen=True)
class StepViews:
    plaintext: SampleGradientView | None  # None under split-he: the replies carry ciphertexts
    he: BatchGradientView
    true_labels: torch.Tensor  # for the scorer only; never handed to an attack


@dataclass
class Run:
    cfg: Config
    run_dir: Path
    views: dict[int, StepViews]  # training step -> the attacker's views of it

    @property
    def test_accuracy(self) -> float:
        """The active party's main-task accuracy on the held-out samples (CAE: decoded predictions)."""
        return float(json.loads((self.run_dir / "summary.json").read_text())["final"]["test_accuracy"])

    def last(self) -> StepViews:
        return self.views[max(self.views)]

    def plaintext(self, steps: list[int] | None = None) -> tuple[SampleGradientView, torch.Tensor]:
        """The per-sample gradients of several steps (default: every recorded one) as one view, and
        the true labels of its rows."""
        steps = sorted(self.views) if steps is None else steps
        parts = [self.views[s] for s in steps]
        grads = [p.plaintext for p in parts if p.plaintext is not None]
        ids = torch.cat([g.sample_ids for g in grads])
        return SampleGradientView(ids, torch.cat([g.grad_logits for g in grads])), torch.cat(
            [p.true_labels for p in parts]
        )

    def passive_model(self) -> nn.Module:
        """The attacker's own bottom model at the end of the run (its checkpoint)."""
        model = self.bottom()
        state = torch.load(self.run_dir / "checkpoints" / f"{ATTACKER}.pt")["modules"]["bottom"]
        model.load_state_dict(state)
        return model

    def bottom(self) -> nn.Module:
        spec = self.cfg.party(ATTACKER).bottom
        assert isinstance(spec, ModelConfig)
        return build_bottom(spec, (HIDDEN,))

    def passive_rows(self, ids: np.ndarray) -> torch.Tensor:
        """The attacker's own feature rows of these samples (its own data)."""
        data = party_view(self.cfg, ATTACKER)
        assert data.x is not None
        return torch.from_numpy(data.x[data.rows(np.asarray(ids))])

    def labels(self, ids: np.ndarray) -> torch.Tensor:
        """Ground truth (scoring only)."""
        data = load_dataset(self.cfg.data.dataset, self.cfg.data.params)
        return torch.from_numpy(data.labels[np.searchsorted(data.ids, ids)])

    def split(self) -> tuple[np.ndarray, np.ndarray]:
        """The run's training and test sample IDs."""
        return run_split(self.cfg, load_dataset(self.cfg.data.dataset, self.cfg.data.params))


def steps_per_epoch(batch: int) -> int:
    """Training steps of one epoch at this batch size (the last batch of an epoch may be smaller)."""
    cfg = config_from_dict(config(batch=batch))
    train, _ = run_split(cfg, load_dataset(cfg.data.dataset, cfg.data.params))
    return math.ceil(len(train) / batch)


def run(root: Path, name: str, **kwargs: Any) -> Run:
    """Run ``config(**kwargs)`` into ``root / name`` and load the attacker's recorded views."""
    data = config(**kwargs)
    data["run"].update(dir=str(root), id=name)
    cfg = config_from_dict(data)
    run_dir = root / name
    run_dir.mkdir(parents=True)
    run_loopback(cfg, run_dir)
    out = Run(cfg, run_dir, {})
    with np.load(run_dir / "attacks" / f"view-recorder@{ATTACKER}.npz") as f:
        arrays = {k: f[k] for k in f.files}
    num_classes = int(arrays["num_classes"])
    for step in arrays["steps"].tolist():
        ids = arrays[f"{step}/sample_ids"]
        model = out.bottom()
        prefix = f"{step}/model/"
        model.load_state_dict(
            {k[len(prefix) :]: torch.from_numpy(v) for k, v in arrays.items() if k.startswith(prefix)}
        )
        grads = {
            k.split("/", 2)[2]: torch.from_numpy(v)
            for k, v in arrays.items()
            if k.startswith(f"{step}/grad/")
        }
        grad_logits = arrays.get(f"{step}/grad_logits")
        out.views[step] = StepViews(
            plaintext=None
            if grad_logits is None
            else SampleGradientView(torch.from_numpy(ids), torch.from_numpy(grad_logits)),
            he=BatchGradientView(
                torch.from_numpy(ids), torch.from_numpy(arrays[f"{step}/features"]), model, grads, num_classes
            ),
            true_labels=out.labels(ids),
        )
    return out
