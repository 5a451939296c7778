"""CAFE (Jin et al., NeurIPS 2021): large-batch data recovery by an honest-but-curious VFL server.

The attacker sees, per iteration, only the server's legitimate view (``ServerObservation``): the
batch sample IDs it scheduled, the parameters it broadcast and every party's uploaded batch-averaged
parameter gradients. It also knows the architecture (a ``CafeVFL`` template whose own weights are never
used), N, the input range [0, 1] and the number of classes. Ground truth never enters this module.

Step I   (eq. 7): V ~ dL/dU of fc1's outputs, from fc1's bias gradient, one SGD step per batch.
Step II  (eq. 8): H^ ~ fc1's inputs, from fc1's weight gradient and V, lazy Adam.
Step III (eq. 9): data x^ and dummy labels y^ by gradient matching + truncated TV + internal
                  representation term, lazy Adam (second-order autodiff).
Loops: Algorithm 4 (single loop: Steps I-III on every observation) or Algorithm 3 (nested: the first
``nested_iterations[0]`` observations run Step I, the next ``nested_iterations[1]`` Step II, the rest
Step III). All per-sample state is updated only on the rows of the current batch.

Every worker's state is one stacked tensor (``V``: M x N x d2, ``H``: M x N x d1, ``X``: M x N x C x H x W),
so each step handles all M workers in one batched operation. The attack runs on ``device`` (CPU or CUDA);
its inner loop never reads a value back to the host, so the host never waits there for the GPU.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, Protocol

import numpy as np
import torch
from torch import Tensor
from torch.func import functional_call

from vflnet.models.cafe_net import CafeVFL, Params, flat_name, soft_cross_entropy
from vflnet.models.device import resolve_device


@dataclass(frozen=True)
class ServerObservation:
    """What the CAFE server legitimately holds after one iteration."""

    iteration: int
    batch_ids: np.ndarray
    params: Params
    grads: Params


OBJECTIVES = ("cafe", "dlg", "cosine", "sapag")
ADAM_BIAS_CORRECTIONS = ("row", "global")

# What the authors' code (DeRafael/CAFE) does where the paper's text says otherwise or nothing:
# Adam bias-corrected by the global iteration count (utils.py, both optimisers), TV weighted per
# worker, the dummy labels' gradient 100 * d||g - g^||^2 = 1e4 * alpha * d||g - g^||^2, and Step I's
# learning rate 5e-3 (config.py; Table 9 says 1e-2).
AUTHORS_CODE: dict[str, Any] = {
    "adam_bias_correction": "global",
    "tv_per_worker": True,
    "label_grad_scale": 1e4,
    "lr_step1": 5e-3,
}


@dataclass(frozen=True)
class CafeParams:
    """Attack hyperparameters; defaults are Table 9's MNIST row (M = 4, K = 40) and the authors' inits."""

    n_samples: int = 800
    lr_step1: float = 1e-2
    lr_step2: float = 1e-2
    lr_step3: float = 1e-2
    alpha: float = 1e-2
    beta: float = 1e-4
    gamma: float = 1e-3
    xi: float = 25.0
    loop: Literal["single", "nested"] = "single"
    nested_iterations: tuple[int, int] = (8000, 8000)
    objective: str = "cafe"
    run_step3: bool = True
    v_init: float = 8e-4
    h_init: float = 8e-2
    adam_betas: tuple[float, float] = (0.9, 0.999)
    adam_eps: float = 1e-7
    # the authors' code (DeRafael/CAFE), each off by default (the paper's text):
    adam_bias_correction: Literal["row", "global"] = "row"  # "global": by the attack's iteration count
    tv_per_worker: bool = False  # beta * TV of each worker's own images (not their mean over workers)
    label_grad_scale: float = 1.0  # the dummy labels' gradient times this (the authors': 1e4)
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_samples < 2:
            raise ValueError(f"n_samples must be >= 2, got {self.n_samples}")
        for name in ("lr_step1", "lr_step2", "lr_step3", "v_init", "h_init", "adam_eps", "label_grad_scale"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, got {value}")
        for name in ("alpha", "beta", "gamma", "xi"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a non-negative finite number, got {value}")
        if self.loop not in ("single", "nested"):
            raise ValueError(f"loop must be 'single' or 'nested', got {self.loop!r}")
        if len(self.nested_iterations) != 2 or min(self.nested_iterations) < 0:
            raise ValueError(f"nested_iterations must be two non-negative ints, got {self.nested_iterations}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if len(self.adam_betas) != 2 or not all(0.0 <= b < 1.0 for b in self.adam_betas):
            raise ValueError(f"adam_betas must be two numbers in [0, 1), got {self.adam_betas}")
        if self.adam_bias_correction not in ADAM_BIAS_CORRECTIONS:
            raise ValueError(
                f"adam_bias_correction must be one of {ADAM_BIAS_CORRECTIONS}, got {self.adam_bias_correction!r}"
            )


TABLE9: dict[str, dict[str, float]] = {
    "cifar10": {"lr_step1": 5e-3, "lr_step2": 8e-3, "lr_step3": 2e-2, "xi": 90.0},
    "mnist": {"lr_step1": 1e-2, "lr_step2": 1e-2, "lr_step3": 1e-2, "xi": 25.0},
    "linnaeus5": {"lr_step1": 5e-3, "lr_step2": 5e-3, "lr_step3": 1e-2, "xi": 110.0},
    "yale32": {"lr_step1": 1e-2, "lr_step2": 1e-2, "lr_step3": 1e-2, "xi": 32.0},
}


def table9_params(dataset: str, **overrides: Any) -> CafeParams:
    """Table 9's row for ``dataset`` (alpha, beta, gamma = 1e-2, 1e-4, 1e-3 in every row), then overrides."""
    if dataset not in TABLE9:
        raise ValueError(f"dataset must be one of {sorted(TABLE9)}, got {dataset!r}")
    return replace(CafeParams(**TABLE9[dataset]), **overrides)


