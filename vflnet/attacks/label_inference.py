"""Label-inference attacks run by a passive party (paper 004, Zou et al.; baselines from Li et al. and Fu et al.).

Every attack computes only from a *view*: a frozen record of what the passive attacker legitimately holds
at one training step. Two views exist, one per protocol:

- `SampleGradientView` (plaintext `split`): the per-sample gradients dL/dH the active party sent back.
- `BatchGradientView` (`split-he`): the attacker's own features, its own model as it was when the batch was
  computed, and its own decrypted, batch-averaged parameter gradient. Per-sample gradients are not in it.

Knowledge a threat model grants on top of a view (a known label, auxiliary labelled samples) is an explicit
argument. Ground-truth labels never enter an attack; `vflnet.metrics.labels` scores the output afterwards.

Each algorithm here is the `algorithm` of one attack registered by name in `vflnet.registry.ATTACKS`
(`direct_label.py`, `batch_label.py`, `split_label_scoring.py`); that name is the only one it has.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn
from torch.func import functional_call, jacrev


@dataclass(frozen=True)
class SampleGradientView:
    """What a passive party sees under plaintext split learning for one batch.

    `grad_logits[i]` is the gradient the active party sent for row i (w.r.t. the passive's output; in paper
    004's sum-of-logits model that is dL/dH_i, shape (B, C)).
    """

    sample_ids: Tensor
    grad_logits: Tensor

    def __post_init__(self) -> None:
        if self.grad_logits.dim() != 2:
            raise ValueError(f"grad_logits must be (batch, dim), got shape {tuple(self.grad_logits.shape)}")
        if self.sample_ids.numel() != self.grad_logits.shape[0]:
            raise ValueError("sample_ids and grad_logits disagree on the batch size")


@dataclass(frozen=True)
class BatchGradientView:
    """What a passive party sees under the HE protocol (paper 004 Algorithm 1) for one batch.

    `model` is the attacker's own bottom model as it was in the forward pass of this batch (a snapshot taken
    before the update); `param_grads` maps its parameter names (as in `model.named_parameters()`) to the
    decrypted batch-level gradient; `features` are its own rows of the batch, in batch order.
    """

    sample_ids: Tensor
    features: Tensor
    model: nn.Module
    param_grads: Mapping[str, Tensor]
    num_classes: int

    def __post_init__(self) -> None:
        if self.features.shape[0] != self.sample_ids.numel():
            raise ValueError("sample_ids and features disagree on the batch size")
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")
        names = {name for name, _ in self.model.named_parameters()}
        unknown = set(self.param_grads) - names
        if unknown:
            raise ValueError(f"param_grads has names the model does not have: {sorted(unknown)}")
        if not self.param_grads:
            raise ValueError("param_grads is empty")


@dataclass(frozen=True)
class LastLayerGradientView:
    """The slice of a `BatchGradientView` that Theorem 1 needs: last-layer inputs and gradients.

    `last_inputs` (B, M) are the attacker's own activations feeding its last linear layer (A in eq. 6);
    `weight_grad` (C, M) and `bias_grad` (C,) are that layer's batch-level gradients (Q in eq. 6).
    """

    last_inputs: Tensor
    weight_grad: Tensor
    bias_grad: Tensor | None = None

    def __post_init__(self) -> None:
        if self.last_inputs.dim() != 2 or self.weight_grad.dim() != 2:
            raise ValueError("last_inputs must be (B, M) and weight_grad (C, M)")
        if self.last_inputs.shape[1] != self.weight_grad.shape[1]:
            raise ValueError(
                f"last_inputs width {self.last_inputs.shape[1]} != weight_grad width {self.weight_grad.shape[1]}"
            )
        if self.bias_grad is not None and self.bias_grad.shape != (self.weight_grad.shape[0],):
            raise ValueError("bias_grad must have shape (C,)")


@dataclass(frozen=True)
class ModelCompletionView:
    """What passive model completion (Fu et al.) uses: the attacker's trained bottom model, a few auxiliary
    labelled samples of its own feature slice (the threat model's extra knowledge), and the rows to label."""

    model: nn.Module
    aux_features: Tensor
    aux_labels: Tensor
    target_features: Tensor
    num_classes: int

    def __post_init__(self) -> None:
        if self.aux_features.shape[0] != self.aux_labels.numel():
            raise ValueError("aux_features and aux_labels disagree on the number of samples")
        if self.aux_labels.numel() == 0:
            raise ValueError("model completion needs at least one auxiliary labelled sample")
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")


def last_layer_view(view: BatchGradientView, layer: str | None = None) -> LastLayerGradientView:
    """Extract Theorem 1's inputs from an HE-protocol view: the attacker reruns its own model on its own
    batch to get the inputs of its linear layer `layer` (a module name; default: the last nn.Linear the model
    registers, which is the output layer of a Sequential MLP) and reads that layer's gradients."""
    if layer is None:
        linears = [name for name, m in view.model.named_modules() if isinstance(m, nn.Linear)]
        if not linears:
            raise ValueError("layer: the attacker's model has no nn.Linear")
        layer = linears[-1]
    module = dict(view.model.named_modules()).get(layer)
    if not isinstance(module, nn.Linear):
        raise ValueError(f"layer {layer!r} is not an nn.Linear of the attacker's model")
    weight_name = f"{layer}.weight" if layer else "weight"
    bias_name = f"{layer}.bias" if layer else "bias"
    if weight_name not in view.param_grads:
        raise ValueError(f"param_grads has no gradient for {weight_name!r}")
    captured: list[Tensor] = []
    handle = module.register_forward_hook(lambda _m, inputs, _out: captured.append(inputs[0].detach()))
    try:
        with torch.no_grad():
            view.model(view.features)
    finally:
        handle.remove()
    bias_grad = view.param_grads.get(bias_name) if module.bias is not None else None
    return LastLayerGradientView(captured[0], view.param_grads[weight_name], bias_grad)


class LabelInferenceAttack:
    """Family base: `infer(view, ...)` returns one inferred label per batch row (a LongTensor)."""

    view_type: ClassVar[type]

    def _check_view(self, view: object) -> None:
        if not isinstance(view, self.view_type):
            raise TypeError(
                f"{type(self).__name__} needs a {self.view_type.__name__}, got {type(view).__name__}"
            )


class DirectLabelInference(LabelInferenceAttack):
    """Lemma 1: under softmax + cross entropy, dL/dH_i is negative only at the true class, so the label is the
    index of the smallest entry. Needs per-sample gradients (plaintext split)."""

    view_type = SampleGradientView

    def infer(self, view: SampleGradientView) -> Tensor:
        self._check_view(view)
        return view.grad_logits.argmin(dim=1)


def recover_logit_gradients(view: LastLayerGradientView) -> Tensor:
    """Theorem 1: solve Q = U A for the per-sample logit gradients U (returned as (B, C)).

    With the bias gradient as one more equation (it equals U @ 1), the system is Q'^T = A'^T U^T with
    A' = [A, 1]; the least-squares solution is exact when B <= rank(A') and minimum-norm otherwise.
    """
    inputs = view.last_inputs.to(torch.float64)
    targets = view.weight_grad.to(torch.float64)
    if view.bias_grad is not None:
        ones = torch.ones(inputs.shape[0], 1, dtype=torch.float64)
        inputs = torch.cat([inputs, ones], dim=1)
        targets = torch.cat([targets, view.bias_grad.to(torch.float64).unsqueeze(1)], dim=1)
    # inputs^T (M', B) @ U (B, C) = targets^T (M', C); pinv gives the minimum-norm solution when rank < B.
    return torch.linalg.pinv(inputs.T) @ targets.T


class AnalyticLabelRecovery(LabelInferenceAttack):
    """Theorem 1 batch-level recovery from the last layer's batch gradient; 100% when B <= rank(A)."""

    view_type = LastLayerGradientView

    def infer(self, view: LastLayerGradientView) -> Tensor:
        self._check_view(view)
        return recover_logit_gradients(view).argmin(dim=1)

    @staticmethod
    def is_exact(view: LastLayerGradientView) -> bool:
        """Whether Theorem 1's condition B <= rank(A') holds, i.e. the recovered gradients are unique."""
        inputs = view.last_inputs.to(torch.float64)
        if view.bias_grad is not None:
            inputs = torch.cat([inputs, torch.ones(inputs.shape[0], 1, dtype=torch.float64)], dim=1)
        return int(torch.linalg.matrix_rank(inputs)) >= inputs.shape[0]


class GradientInversionLabelInference(LabelInferenceAttack):
    """Paper 004 Algorithm 2 (eq. 9-10): optimise dummy other-party logits H'^a and dummy labels y' so that the
    gradient they induce on ALL of the attacker's parameters matches the observed batch-level gradient.

    The dummy label enters as the soft target softmax(y'_i) (DLG style); the loss uses the protocol's reduction
    (`"mean"`: the batch-averaged loss of paper 004). Two equivalent ways to get the dummy gradient:

    - `"jacobian"` (default): the attacker's parameters are fixed during the attack, so
      dL'/dθ = Σ_i J_i^T dL'/dH_i with J_i = dH^p_i/dθ, computed once. Exactly eq. 9, far cheaper per step.
    - `"double_backprop"`: eq. 9 literally, differentiating through autograd every step (for models whose
      Jacobian does not fit in memory).
    """

    view_type = BatchGradientView
    methods: ClassVar[tuple[str, ...]] = ("jacobian", "double_backprop")
    reductions: ClassVar[tuple[str, ...]] = ("mean", "sum")

    def __init__(
        self,
        iterations: int = 3000,
        lr: float = 0.05,
        reduction: str = "mean",
        method: str = "jacobian",
        seed: int = 0,
    ) -> None:
        if iterations < 1:
            raise ValueError(f"iterations must be >= 1, got {iterations}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        if reduction not in self.reductions:
            raise ValueError(f"reduction must be one of {self.reductions}, got {reduction!r}")
        if method not in self.methods:
            raise ValueError(f"method must be one of {self.methods}, got {method!r}")
        self.iterations = iterations
        self.lr = lr
        self.reduction = reduction
        self.method = method
        self.seed = seed

    def infer(self, view: BatchGradientView) -> Tensor:
        self._check_view(view)
        return self.optimise(view)[0].argmax(dim=1)

    def optimise(self, view: BatchGradientView) -> tuple[Tensor, float]:
        """Run Algorithm 2; return the final dummy labels y' (B, C) and the final relative distance
        D / ||observed||^2."""
        self._check_view(view)
        names = list(view.param_grads)
        model = copy.deepcopy(view.model).to(torch.float64)
        params = {name: p.detach() for name, p in model.named_parameters()}
        observed = torch.cat([view.param_grads[n].detach().to(torch.float64).reshape(-1) for n in names])
        features = view.features.detach().to(torch.float64)
        with torch.no_grad():
            own_logits = functional_call(model, params, (features,))
        batch, classes = own_logits.shape
        if classes != view.num_classes:
            raise ValueError(f"the attacker's model outputs {classes} logits, view says {view.num_classes}")
        gen = torch.Generator().manual_seed(self.seed)
        dummy_logits = torch.randn(batch, classes, generator=gen, dtype=torch.float64).requires_grad_()
        dummy_labels = torch.randn(batch, classes, generator=gen, dtype=torch.float64).requires_grad_()
        scale = 1.0 / batch if self.reduction == "mean" else 1.0
        optimiser = torch.optim.Adam([dummy_logits, dummy_labels], lr=self.lr)

        if self.method == "jacobian":
            jac = _output_jacobian(model, params, names, features)  # (B*C, P)

            def dummy_gradient() -> Tensor:
                # d/dH of soft-target CE: softmax(H) - target, times the reduction factor.
                logit_grad = torch.softmax(own_logits + dummy_logits, 1) - torch.softmax(dummy_labels, 1)
                return (logit_grad * scale).reshape(-1) @ jac

        else:
            grad_params = [params[n].clone().requires_grad_() for n in names]
            call_params = dict(params)
            call_params.update(zip(names, grad_params, strict=True))

            def dummy_gradient() -> Tensor:
                logits = functional_call(model, call_params, (features,)) + dummy_logits
                targets = torch.softmax(dummy_labels, 1)
                loss = -(targets * torch.log_softmax(logits, 1)).sum() * scale
                grads = torch.autograd.grad(loss, grad_params, create_graph=True)
                return torch.cat([g.reshape(-1) for g in grads])

        # D of eq. 10 divided by the constant ||observed||^2: same minimiser, but O(1) values keep Adam's
        # epsilon from swamping the tiny gradients of a batch-averaged loss.
        norm = (observed**2).sum().clamp_min(torch.finfo(torch.float64).tiny)
        distance = torch.tensor(float("nan"))
        for _ in range(self.iterations):
            optimiser.zero_grad()
            distance = ((dummy_gradient() - observed) ** 2).sum() / norm
            distance.backward()
            optimiser.step()
        return dummy_labels.detach(), float(distance.detach())


def _output_jacobian(
    model: nn.Module, params: dict[str, Tensor], names: list[str], features: Tensor
) -> Tensor:
    """dH/dθ for the batch output H (B, C) w.r.t. the named parameters, flattened to (B*C, P)."""
    fixed = {k: v for k, v in params.items() if k not in names}

    def outputs(trainable: dict[str, Tensor]) -> Tensor:
        return functional_call(model, {**fixed, **trainable}, (features,))

    jac = jacrev(outputs)({n: params[n] for n in names})
    rows = features.shape[0] * jac[names[0]].shape[1]
    return torch.cat([jac[n].reshape(rows, -1) for n in names], dim=1)


class NormScoring(LabelInferenceAttack):
    """Li et al.'s norm-based scoring for binary tasks: the rarer positive class is predicted with less
    confidence, so its per-sample gradients are larger. `scores` is the attack's raw output (score AUC with
    `vflnet.metrics.labels.binary_auc`, or per batch with `mean_batch_auc`); `infer` labels the `positive_fraction` highest-norm rows positive."""

    view_type = SampleGradientView

    def __init__(self, positive_fraction: float = 0.5) -> None:
        if not 0.0 < positive_fraction < 1.0:
            raise ValueError(f"positive_fraction must be in (0, 1), got {positive_fraction}")
        self.positive_fraction = positive_fraction

    def scores(self, view: SampleGradientView) -> Tensor:
        self._check_view(view)
        return view.grad_logits.norm(dim=1)

    def infer(self, view: SampleGradientView) -> Tensor:
        scores = self.scores(view)
        count = max(1, round(self.positive_fraction * scores.numel()))
        labels = torch.zeros(scores.numel(), dtype=torch.long)
        labels[scores.topk(count).indices] = 1
        return labels


class DirectionScoring(LabelInferenceAttack):
    """Li et al.'s direction-based scoring for binary tasks: gradients of same-class samples point the same
    way. Given one row whose label the attacker knows (its threat model), the score of row i is the cosine
    similarity to that row; rows with positive similarity share the known label."""

    view_type = SampleGradientView

    def scores(self, view: SampleGradientView, known_position: int) -> Tensor:
        self._check_view(view)
        if not 0 <= known_position < view.grad_logits.shape[0]:
            raise ValueError(f"known_position {known_position} is outside the batch")
        return self.similarity(view, view.grad_logits[known_position])

    def similarity(self, view: SampleGradientView, reference: Tensor) -> Tensor:
        """Cosine similarity of every row to a reference gradient of a known-label sample (which an online
        attacker may have received in another batch)."""
        self._check_view(view)
        if reference.shape != view.grad_logits.shape[1:]:
            raise ValueError(
                f"reference has shape {tuple(reference.shape)}, rows have {tuple(view.grad_logits.shape[1:])}"
            )
        return torch.nn.functional.cosine_similarity(view.grad_logits, reference.unsqueeze(0), dim=1)

    def infer(self, view: SampleGradientView, known_position: int, known_label: int) -> Tensor:
        if known_label not in (0, 1):
            raise ValueError(f"known_label must be 0 or 1, got {known_label}")
        same = self.scores(view, known_position) > 0
        return torch.where(same, known_label, 1 - known_label).long()


class PassiveModelCompletion(LabelInferenceAttack):
    """Fu et al.'s passive model completion: put a completion head on the attacker's trained bottom model and
    fine-tune with a few auxiliary labelled samples, then label the target rows.

    Simplification: plain supervised fine-tuning (Fu et al. use MixMatch semi-supervised learning). The
    attacker's model is copied, never changed in place. `fine_tune_bottom` also updates the copied bottom.
    """

    view_type = ModelCompletionView

    def __init__(
        self,
        hidden: int = 32,
        epochs: int = 200,
        lr: float = 0.01,
        fine_tune_bottom: bool = True,
        seed: int = 0,
    ) -> None:
        if hidden < 1:
            raise ValueError(f"hidden must be >= 1, got {hidden}")
        if epochs < 1:
            raise ValueError(f"epochs must be >= 1, got {epochs}")
        if not lr > 0:
            raise ValueError(f"lr must be > 0, got {lr}")
        self.hidden = hidden
        self.epochs = epochs
        self.lr = lr
        self.fine_tune_bottom = fine_tune_bottom
        self.seed = seed

    def infer(self, view: ModelCompletionView) -> Tensor:
        self._check_view(view)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            return self._complete(view)

    def _complete(self, view: ModelCompletionView) -> Tensor:
        bottom = copy.deepcopy(view.model)
        bottom.requires_grad_(self.fine_tune_bottom)
        with torch.no_grad():
            width = bottom(view.aux_features[:1]).shape[1]
        head = nn.Sequential(
            nn.Linear(width, self.hidden), nn.ReLU(), nn.Linear(self.hidden, view.num_classes)
        )
        completed = nn.Sequential(bottom, head)
        trainable = [p for p in completed.parameters() if p.requires_grad]
        optimiser = torch.optim.Adam(trainable, lr=self.lr)
        labels = view.aux_labels.long()
        completed.train()
        for _ in range(self.epochs):
            optimiser.zero_grad()
            nn.functional.cross_entropy(completed(view.aux_features), labels).backward()
            optimiser.step()
        completed.eval()
        with torch.no_grad():
            return completed(view.target_features).argmax(dim=1)
