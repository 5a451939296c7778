"""In-process stand-in for paper 004's two-party VFL, used only by the label attack/defense unit tests.

A plain torch loop: the active party (left 32 pixels of sklearn digits, the labels) and the passive party
(right 32 pixels) each run a 2-layer MLP (hidden 32) to C local logits; the logits are summed, softmax + CE,
batch-averaged. The active party computes dL/dH, applies its defense and hands the result to the passive,
which backpropagates it through its own model. Each step yields exactly the two views a passive attacker
would record: per-sample gradients (plaintext split) and its batch-level parameter gradient (split-he).
The real protocols live in vflnet.protocols; this file also checks the stand-in's own invariants.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import Tensor, nn

from vflnet.attacks.label_inference import BatchGradientView, SampleGradientView
from vflnet.defenses.label_defenses import LabelDefense, soft_cross_entropy

HIDDEN = 32


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The many tiny ops of these tests run ~10x slower with two threads on a shared 2-core box."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@dataclass(frozen=True)
class Split:
    active: Tensor
    passive: Tensor
    labels: Tensor


def digits(seed: int = 0) -> tuple[Split, Split]:
    """Standardised digits, left/right 4-column halves of each 8x8 image; train and test splits."""
    data = load_digits()
    images = data.images.astype(np.float32) / 16.0
    left = images[:, :, :4].reshape(len(images), -1)
    right = images[:, :, 4:].reshape(len(images), -1)
    idx_train, idx_test = train_test_split(
        np.arange(len(images)), test_size=0.25, random_state=seed, stratify=data.target
    )
    mean_l, std_l = left[idx_train].mean(0), left[idx_train].std(0) + 1e-3
    mean_r, std_r = right[idx_train].mean(0), right[idx_train].std(0) + 1e-3
    left, right = (left - mean_l) / std_l, (right - mean_r) / std_r

    def split(idx: np.ndarray) -> Split:
        return Split(torch.tensor(left[idx]), torch.tensor(right[idx]), torch.tensor(data.target[idx]).long())

    return split(idx_train), split(idx_test)


def party_mlp(num_inputs: int, num_classes: int) -> nn.Sequential:
    """Paper 004's per-party model: 2-layer MLP, 32 hidden units, C local logits. Last layer is named "2"."""
    return nn.Sequential(nn.Linear(num_inputs, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, num_classes))


@dataclass(frozen=True)
class StepViews:
    plaintext: SampleGradientView
    he: BatchGradientView
    true_labels: Tensor  # for the scorer only; never handed to an attack


class TwoPartyVFL:
    """Active + passive party trained in one process; `step` returns what the passive could record."""

    def __init__(self, num_classes: int = 10, lr: float = 0.01, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.num_classes = num_classes
        self.active = party_mlp(32, num_classes)
        self.passive = party_mlp(32, num_classes)
        self.active_opt = torch.optim.Adam(self.active.parameters(), lr=lr)
        self.passive_opt = torch.optim.Adam(self.passive.parameters(), lr=lr)

    def step(self, data: Split, ids: Tensor, defense: LabelDefense, update: bool = True) -> StepViews:
        labels = data.labels[ids]
        # Passive forward (its snapshot is what it legitimately keeps for the attack).
        snapshot = copy.deepcopy(self.passive)
        passive_logits = self.passive(data.passive[ids])
        # Active: aggregate, loss against its (possibly fake) targets, dL/dH, defense on what it sends.
        active_logits = self.active(data.active[ids])
        logits = active_logits + passive_logits.detach().requires_grad_()
        loss = soft_cross_entropy(logits, defense.train_targets(labels))
        self.active_opt.zero_grad()
        grad_logits = torch.autograd.grad(loss, logits, retain_graph=True)[0]
        loss.backward()
        sent = defense.transform(grad_logits.detach(), labels)
        # Passive backward with what it received; the batch-level gradient is all it sees under HE.
        self.passive_opt.zero_grad()
        passive_logits.backward(sent)
        param_grads = {n: p.grad.detach().clone() for n, p in self.passive.named_parameters()}
        if update:
            self.active_opt.step()
            self.passive_opt.step()
        return StepViews(
            plaintext=SampleGradientView(ids, sent),
            he=BatchGradientView(ids, data.passive[ids], snapshot, param_grads, self.num_classes),
            true_labels=labels,
        )

    def train(self, data: Split, defense: LabelDefense, epochs: int, batch_size: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        for _ in range(epochs):
            for ids in torch.randperm(len(data.labels), generator=gen).split(batch_size):
                self.step(data, ids, defense)

    @torch.no_grad()
    def accuracy(self, data: Split, defense: LabelDefense) -> float:
        logits = self.active(data.active) + self.passive(data.passive)
        return float((defense.predict(logits) == data.labels).float().mean())


def test_batch_gradient_is_sum_of_per_sample_terms() -> None:
    """The stand-in's HE view equals sum_i J_i^T g_i of its plaintext view (eq. 4), so both views agree."""
    train, _ = digits()
    vfl = TwoPartyVFL()
    views = vfl.step(train, torch.arange(16), LabelDefense(10), update=False)
    model = views.he.model
    recomputed = torch.autograd.grad(
        (model(views.he.features) * views.plaintext.grad_logits).sum(), list(model.parameters())
    )
    for (name, _), grad in zip(model.named_parameters(), recomputed, strict=True):
        torch.testing.assert_close(views.he.param_grads[name], grad)


def test_sent_gradient_rows_follow_lemma_1_shape() -> None:
    """Undefended dL/dH rows sum to zero and carry the 1/B factor of the batch-averaged loss."""
    train, _ = digits()
    views = TwoPartyVFL().step(train, torch.arange(8), LabelDefense(10), update=False)
    grad = views.plaintext.grad_logits
    torch.testing.assert_close(grad.sum(1), torch.zeros(8), atol=1e-7, rtol=0)
    assert float(grad.abs().max()) <= 1.0 / 8