def total_variation(images: Tensor) -> Tensor:
    """Batch mean of the anisotropic TV (sum of |vertical| + |horizontal| neighbour differences) per image."""
    dv = (images[:, :, 1:, :] - images[:, :, :-1, :]).abs().flatten(1).sum(1)
    dh = (images[:, :, :, 1:] - images[:, :, :, :-1]).abs().flatten(1).sum(1)
    return (dv + dh).mean()


class Step3Objective(Protocol):
    """A Step-III loss over one batch; ``needs_internal`` says whether Steps I-II must run for it."""

    needs_internal: bool

    def __call__(
        self,
        true_grads: Sequence[Tensor],
        fake_grads: Sequence[Tensor],
        images: Sequence[Tensor],
        internal_fake: Sequence[Tensor],
        internal_target: Sequence[Tensor],
    ) -> Tensor: ...


def _sq_distance(true_grads: Sequence[Tensor], fake_grads: Sequence[Tensor]) -> Tensor:
    return torch.stack([((g - f) ** 2).sum() for g, f in zip(true_grads, fake_grads, strict=True)]).sum()


@dataclass(frozen=True)
class CafeObjective:
    """Eq. (9): alpha*||g - g^||^2 + beta*TV_xi(X^) + gamma*sum_n ||H^_n - h~_n||^2.

    TV is averaged over the batch and over the workers; the TV term is dropped while that average is
    below xi (the authors' choice). ``tv_per_worker``: the term is beta times the sum of the workers'
    TVs, so each worker's images get beta * d TV_m (the authors' code) rather than beta / M * d TV_m.
    """

    alpha: float
    beta: float
    gamma: float
    xi: float
    tv_per_worker: bool = False
    needs_internal: ClassVar[bool] = True

    def __call__(
        self,
        true_grads: Sequence[Tensor],
        fake_grads: Sequence[Tensor],
        images: Sequence[Tensor],
        internal_fake: Sequence[Tensor],
        internal_target: Sequence[Tensor],
    ) -> Tensor:
        loss = self.alpha * _sq_distance(true_grads, fake_grads)
        tvs = torch.stack([total_variation(x) for x in images])
        tv = tvs.mean()
        weighted = tvs.sum() if self.tv_per_worker else tv
        # the truncation as a select rather than a Python ``if``: no host read-back (GPU sync) per step
        loss = torch.where(tv > self.xi, loss + self.beta * weighted, loss)
        return loss + self.gamma * _sq_distance(internal_target, internal_fake)


@dataclass(frozen=True)
class DlgObjective:
    """DLG (Zhu et al.): the squared l2 gradient distance only."""

    needs_internal: ClassVar[bool] = False

    def __call__(
        self,
        true_grads: Sequence[Tensor],
        fake_grads: Sequence[Tensor],
        images: Sequence[Tensor],
        internal_fake: Sequence[Tensor],
        internal_target: Sequence[Tensor],
    ) -> Tensor:
        return _sq_distance(true_grads, fake_grads)


