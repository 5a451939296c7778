"""Label defenses that change the active party's training step under plaintext `split`, as VFLAIR defines
them (Zou et al., "VFLAIR: A Research Library and Benchmark for Vertical Federated Learning", ICLR 2024;
github.com/FLAIR-THU/VFLAIR: `src/models/` for MID, `src/evaluates/defenses/defense_functions.py` for
GradPerturb). Each is the `implementation` of one defense registered in `vflnet/defenses/registered.py`
and acts through the hooks of `vflnet.defenses.label_defenses.LabelDefense` that only the split active
party calls (`trainable`, `embeddings`, `gradient_noise`):

- MID (Zou et al., "Defending Batch-Level Label Inference and Replacement Attacks in Vertical Federated
  Learning", IEEE Trans. Big Data 2022): a variational information bottleneck the active party puts on
  each passive party's embedding before the top model, trained with the loss + lambda * KL(q(z|h) || N(0, I)).
- dCor (Vepakomma et al., "NoPeek: Information leakage reduction to share activations in distributed deep
  learning", 2020; against label leakage from the embedding: Sun et al., "Label Leakage and Protection from
  Forward Embedding in Vertical Federated Learning", 2022): the loss + alpha * dCor(embedding, one-hot
  labels) for every passive party's embedding. The active party computes it: it alone holds the labels, and
  it receives each embedding as a tensor it differentiates through, so the penalty's gradient w.r.t. the
  embedding goes back inside the gradient it sends. The passive party trains on that gradient as before.
- GradPerturb (Yang et al., "Differentially Private Label Protection in Split Learning", 2022, as VFLAIR
  implements it): the gradient sent for sample i is g_i + sum_c u_ic g_c,i, where g_c,i is the gradient
  of the loss with every label set to c and u_ic ~ Laplace(0, 2 / perturb_epsilon); the active party's
  own update uses the true gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from vflnet.defenses.label_defenses import LabelDefense, laplace, soft_cross_entropy


class VariationalBottleneck(nn.Module):
    """VFLAIR's MID layer on one embedding h (dim d, bottleneck k = d * bottleneck_scale): encoder
    fc(d, 2k) - ReLU split into mu and s, std = softplus(s - 5); z = mu + std * eps while training (mu in
    evaluation and prediction, the deterministic bottleneck; VFLAIR samples in both); decoder fc(k, 5k) -
    ReLU - fc(5k, d) - ReLU. Returns the decoded embedding and the batch mean of KL(N(mu, std^2) || N(0, I))."""

    def __init__(self, dim: int, bottleneck_scale: int, generator: torch.Generator) -> None:
        super().__init__()
        self.size = dim * bottleneck_scale
        self.encoder = nn.Sequential(nn.Linear(dim, 2 * self.size), nn.ReLU())
        self.decoder = nn.Sequential(
            nn.Linear(self.size, 5 * self.size), nn.ReLU(), nn.Linear(5 * self.size, dim), nn.ReLU()
        )
        self.generator = generator

    def forward(self, h: Tensor) -> tuple[Tensor, Tensor]:
        mu, s = self.encoder(h).split(self.size, dim=1)
        std = F.softplus(s - 5.0)
        z = mu
        if self.training:
            z = mu + std * torch.randn(mu.shape, generator=self.generator, dtype=mu.dtype)
        kl = (-0.5 * (1.0 + 2.0 * std.log() - mu**2 - std**2)).sum(dim=1).mean()
        return self.decoder(z), kl


class MID(LabelDefense):
    """MID: one `VariationalBottleneck` per passive party, trained by the active party's optimizer (and
    checkpointed with its model); the loss gains mid_lambda * the sum of their KL terms."""

    def __init__(self, num_classes: int, mid_lambda: float, bottleneck_scale: int, seed: int) -> None:
        super().__init__(num_classes)
        if not mid_lambda >= 0:
            raise ValueError(f"lambda must be >= 0, got {mid_lambda}")
        if bottleneck_scale < 1:
            raise ValueError(f"bottleneck_scale must be >= 1, got {bottleneck_scale}")
        self.mid_lambda = mid_lambda
        self.bottleneck_scale = bottleneck_scale
        self.seed = seed
        self.generator = torch.Generator().manual_seed(seed)  # the layers' samples (a checkpoint keeps it)
        self.layers: nn.ModuleList | None = None

    def trainable(self, embedding_dims: list[int]) -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.layers = nn.ModuleList(
                VariationalBottleneck(d, self.bottleneck_scale, self.generator) for d in embedding_dims
            )
        return self.layers

    def embeddings(self, received: list[Tensor], labels: Tensor | None) -> tuple[list[Tensor], Tensor | None]:
        if self.layers is None:
            raise RuntimeError("MID's bottleneck layers are built by trainable() before the first step")
        decoded, kls = zip(*(layer(h) for layer, h in zip(self.layers, received, strict=True)), strict=True)
        return list(decoded), self.mid_lambda * torch.stack(kls).sum()


def _centred_distances(x: Tensor) -> Tensor:
    """The double-centred matrix of Euclidean distances between the rows of x (finite gradient at 0)."""
    sq = (x[:, None, :] - x[None, :, :]).pow(2).sum(dim=-1)
    d = torch.where(sq > 0, sq.clamp_min(1e-30).sqrt(), torch.zeros_like(sq))
    return d - d.mean(dim=0, keepdim=True) - d.mean(dim=1, keepdim=True) + d.mean()


def distance_correlation(x: Tensor, y: Tensor) -> Tensor:
    """The sample distance correlation of the paired rows of x and y (Szekely, Rizzo and Bakirov, "Measuring
    and testing dependence by correlation of distances", Ann. Statist. 2007): dCor^2 = dCov^2(x, y) /
    sqrt(dVar^2(x) dVar^2(y)) with double-centred distance matrices; 0 when either side is constant."""
    a, b = _centred_distances(x), _centred_distances(y)
    variance = ((a * a).mean() * (b * b).mean()).sqrt()
    if float(variance.detach()) == 0.0:
        return x.new_zeros(())
    return ((a * b).mean() / variance).clamp_min(1e-12).sqrt()


class DistanceCorrelation(LabelDefense):
    """dCor: the training loss gains alpha * dCor(h, one-hot labels) for each received embedding h."""

    def __init__(self, num_classes: int, alpha: float) -> None:
        super().__init__(num_classes)
        if not alpha >= 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        self.alpha = alpha

    def embeddings(self, received: list[Tensor], labels: Tensor | None) -> tuple[list[Tensor], Tensor | None]:
        if labels is None:
            return received, None
        onehot = self.train_targets(labels).to(received[0].dtype)
        return received, self.alpha * torch.stack([distance_correlation(h, onehot) for h in received]).sum()


class GradPerturb(LabelDefense):
    """GradPerturb: sum_c u_ic g_c,i is the gradient of soft_cross_entropy(logits, u), u ~ Laplace(0,
    2 / perturb_epsilon) per sample and class, so one backward pass gives it. Exact where sample i's
    embedding reaches only sample i's logits (every top model here except batch norm)."""

    def __init__(self, num_classes: int, perturb_epsilon: float, seed: int) -> None:
        super().__init__(num_classes)
        if not perturb_epsilon > 0:
            raise ValueError(f"perturb_epsilon must be > 0, got {perturb_epsilon}")
        self.scale = 2.0 / perturb_epsilon
        self.generator = torch.Generator().manual_seed(seed)

    def gradient_noise(self, logits: Tensor) -> Tensor:
        u = laplace(logits.shape, self.scale, self.generator, logits.dtype)
        return soft_cross_entropy(logits, u)
