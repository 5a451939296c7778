"""Label defenses of the active party (paper 004, Zou et al., Sec. 6 and the baselines of Sec. 7.3.1).

Every defense has the same three hooks, each used at one point of the active party's step:

- `train_targets(labels)` -> (B, C) soft targets the active party trains towards (one-hot unless CAE);
- `transform(grad, labels)` -> the per-sample gradient dL/dH (B, C) it actually sends (before encryption);
- `predict(logits)` -> class predictions from the aggregated logits H (argmax unless CAE's decoder).

The defenses of `vflnet/defenses/training_defenses.py` (MID, dCor, GradPerturb) change the plaintext
`split` step itself, through three more hooks the split active party calls (identity here):

- `trainable(embedding_dims)` -> modules the defense adds to the active party's model (MID's bottleneck);
- `embeddings(received, labels)` -> what the top model takes in place of the received embeddings, and a
  term added to the training loss (MID's KL term, dCor's penalty);
- `gradient_noise(logits)` -> a loss whose gradient w.r.t. the received embeddings is added to what is
  sent, and not to the active party's own update (GradPerturb).

Parameters are checked when a defense is built; a bad one raises ValueError naming it. Randomised defenses
own a seeded generator so a run is reproducible.

Each class is the `implementation` of one defense registered by name in `vflnet.registry.DEFENSES`
(`vflnet/defenses/registered.py`); `LabelDefense` itself is no defense. They have no names of their own.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

import torch
from torch import Tensor, nn


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Batch-mean cross entropy of softmax(logits) against soft targets (the loss of Algorithm 5, line 3)."""
    return -(targets * torch.log_softmax(logits, dim=1)).sum(dim=1).mean()