@dataclass(frozen=True)
class CosineObjective:
    """Inverting Gradients (Geiping et al.): 1 - cos(g, g^) over all parameters + tv_weight * TV."""

    tv_weight: float
    needs_internal: ClassVar[bool] = False

    def __call__(
        self,
        true_grads: Sequence[Tensor],
        fake_grads: Sequence[Tensor],
        images: Sequence[Tensor],
        internal_fake: Sequence[Tensor],
        internal_target: Sequence[Tensor],
    ) -> Tensor:
        dot = torch.stack([(g * f).sum() for g, f in zip(true_grads, fake_grads, strict=True)]).sum()
        gn = torch.stack([(g**2).sum() for g in true_grads]).sum().sqrt()
        fn = torch.stack([(f**2).sum() for f in fake_grads]).sum().sqrt()
        tv = torch.stack([total_variation(x) for x in images]).mean()
        return 1 - dot / (gn * fn + 1e-12) + self.tv_weight * tv


@dataclass(frozen=True)
class SapagObjective:
    """SAPAG (Wang et al.): sum over tensors of 1 - exp(-||g - g^||^2 / sigma^2), sigma = std of g.

    The kernel width follows the hint in the CAFE authors' code (the paper does not give it).
    """

    needs_internal: ClassVar[bool] = False

    def __call__(
        self,
        true_grads: Sequence[Tensor],
        fake_grads: Sequence[Tensor],
        images: Sequence[Tensor],
        internal_fake: Sequence[Tensor],
        internal_target: Sequence[Tensor],
    ) -> Tensor:
        terms = []
        for g, f in zip(true_grads, fake_grads, strict=True):
            sigma2 = g.var() if g.numel() > 1 else g.pow(2).sum()
            terms.append(1 - torch.exp(-((g - f) ** 2).sum() / (sigma2 + 1e-12)))
        return torch.stack(terms).sum()


def objective_from_params(params: CafeParams) -> Step3Objective:
    """The Step-III objective named by ``params.objective``."""
    if params.objective == "cafe":
        return CafeObjective(params.alpha, params.beta, params.gamma, params.xi, params.tv_per_worker)
    if params.objective == "dlg":
        return DlgObjective()
    if params.objective == "cosine":
        return CosineObjective(params.beta)
    return SapagObjective()


class RowAdam:
    """Adam with per-row moments: a row's state moves only when it is in a batch.

    ``shape`` is ``(M, N, ...)``: M stacked per-worker tensors of N rows each, updated together on the
    same rows (dimension 1), so the M workers' rows share one step count. Bias correction by each row's
    own step count (the paper's lazy Adam), or with ``step(..., t=T)`` by a global count T as the
    authors' code does: lr * sqrt(1 - b2^T) / (1 - b1^T) * m^ / (sqrt(v^) + eps) with m^ and v^ also
    corrected by T (their optimisers correct twice)."""

    def __init__(
        self,
        shape: Sequence[int],
        lr: float,
        betas: tuple[float, float],
        eps: float,
        device: torch.device | str = "cpu",
    ) -> None:
        self.lr, self.betas, self.eps = lr, betas, eps
        self.m = torch.zeros(*shape, device=device)
        self.v = torch.zeros(*shape, device=device)
        self.t = torch.zeros(shape[1], dtype=torch.int64, device=device)

    def step(self, param: Tensor, rows: Tensor, grad: Tensor, t: int | None = None) -> None:
        b1, b2 = self.betas
        self.t[rows] += 1
        m = self.m[:, rows] * b1 + (1 - b1) * grad
        v = self.v[:, rows] * b2 + (1 - b2) * grad * grad
        self.m[:, rows], self.v[:, rows] = m, v
        if t is None:
            count = self.t[rows].to(param.dtype).view(1, -1, *([1] * (param.dim() - 2)))
            step = self.lr * (m / (1 - b1**count)) / ((v / (1 - b2**count)).sqrt() + self.eps)
        else:
            lr = self.lr * math.sqrt(1 - b2**t) / (1 - b1**t)
            step = lr * (m / (1 - b1**t)) / ((v / (1 - b2**t)).sqrt() + self.eps)
        param[:, rows] = param[:, rows] - step

    def state_dict(self) -> dict[str, Tensor]:
        return {"m": self.m, "v": self.v, "t": self.t}

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        self.m, self.v, self.t = (state[k].to(self.m.device) for k in ("m", "v", "t"))


@dataclass
class CafeResult:
    """The attacker's output: Step III's per-worker image regions (clipped to [0, 1]), Step II's internal
    representations (for an FC-only model these are the raw regions, flattened) and dummy-label beliefs."""

    regions: list[Tensor]
    internal: list[Tensor]
    label_probs: Tensor
    seen: np.ndarray
    iterations: int
    last_losses: dict[str, float] = field(default_factory=dict)

    @property
    def labels(self) -> Tensor:
        return self.label_probs.argmax(dim=1)


