"""Is the top model of a `vflnet reproduce hashvfl` MNIST run as good as its shape allows on what the
parties send? Loads the run's checkpoints, computes both parties' final blocks (codes or embeddings)
for the train and test images, and prints the test accuracy of:

- the top as trained;
- the Bayes lookup table over the 2 x d-bit code pairs seen in training (codes only; unseen pairs
  fall back to the trained top);
- a fresh top of the same shape (Adam 3e-3, batch 256, no weight decay) fitted on the final train
  blocks alone, for each number of epochs given, two seeds.

Run from the repository root, on a finished run directory (its config is `<dir>.yaml` beside it):
.venv/bin/python scripts/hashvfl_top_refit.py runs/reproduce-hashvfl/mnist-hashvfl-4b-s0 [--epochs 30,300]
"""

from __future__ import annotations

import argparse
import collections
from pathlib import Path

import numpy as np
import torch

from vflnet.config import Config
from vflnet.data.datasets import load_dataset
from vflnet.models.zoo import TopModel
from vflnet.threat.knowledge import run_split
from vflnet.tools.reproduce.hashvfl import party_blocks, signs, trained_top
from vflnet.validation import load_config


def lookup_table(
    x_train: torch.Tensor, y_train: np.ndarray, x_test: torch.Tensor, fallback: np.ndarray
) -> np.ndarray:
    """Predicts each test code pair's most frequent training label; ``fallback`` for pairs never seen."""
    votes: dict[tuple[int, ...], collections.Counter[int]] = collections.defaultdict(collections.Counter)
    for row, y in zip(x_train.int().tolist(), y_train.tolist(), strict=True):
        votes[tuple(row)][y] += 1
    return np.array(
        [
            votes[tuple(row)].most_common(1)[0][0] if tuple(row) in votes else int(f)
            for row, f in zip(x_test.int().tolist(), fallback, strict=True)
        ]
    )


def refit(cfg: Config, x: torch.Tensor, y: np.ndarray, epochs: int, seed: int) -> TopModel:
    torch.manual_seed(seed)
    top = TopModel(cfg.model.top, x.shape[1], 10)
    opt = torch.optim.Adam(top.parameters(), 3e-3)
    labels = torch.from_numpy(y)
    for _ in range(epochs):
        order = torch.randperm(len(x))
        for i in range(0, len(x), 256):
            batch = order[i : i + 256]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(top(x[batch]), labels[batch]).backward()
            opt.step()
    return top.eval()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--epochs", default="30,100,300", help="refit lengths in epochs of 4,000 images")
    args = parser.parse_args()
    torch.set_num_threads(2)
    cfg = load_config(args.run_dir.parent / f"{args.run_dir.name}.yaml")
    variant = cfg.protocol.params.get("variant", "hashvfl") if cfg.protocol.kind == "hashvfl" else None
    data = load_dataset(cfg.data.dataset, cfg.data.params)
    train, test = run_split(cfg, data)
    label_of = dict(zip(data.ids.tolist(), data.labels.tolist(), strict=True))
    y_train, y_test = (np.array([label_of[i] for i in ids.tolist()]) for ids in (train, test))
    x_train, x_test = (
        torch.cat(party_blocks(cfg, args.run_dir, variant, data, ids), 1) for ids in (train, test)
    )
    top = trained_top(cfg, args.run_dir, x_train.shape[1])

    def acc(model: torch.nn.Module, x: torch.Tensor, y: np.ndarray) -> float:
        with torch.no_grad():
            return 100 * float((model(x).argmax(1).numpy() == y).mean())

    print(f"{args.run_dir.name} ({variant or 'no defense'}); accuracy %, train images without shifts")
    print(f"  top as trained: train {acc(top, x_train, y_train):.2f}, test {acc(top, x_test, y_test):.2f}")
    if signs(variant):
        with torch.no_grad():
            fallback = top(x_test).argmax(1).numpy()
        table = lookup_table(x_train, y_train, x_test, fallback)
        print(f"  lookup table over code pairs: test {100 * float(np.mean(table == y_test)):.2f}")
    for epochs in (int(e) for e in args.epochs.split(",")):
        fits = [refit(cfg, x_train, y_train, epochs, seed) for seed in (0, 1)]
        cells = ", ".join(
            f"train {acc(t, x_train, y_train):.2f} test {acc(t, x_test, y_test):.2f}" for t in fits
        )
        print(f"  same-shape top refit, {epochs} epochs ({epochs * -(-len(x_train) // 256)} steps): {cells}")


if __name__ == "__main__":
    main()
