"""Paper 004's label-inference attacks on its two-party digits MLP, trained by the real `split` protocol
(tests/paper004.py: every role in this process over the loopback bridge).

Every attack gets only the passive attacker's views, as its wire and own view give them; the true labels
are used only to score its output. A batch is attacked at the step it is trained in (the views are those
of that step, taken before its update), after the run's earlier steps at the same batch size."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.paper004 import Run, run, steps_per_epoch
from vflnet.attacks.label_inference import (
    AnalyticLabelRecovery,
    BatchGradientView,
    DirectionScoring,
    DirectLabelInference,
    GradientInversionLabelInference,
    LabelInferenceAttack,
    LastLayerGradientView,
    ModelCompletionView,
    NormScoring,
    PassiveModelCompletion,
    SampleGradientView,
    last_layer_view,
    recover_logit_gradients,
)
from vflnet.metrics.labels import binary_auc, label_recovery_accuracy

RUNS: dict[tuple, Run] = {}


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("paper004")


def attacked(root: Path, batch: int, after: int, **kwargs) -> Run:
    """A run at batch size `batch` whose step `after + 1` is the attacked one (its views recorded);
    runs are shared between the tests of this module."""
    key = (batch, after, tuple(sorted(kwargs.items())))
    if key not in RUNS:
        name = f"b{batch}-after{after}-{len(RUNS)}"
        RUNS[key] = run(
            root, name, batch=batch, max_steps=after + 1, epochs=100, record=(after + 1, after + 1), **kwargs
        )
    return RUNS[key]


def test_views_of_the_real_protocol_agree(root: Path) -> None:
    """The batch-level gradient the passive party applied equals sum_i J_i^T g_i over the per-sample
    gradients it received (eq. 4): its two views are of the same step."""
    views = attacked(root, 16, 0).last()
    model = views.he.model
    recomputed = torch.autograd.grad(
        (model(views.he.features) * views.plaintext.grad_logits).sum(), list(model.parameters())
    )
    for (name, _), grad in zip(model.named_parameters(), recomputed, strict=True):
        torch.testing.assert_close(views.he.param_grads[name], grad)


def test_sent_gradient_rows_follow_lemma_1_shape(root: Path) -> None:
    """Undefended dL/dH rows sum to zero and carry the 1/B factor of the batch-averaged loss."""
    grad = attacked(root, 8, 0).last().plaintext.grad_logits
    torch.testing.assert_close(grad.sum(1), torch.zeros(8), atol=1e-7, rtol=0)
    assert float(grad.abs().max()) <= 1.0 / 8


def test_lemma_1_direct_inference_recovers_every_label(root: Path) -> None:
    views = attacked(root, 128, 20).last()
    inferred = DirectLabelInference().infer(views.plaintext)
    assert label_recovery_accuracy(inferred, views.true_labels) == 1.0


@pytest.mark.parametrize("size", [8, 16, 32])
def test_theorem_1_exact_recovery_when_batch_within_hidden_width(root: Path, size: int) -> None:
    views = attacked(root, size, 20).last()
    last = last_layer_view(views.he)
    assert torch.equal(last.weight_grad, views.he.param_grads["2.weight"])  # default: the output layer
    assert AnalyticLabelRecovery.is_exact(last)
    # The solved per-sample gradients are the ones the active party really computed, not just their argmin.
    torch.testing.assert_close(
        recover_logit_gradients(last).float(), views.plaintext.grad_logits, atol=1e-6, rtol=1e-4
    )
    assert label_recovery_accuracy(AnalyticLabelRecovery().infer(last), views.true_labels) == 1.0


def test_theorem_1_condition_fails_beyond_rank(root: Path) -> None:
    views = attacked(root, 64, 20).last()
    last = last_layer_view(views.he, "2")
    assert not AnalyticLabelRecovery.is_exact(last)
    assert not torch.allclose(recover_logit_gradients(last).float(), views.plaintext.grad_logits, atol=1e-6)


def test_gradient_inversion_recovers_batch_labels_from_averaged_gradient(root: Path) -> None:
    views = attacked(root, 64, 5).last()
    before = copy.deepcopy(views.he.model.state_dict())
    labels, distance = GradientInversionLabelInference(iterations=1500, lr=0.05).optimise(views.he)
    assert label_recovery_accuracy(labels.argmax(1), views.true_labels) >= 0.9
    assert distance < 1e-3
    for name, tensor in views.he.model.state_dict().items():
        assert torch.equal(tensor, before[name]), "the attack must not touch the attacker's model"


def test_gradient_inversion_jacobian_and_double_backprop_agree(root: Path) -> None:
    views = attacked(root, 8, 5).last()
    fast = GradientInversionLabelInference(iterations=150, method="jacobian").optimise(views.he)
    literal = GradientInversionLabelInference(iterations=150, method="double_backprop").optimise(views.he)
    torch.testing.assert_close(fast[0], literal[0], atol=1e-6, rtol=1e-6)
    assert fast[1] == pytest.approx(literal[1], rel=1e-5)


def test_gradient_inversion_uses_only_the_parameters_it_observed(root: Path) -> None:
    """A view carrying only the last layer's gradient still works (fewer equations, same algorithm)."""
    views = attacked(root, 16, 5).last()
    partial = {k: v for k, v in views.he.param_grads.items() if k.startswith("2.")}
    view = BatchGradientView(views.he.sample_ids, views.he.features, views.he.model, partial, 10)
    inferred = GradientInversionLabelInference(iterations=1500).infer(view)
    assert label_recovery_accuracy(inferred, views.true_labels) >= 0.9