class CafeAttack:
    """The CAFE attacker at the server: ``observe`` per iteration then ``result``, or ``run`` offline."""

    def __init__(
        self,
        params: CafeParams,
        template: CafeVFL,
        objective: Step3Objective | None = None,
        device: str | torch.device = "cpu",
    ) -> None:
        self.params = params
        self.device = resolve_device(device)
        self.template = template.to(self.device)
        self.objective = objective if objective is not None else objective_from_params(params)
        cfg = template.config
        self.workers = template.worker_names
        n = params.n_samples
        # drawn on the CPU in a fixed order, so a seed gives the same start on every device
        gen = torch.Generator().manual_seed(params.seed)
        d1, d2 = cfg.feature_dim(), cfg.fc1_out
        v = torch.stack([(torch.rand(n, d2, generator=gen) * 2 - 1) * params.v_init for _ in self.workers])
        h = torch.stack([torch.rand(n, d1, generator=gen) * params.h_init for _ in self.workers])
        x = torch.stack([torch.rand(n, *cfg.region_shape, generator=gen) for _ in self.workers])
        y = torch.rand(n, cfg.n_classes, generator=gen)
        self.V, self.H, self.X, self.Y = (t.to(self.device) for t in (v, h, x, y))
        betas, eps = params.adam_betas, params.adam_eps
        self._opt_h = RowAdam(self.H.shape, params.lr_step2, betas, eps, self.device)
        self._opt_x = RowAdam(self.X.shape, params.lr_step3, betas, eps, self.device)
        self._opt_y = RowAdam((1, *self.Y.shape), params.lr_step3, betas, eps, self.device)
        self._seen = np.zeros(n, dtype=bool)
        self._count = 0
        self._last: dict[str, Tensor] = {}  # kept on the device; read back only in ``result``

    def _phase_steps(self) -> tuple[bool, bool, bool]:
        """Which of Steps I, II, III run on the current observation."""
        needs = self.objective.needs_internal
        step3 = self.params.run_step3
        if self.params.loop == "single":
            return needs, needs, step3
        t1, t2 = self.params.nested_iterations if needs else (0, 0)
        c = self._count
        return c < t1, t1 <= c < t1 + t2, step3 and c >= t1 + t2

    def observe(self, obs: ServerObservation) -> None:
        """Consume one iteration of the server's view."""
        ids = np.asarray(obs.batch_ids, dtype=np.int64)
        n = self.params.n_samples
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("batch_ids must be a non-empty 1-D array")
        if int(ids.min()) < 0 or int(ids.max()) >= n or np.unique(ids).size != ids.size:
            raise ValueError(f"batch_ids must be distinct sample indices in [0, {n})")
        rows = torch.as_tensor(ids)
        if self.device.type == "cuda":  # from pinned memory, so the copy does not make the host wait
            rows = rows.pin_memory().to(self.device, non_blocking=True)
        obs = replace(obs, params=self._to_device(obs.params), grads=self._to_device(obs.grads))
        step1, step2, step3 = self._phase_steps()
        if step1:
            self._step1(obs, rows)
        if step2:
            self._step2(obs, rows)
        if step3:
            self._step3(obs, rows)
        self._seen[ids] = True
        self._count += 1

    def _to_device(self, tensors: Params) -> dict[str, dict[str, Tensor]]:
        """The observation's (float32) tensors on the attack's device. On a GPU: packed into one pinned
        buffer and copied once without making the host wait; one pageable copy per tensor (~84 at the
        paper setting) would each wait for the GPU to finish the previous iteration."""
        if self.device.type == "cpu":
            return {p: dict(named) for p, named in tensors.items()}
        flat = [t for named in tensors.values() for t in named.values()]
        host = torch.empty(sum(t.numel() for t in flat), pin_memory=True)
        torch.cat([t.reshape(-1) for t in flat], out=host)
        pieces = iter(host.to(self.device, non_blocking=True).split([t.numel() for t in flat]))
        return {p: {n: next(pieces).view(t.shape) for n, t in named.items()} for p, named in tensors.items()}

    def _stacked(self, tensors: Params, name: str) -> Tensor:
        """Every worker's ``name`` tensor, stacked in worker order."""
        return torch.stack([tensors[w][name] for w in self.workers])

    @property
    def iterations(self) -> int:
        """Observations consumed so far."""
        return self._count

    def state_dict(self) -> dict[str, Any]:
        """Everything the attack has learnt so far, on the CPU: a resumed attack continues from it
        exactly (the attack draws no random numbers after its start)."""
        tensors = {"V": self.V, "H": self.H, "X": self.X, "Y": self.Y}
        optimisers = {"h": self._opt_h, "x": self._opt_x, "y": self._opt_y}
        return {
            "tensors": {k: t.cpu() for k, t in tensors.items()},
            "adam": {k: {n: t.cpu() for n, t in o.state_dict().items()} for k, o in optimisers.items()},
            "seen": self._seen.copy(),
            "count": self._count,
            "last": {k: t.cpu() for k, t in self._last.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state_dict()``, on this attack's device."""
        self.V, self.H, self.X, self.Y = (state["tensors"][k].to(self.device) for k in ("V", "H", "X", "Y"))
        for key, opt in (("h", self._opt_h), ("x", self._opt_x), ("y", self._opt_y)):
            opt.load_state_dict(state["adam"][key])
        self._seen = state["seen"].copy()
        self._count = int(state["count"])
        self._last = {k: t.to(self.device) for k, t in state["last"].items()}

    def run(self, observations: Iterable[ServerObservation]) -> CafeResult:
        """Offline form: replay a recorded sequence of observations."""
        for obs in observations:
            self.observe(obs)
        return self.result()

    def result(self) -> CafeResult:
        """The recovery so far, on the CPU (the one place the attack reads its state back)."""
        return CafeResult(
            regions=[x.clamp(0, 1).cpu() for x in self.X],
            internal=[h.to("cpu", copy=True) for h in self.H],
            label_probs=torch.softmax(self.Y, dim=1).cpu(),
            seen=self._seen.copy(),
            iterations=self._count,
            last_losses={name: float(value) for name, value in self._last.items()},
        )

    def _adam_t(self) -> int | None:
        """The step count the Adam updates are bias-corrected by: None (each row's own) or global."""
        return self._count + 1 if self.params.adam_bias_correction == "global" else None

    def _step1(self, obs: ServerObservation, rows: Tensor) -> None:
        target = self._stacked(obs.grads, "fc1.bias")  # M x d2
        err = self.V[:, rows].sum(1) - target
        self.V[:, rows] -= self.params.lr_step1 * 2 * err.unsqueeze(1)
        self._last["F1"] = (err**2).sum()
        # progress without ground truth: how far the batch sums of V are from what was uploaded
        self._last["step1_residual"] = err.norm() / target.norm().clamp_min(1e-30)

    def _step2(self, obs: ServerObservation, rows: Tensor) -> None:
        v = self.V[:, rows]  # M x K x d2
        # torch stores Theta_1^T: d2 x d1 per worker
        resid = v.transpose(1, 2) @ self.H[:, rows] - self._stacked(obs.grads, "fc1.weight")
        self._opt_h.step(self.H, rows, 2 * v @ resid, self._adam_t())
        self._last["F2"] = (resid**2).sum()

    def _step3(self, obs: ServerObservation, rows: Tensor) -> None:
        names = [
            (party, n)
            for party, mod in self.template.party_modules().items()
            for n, _ in mod.named_parameters()
        ]
        # detach() gives fresh leaves that share storage: nothing writes to them, so no copy is needed
        params = {flat_name(p, n): obs.params[p][n].detach().requires_grad_(True) for p, n in names}
        true_grads = [obs.grads[p][n] for p, n in names]
        x_batch = self.X[:, rows].requires_grad_(True)  # advanced indexing already copies the rows
        ys = self.Y[rows].requires_grad_(True)
        xs = list(x_batch.unbind(0))
        logits, internal = functional_call(self.template, params, (xs,), {"return_internal": True})
        fake_loss = soft_cross_entropy(logits, torch.softmax(ys, dim=1))
        fake_grads = torch.autograd.grad(fake_loss, list(params.values()), create_graph=True)
        targets = list(self.H[:, rows].unbind(0))
        loss = self.objective(true_grads, fake_grads, xs, internal, targets)
        grad_x, grad_y = torch.autograd.grad(loss, [x_batch, ys], allow_unused=True)
        with torch.no_grad():
            t = self._adam_t()
            if grad_x is not None:
                self._opt_x.step(self.X, rows, grad_x, t)
            if grad_y is not None:
                scaled = grad_y * self.params.label_grad_scale  # exact at the default 1.0
                self._opt_y.step(self.Y.unsqueeze(0), rows, scaled.unsqueeze(0), t)
        self._last["F3"] = loss.detach()