def laplace(shape: torch.Size, scale: float, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    """Laplace(0, scale) noise of the given shape, by inverting the CDF of a uniform draw."""
    u = torch.rand(shape, generator=generator, dtype=dtype) - 0.5
    return -scale * torch.sign(u) * torch.log1p(-2.0 * u.abs())


def _check_gradient(grad: Tensor, labels: Tensor) -> None:
    if grad.dim() != 2:
        raise ValueError(f"grad must be (batch, classes), got shape {tuple(grad.shape)}")
    if labels.shape != (grad.shape[0],):
        raise ValueError(f"labels must have shape ({grad.shape[0]},), got {tuple(labels.shape)}")


class LabelDefense:
    """No defense, and the base the others override: one-hot targets, gradients unchanged, argmax."""

    def __init__(self, num_classes: int) -> None:
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        self.num_classes = num_classes

    def train_targets(self, labels: Tensor) -> Tensor:
        return nn.functional.one_hot(labels.long(), self.num_classes).to(torch.get_default_dtype())

    def transform(self, grad: Tensor, labels: Tensor) -> Tensor:
        _check_gradient(grad, labels)
        return grad

    def predict(self, logits: Tensor) -> Tensor:
        return logits.argmax(dim=1)

    def trainable(self, embedding_dims: list[int]) -> nn.Module | None:
        """Modules the active party trains with its own (one embedding dim per passive party, in order)."""
        return None

    def embeddings(self, received: list[Tensor], labels: Tensor | None) -> tuple[list[Tensor], Tensor | None]:
        """The embeddings the top model takes, and a term added to the loss (None: none; labels None: no
        loss, a prediction step)."""
        return received, None

    def gradient_noise(self, logits: Tensor) -> Tensor | None:
        """A loss whose gradient w.r.t. the received embeddings is added to the gradients sent."""
        return None


class _NoiseDefense(LabelDefense, ABC):
    """Shared part of DP-G / DP-L: clip each row's 2-norm to `clip_norm`, then add seeded noise."""

    def __init__(self, num_classes: int, scale: float, clip_norm: float = 0.2, seed: int = 0) -> None:
        super().__init__(num_classes)
        if not scale >= 0:
            raise ValueError(f"scale must be >= 0, got {scale}")
        if not clip_norm > 0:
            raise ValueError(f"clip_norm must be > 0, got {clip_norm}")
        self.scale = scale
        self.clip_norm = clip_norm
        self.generator = torch.Generator().manual_seed(seed)

    @abstractmethod
    def _noise(self, shape: torch.Size, dtype: torch.dtype) -> Tensor:
        """Noise of the given shape drawn from `self.generator`."""

    def transform(self, grad: Tensor, labels: Tensor) -> Tensor:
        _check_gradient(grad, labels)
        norms = grad.norm(dim=1, keepdim=True).clamp_min(1e-12)
        clipped = grad * (self.clip_norm / norms).clamp(max=1.0)
        return clipped + self._noise(grad.shape, grad.dtype)


class GaussianNoise(_NoiseDefense):
    """DP-G: per-sample 2-norm clipping (paper: 0.2) then N(0, scale^2) noise (paper: scale 0.001-0.1)."""

    def _noise(self, shape: torch.Size, dtype: torch.dtype) -> Tensor:
        return torch.randn(shape, generator=self.generator, dtype=dtype) * self.scale


class LaplaceNoise(_NoiseDefense):
    """DP-L ("noisy gradients" of Fu et al.): per-sample clipping then Laplace(0, scale) noise."""

    def _noise(self, shape: torch.Size, dtype: torch.dtype) -> Tensor:
        return laplace(shape, self.scale, self.generator, dtype)


class GradientSparsification(LabelDefense):
    """GS (Aji & Heafield): zero all but the largest-magnitude (100 - drop_rate)% entries of the batch's
    gradient tensor (paper sweeps drop_rate 99.0-99.9). At least one entry is kept. No error feedback."""

    def __init__(self, num_classes: int, drop_rate: float) -> None:
        super().__init__(num_classes)
        if not 0.0 <= drop_rate < 100.0:
            raise ValueError(f"drop_rate must be a percentage in [0, 100), got {drop_rate}")
        self.drop_rate = drop_rate

    def transform(self, grad: Tensor, labels: Tensor) -> Tensor:
        _check_gradient(grad, labels)
        flat = grad.reshape(-1)
        keep = max(1, math.ceil(flat.numel() * (100.0 - self.drop_rate) / 100.0))
        mask = torch.zeros_like(flat, dtype=torch.bool)
        mask[flat.abs().topk(keep).indices] = True
        return torch.where(mask, flat, torch.zeros_like(flat)).reshape(grad.shape)


class DiscreteSGD(LabelDefense):
    """DG (eq. 16-17): round each entry to the nearest of bins + 1 equally spaced endpoints spanning
    [mu - 2 sigma, mu + 2 sigma] of the gradient tensor; values outside clamp to the end points."""

    def __init__(self, num_classes: int, bins: int = 12) -> None:
        super().__init__(num_classes)
        if bins < 1:
            raise ValueError(f"bins must be >= 1, got {bins}")
        self.bins = bins

    def transform(self, grad: Tensor, labels: Tensor) -> Tensor:
        _check_gradient(grad, labels)
        mu, sigma = grad.mean(), grad.std(unbiased=False)
        if sigma == 0:
            return grad.clone()
        low, width = mu - 2 * sigma, 4 * sigma / self.bins
        # Nearest endpoint: ties at a midpoint go to the lower endpoint, as the half-open intervals of eq. 17.
        index = torch.ceil((grad - low) / width - 0.5).clamp(0, self.bins)
        return low + index * width


class GradientRounding(LabelDefense):
    """Rounding baseline: send each entry rounded to `decimals` decimal places."""

    def __init__(self, num_classes: int, decimals: int) -> None:
        super().__init__(num_classes)
        if decimals < 0:
            raise ValueError(f"decimals must be >= 0, got {decimals}")
        self.decimals = decimals

    def transform(self, grad: Tensor, labels: Tensor) -> Tensor:
        _check_gradient(grad, labels)
        return torch.round(grad, decimals=self.decimals)


class Marvell(LabelDefense):
    """MARVELL (Li et al.) for binary tasks: class-conditional Gaussian noise on per-sample gradients whose
    covariances minimise the symmetric KL divergence between the noisy positive and negative gradient
    distributions under the power budget p tr(S1) + (1 - p) tr(S0) <= P, P = power_ratio * ||mu1 - mu0||^2.

    Simplifications (documented for reports): each class's gradients are modelled as N(mu_y, v_y I) with v_y
    the batch's mean per-coordinate variance of class y; the noise covariance is restricted to the optimal
    family of Li et al., S_y = a_y I + b_y u u^T with u the unit mean difference; the four scalars are found
    by a few hundred Adam steps with the budget spent in full. A batch holding one class gets isotropic noise
    of power power_ratio * mean ||g||^2 (there is no mean difference to hide).
    """

    def __init__(self, power_ratio: float, solver_steps: int = 300, seed: int = 0) -> None:
        super().__init__(2)
        if not power_ratio > 0:
            raise ValueError(f"power_ratio must be > 0, got {power_ratio}")
        if solver_steps < 1:
            raise ValueError(f"solver_steps must be >= 1, got {solver_steps}")
        self.power_ratio = power_ratio
        self.solver_steps = solver_steps
        self.generator = torch.Generator().manual_seed(seed)

    def transform(self, grad: Tensor, labels: Tensor) -> Tensor:
        _check_gradient(grad, labels)
        if bool(((labels != 0) & (labels != 1)).any()):
            raise ValueError("MARVELL is defined for binary labels in {0, 1}")
        g = grad.to(torch.float64)
        dim = g.shape[1]
        positive = labels == 1
        if bool(positive.all()) or not bool(positive.any()):
            power = self.power_ratio * float((g**2).sum(dim=1).mean())
            noise = torch.randn(g.shape, generator=self.generator, dtype=torch.float64) * math.sqrt(
                power / dim
            )
            return (g + noise).to(grad.dtype)
        diff = g[positive].mean(0) - g[~positive].mean(0)
        gap = float(diff.norm())
        if gap == 0.0:
            return grad.clone()
        direction = diff / gap
        var1 = float(g[positive].var(0, unbiased=False).mean())
        var0 = float(g[~positive].var(0, unbiased=False).mean())
        p = float(positive.double().mean())
        a1, b1, a0, b0 = self._solve(dim, gap, var1, var0, p, self.power_ratio * gap**2)
        iso = torch.randn(g.shape, generator=self.generator, dtype=torch.float64)
        along = torch.randn(g.shape[0], 1, generator=self.generator, dtype=torch.float64) * direction
        a = torch.where(positive, a1, a0).unsqueeze(1)
        b = torch.where(positive, b1, b0).unsqueeze(1)
        return (g + iso * a.sqrt() + along * b.sqrt()).to(grad.dtype)

    def _solve(
        self, dim: int, gap: float, var1: float, var0: float, p: float, power: float
    ) -> tuple[float, ...]:
        """Minimise sym-KL over the budget split w (softmax over 4 shares) of the noise power."""
        logits = torch.zeros(4, dtype=torch.float64, requires_grad=True)
        optimiser = torch.optim.Adam([logits], lr=0.1)
        floor = 1e-12 * (gap**2 + 1.0)

        def shares() -> tuple[Tensor, Tensor, Tensor, Tensor]:
            w = torch.softmax(logits, 0) * power
            return w[0] / (p * dim), w[1] / p, w[2] / ((1 - p) * dim), w[3] / (1 - p)

        for _ in range(self.solver_steps):
            optimiser.zero_grad()
            a1, b1, a0, b0 = shares()
            iso1, iso0 = var1 + a1 + floor, var0 + a0 + floor
            par1, par0 = iso1 + b1, iso0 + b0
            # Sym-KL of N(mu1, iso1 I + b1 uu^T) and N(mu0, iso0 I + b0 uu^T); the log-dets cancel.
            kl = 0.5 * ((dim - 1) * (iso1 / iso0 + iso0 / iso1) + par1 / par0 + par0 / par1 - 2 * dim)
            kl = kl + 0.5 * gap**2 * (1 / par1 + 1 / par0)
            kl.backward()
            optimiser.step()
        with torch.no_grad():
            return tuple(float(x) for x in shares())


class ConfusionalAutoEncoder(nn.Module):
    """CAE (paper 004 eq. 14-15, Algorithm 4): encoder one-hot label -> soft fake label, decoder back.

    Both are fc((6C+2)^2) - relu - fc(C) - softmax. Loss L = CE(y, y_hat) - lambda_1 CE(y, y_tilde)
    - lambda_2 Entropy(y_tilde). The paper gives no lambda_1; the default 0.1 is the ratio of the
    reference code's weights (10 on reconstruction, 1 on the contrastive term).

    Known limit (measured on digits): the contrastive term drives the true class's fake mass to the floor, so
    with lambda_2 > 0 the true class is the one entry of dL/dH that stays positive early in training; an
    attacker who knows CAE is deployed and takes argmax instead of Lemma 1's argmin recovers most labels.
    """

    def __init__(
        self,
        num_classes: int,
        lambda_2: float,
        lambda_1: float = 0.1,
        hidden: int | None = None,
        contrast_floor: float = 1e-3,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {num_classes}")
        if not lambda_1 >= 0:
            raise ValueError(f"lambda_1 must be >= 0, got {lambda_1}")
        if not lambda_2 >= 0:
            raise ValueError(f"lambda_2 must be >= 0, got {lambda_2}")
        if not 0 < contrast_floor < 1:
            raise ValueError(f"contrast_floor must be in (0, 1), got {contrast_floor}")
        width = (6 * num_classes + 2) ** 2 if hidden is None else hidden
        if width < 1:
            raise ValueError(f"hidden must be >= 1, got {hidden}")
        self.num_classes = num_classes
        self.lambda_1 = lambda_1
        self.lambda_2 = lambda_2
        self.contrast_floor = contrast_floor
        self.seed = seed
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.encoder = nn.Sequential(
                nn.Linear(num_classes, width), nn.ReLU(), nn.Linear(width, num_classes)
            )
            self.decoder = nn.Sequential(
                nn.Linear(num_classes, width), nn.ReLU(), nn.Linear(width, num_classes)
            )

    def loss(self, onehot: Tensor) -> Tensor:
        """Eq. 15 on a batch of one-hot labels."""
        fake_logits = self.encoder(onehot)
        fake = torch.softmax(fake_logits, dim=1)
        log_fake = torch.log_softmax(fake_logits, dim=1)
        log_restored = torch.log_softmax(self.decoder(fake), dim=1)
        reconstruction = -(onehot * log_restored).sum(1).mean()
        # Eq. 15's -lambda_1 CE(y, y_tilde) is unbounded below (y_tilde_y -> 0); flooring y_tilde_y at
        # `contrast_floor` stops that term from swamping reconstruction and entropy once the label is hidden.
        contrast = -(onehot * log_fake.clamp_min(math.log(self.contrast_floor))).sum(1).mean()
        entropy = -(fake * log_fake).sum(1).mean()
        return reconstruction - self.lambda_1 * contrast - self.lambda_2 * entropy

    def fit(self, steps: int = 1000, batch_size: int = 128, lr: float = 1e-3) -> list[float]:
        """Algorithm 4: each step draws random one-hot labels and takes one Adam step on eq. 15. No data needed.
        Returns the loss per step."""
        if steps < 1:
            raise ValueError(f"steps must be >= 1, got {steps}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        generator = torch.Generator().manual_seed(self.seed)
        optimiser = torch.optim.Adam(self.parameters(), lr=lr)
        history = []
        self.train()
        for _ in range(steps):
            labels = torch.randint(self.num_classes, (batch_size,), generator=generator)
            onehot = nn.functional.one_hot(labels, self.num_classes).to(torch.get_default_dtype())
            optimiser.zero_grad()
            loss = self.loss(onehot)
            loss.backward()
            optimiser.step()
            history.append(float(loss.detach()))
        self.eval()
        return history

    @torch.no_grad()
    def encode(self, labels: Tensor) -> Tensor:
        """Soft fake labels y_tilde (B, C) for integer labels."""
        onehot = nn.functional.one_hot(labels.long(), self.num_classes).to(torch.get_default_dtype())
        return torch.softmax(self.encoder(onehot), dim=1)

    @torch.no_grad()
    def decode(self, probabilities: Tensor) -> Tensor:
        """Restored label distribution Dec(p) (B, C) for probability vectors p."""
        return torch.softmax(self.decoder(probabilities), dim=1)


class CAEDefense(LabelDefense):
    """Algorithm 5 without discretisation: train towards Enc(y), predict argmax Dec(softmax(H)).
    The autoencoder must be trained (`ConfusionalAutoEncoder.fit`) before use; it stays frozen."""

    def __init__(self, autoencoder: ConfusionalAutoEncoder) -> None:
        super().__init__(autoencoder.num_classes)
        self.autoencoder = autoencoder.eval()

    def train_targets(self, labels: Tensor) -> Tensor:
        return self.autoencoder.encode(labels)

    def predict(self, logits: Tensor) -> Tensor:
        return self.autoencoder.decode(torch.softmax(logits, dim=1)).argmax(dim=1)


class DCAEDefense(CAEDefense):
    """DCAE: CAE targets and decoder, plus DiscreteSGD on the sent gradients (paper: 12 bins fixed)."""

    def __init__(self, autoencoder: ConfusionalAutoEncoder, bins: int = 12) -> None:
        super().__init__(autoencoder)
        self.discrete = DiscreteSGD(autoencoder.num_classes, bins)

    def transform(self, grad: Tensor, labels: Tensor) -> Tensor:
        return self.discrete.transform(grad, labels)