def test_batch_level_views_are_the_same_under_split_he(root: Path) -> None:
    """Under split-he the attacker gets no per-sample gradient, and its own view (decrypted through the
    fixed point) matches the plaintext run's: the batch-level attacks see the same."""
    he, plain = attacked(root, 16, 2, protocol="split-he"), attacked(root, 16, 2)
    assert he.last().plaintext is None
    for name, grad in plain.last().he.param_grads.items():
        torch.testing.assert_close(he.last().he.param_grads[name], grad, atol=1e-4, rtol=1e-3)
    last = last_layer_view(he.last().he)
    assert label_recovery_accuracy(AnalyticLabelRecovery().infer(last), he.last().true_labels) == 1.0


def test_norm_and_direction_scoring_on_imbalanced_binary_task(root: Path) -> None:
    """Li et al.'s imbalanced binary task (digit 3, ~10%, against the rest), one epoch of batch 64, then
    the per-sample gradients of the next 4 batches (256 samples)."""
    first = steps_per_epoch(64) + 1
    binary = run(root, "binary", batch=64, epochs=2, positive_class=3, record=(first, first + 3))
    view, truth = binary.plaintext()
    assert len(truth) == 256
    # Norm scoring: positives (rare, less confidently fit) get larger gradients.
    assert binary_auc(NormScoring().scores(view), truth) > 0.8
    positive_fraction = 0.1
    norm_labels = NormScoring(positive_fraction).infer(view)
    assert int(norm_labels.sum()) == round(positive_fraction * 256)
    # Direction scoring from one known positive row: gradients of a class point the same way.
    known = int(torch.nonzero(truth == 1)[0])
    direction = DirectionScoring().infer(view, known_position=known, known_label=1)
    assert label_recovery_accuracy(direction, truth) == 1.0


def test_passive_model_completion_with_few_auxiliary_labels(root: Path) -> None:
    trained = run(root, "two-epochs", batch=64, epochs=2, record=(1, 1))
    train, test = trained.split()
    train_labels = trained.labels(train)
    aux = np.concatenate([train[(train_labels == c).numpy()][:4] for c in range(10)])  # 4 labels per class
    model = trained.passive_model()
    view = ModelCompletionView(
        model, trained.passive_rows(aux), trained.labels(aux), trained.passive_rows(test), 10
    )
    before = copy.deepcopy(model.state_dict())
    inferred = PassiveModelCompletion(epochs=100).infer(view)
    assert label_recovery_accuracy(inferred, trained.labels(test)) > 0.5  # chance is 0.1
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name])


@pytest.mark.parametrize(
    ("factory", "parameter"),
    [
        (lambda: GradientInversionLabelInference(iterations=0), "iterations"),
        (lambda: GradientInversionLabelInference(lr=0.0), "lr"),
        (lambda: GradientInversionLabelInference(reduction="max"), "reduction"),
        (lambda: GradientInversionLabelInference(method="magic"), "method"),
        (lambda: NormScoring(positive_fraction=1.0), "positive_fraction"),
        (lambda: PassiveModelCompletion(hidden=0), "hidden"),
        (lambda: PassiveModelCompletion(epochs=0), "epochs"),
        (lambda: PassiveModelCompletion(lr=-1.0), "lr"),
    ],
)
def test_bad_parameters_are_named(factory, parameter: str) -> None:
    with pytest.raises(ValueError, match=parameter):
        factory()


def test_views_reject_inconsistent_inputs() -> None:
    model = torch.nn.Linear(4, 3)
    with pytest.raises(ValueError, match="batch size"):
        SampleGradientView(torch.arange(3), torch.zeros(4, 3))
    with pytest.raises(ValueError, match="names the model does not have"):
        BatchGradientView(torch.arange(2), torch.zeros(2, 4), model, {"nope": torch.zeros(1)}, 3)
    with pytest.raises(ValueError, match="width"):
        LastLayerGradientView(torch.zeros(2, 4), torch.zeros(3, 5))
    with pytest.raises(TypeError, match="SampleGradientView"):
        DirectLabelInference().infer(LastLayerGradientView(torch.zeros(2, 4), torch.zeros(3, 4)))
    with pytest.raises(ValueError, match="known_label"):
        DirectionScoring().infer(SampleGradientView(torch.arange(2), torch.zeros(2, 2)), 0, 2)
    view = BatchGradientView(torch.arange(2), torch.zeros(2, 4), model, {"weight": torch.zeros(3, 4)}, 3)
    with pytest.raises(ValueError, match="not an nn.Linear"):
        last_layer_view(view, "missing")


def test_every_algorithm_is_reached_through_one_registered_attack_name() -> None:
    from vflnet.registry import ATTACKS

    pairs = [(cls.algorithm, name) for name, cls in ATTACKS.all().items() if cls.algorithm is not None]
    assert dict(pairs) == {
        DirectLabelInference: "direct-label-inference",
        AnalyticLabelRecovery: "analytic-label-recovery",
        GradientInversionLabelInference: "gradient-inversion-label-inference",
        NormScoring: "norm-scoring",
        DirectionScoring: "direction-scoring",
        PassiveModelCompletion: "passive-model-completion",
    }
    assert len(pairs) == len(dict(pairs)) == len(LabelInferenceAttack.__subclasses__())
