"""Paper 004's label-inference attacks on the in-process two-party digits MLP (see test_label_sim.py).

Every attack gets only a passive-side view; the true labels are used only to score its output."""

from __future__ import annotations

import copy

import pytest
import torch
from test_label_sim import Split, TwoPartyVFL, digits, one_torch_thread  # noqa: F401 (autouse fixture)

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
from vflnet.defenses.label_defenses import LabelDefense
from vflnet.metrics.labels import binary_auc, label_recovery_accuracy

NONE = LabelDefense(10)


@pytest.fixture(scope="module")
def data() -> tuple[Split, Split]:
    return digits()


def warmed_up(train: Split, steps: int, seed: int = 0) -> TwoPartyVFL:
    """A VFL model trained for a few batches of 64 (the state the attacks are run in)."""
    vfl = TwoPartyVFL(seed=seed)
    gen = torch.Generator().manual_seed(seed + 100)
    for _ in range(steps):
        vfl.step(train, torch.randperm(len(train.labels), generator=gen)[:64], NONE)
    return vfl


def batch(train: Split, size: int, seed: int) -> torch.Tensor:
    return torch.randperm(len(train.labels), generator=torch.Generator().manual_seed(seed))[:size]


def test_lemma_1_direct_inference_recovers_every_label(data: tuple[Split, Split]) -> None:
    train, _ = data
    views = warmed_up(train, 20).step(train, batch(train, 128, 1), NONE, update=False)
    inferred = DirectLabelInference().infer(views.plaintext)
    assert label_recovery_accuracy(inferred, views.true_labels) == 1.0


@pytest.mark.parametrize("size", [8, 16, 32])
def test_theorem_1_exact_recovery_when_batch_within_hidden_width(
    data: tuple[Split, Split], size: int
) -> None:
    train, _ = data
    vfl = warmed_up(train, 20)
    views = vfl.step(train, batch(train, size, size), NONE, update=False)
    last = last_layer_view(views.he)
    assert torch.equal(last.weight_grad, views.he.param_grads["2.weight"])  # default: the output layer
    assert AnalyticLabelRecovery.is_exact(last)
    # The solved per-sample gradients are the ones the active party really computed, not just their argmin.
    torch.testing.assert_close(
        recover_logit_gradients(last).float(), views.plaintext.grad_logits, atol=1e-6, rtol=1e-4
    )
    assert label_recovery_accuracy(AnalyticLabelRecovery().infer(last), views.true_labels) == 1.0


def test_theorem_1_condition_fails_beyond_rank(data: tuple[Split, Split]) -> None:
    train, _ = data
    views = warmed_up(train, 20).step(train, batch(train, 64, 3), NONE, update=False)
    last = last_layer_view(views.he, "2")
    assert not AnalyticLabelRecovery.is_exact(last)
    assert not torch.allclose(recover_logit_gradients(last).float(), views.plaintext.grad_logits, atol=1e-6)


def test_gradient_inversion_recovers_batch_labels_from_averaged_gradient(data: tuple[Split, Split]) -> None:
    train, _ = data
    vfl = warmed_up(train, 5)
    views = vfl.step(train, batch(train, 64, 4), NONE, update=False)
    before = copy.deepcopy(views.he.model.state_dict())
    labels, distance = GradientInversionLabelInference(iterations=1500, lr=0.05).optimise(views.he)
    assert label_recovery_accuracy(labels.argmax(1), views.true_labels) >= 0.9
    assert distance < 1e-3
    for name, tensor in views.he.model.state_dict().items():
        assert torch.equal(tensor, before[name]), "the attack must not touch the attacker's model"


def test_gradient_inversion_jacobian_and_double_backprop_agree(data: tuple[Split, Split]) -> None:
    train, _ = data
    views = warmed_up(train, 5).step(train, batch(train, 8, 5), NONE, update=False)
    fast = GradientInversionLabelInference(iterations=150, method="jacobian").optimise(views.he)
    literal = GradientInversionLabelInference(iterations=150, method="double_backprop").optimise(views.he)
    torch.testing.assert_close(fast[0], literal[0], atol=1e-6, rtol=1e-6)
    assert fast[1] == pytest.approx(literal[1], rel=1e-5)


def test_gradient_inversion_uses_only_the_parameters_it_observed(data: tuple[Split, Split]) -> None:
    """A view carrying only the last layer's gradient still works (fewer equations, same algorithm)."""
    train, _ = data
    views = warmed_up(train, 5).step(train, batch(train, 16, 6), NONE, update=False)
    partial = {k: v for k, v in views.he.param_grads.items() if k.startswith("2.")}
    view = BatchGradientView(views.he.sample_ids, views.he.features, views.he.model, partial, 10)
    inferred = GradientInversionLabelInference(iterations=1500).infer(view)
    assert label_recovery_accuracy(inferred, views.true_labels) >= 0.9


def binary_task(train: Split, positive_digit: int) -> Split:
    """Imbalanced binary task (Li et al.'s setting): one digit (~10%) against the rest."""
    return Split(train.active, train.passive, (train.labels == positive_digit).long())


def test_norm_and_direction_scoring_on_imbalanced_binary_task(data: tuple[Split, Split]) -> None:
    train, _ = data
    binary = binary_task(train, 3)
    vfl = TwoPartyVFL(num_classes=2, seed=0)
    vfl.train(binary, LabelDefense(2), epochs=1, batch_size=64)
    views = vfl.step(binary, batch(binary, 256, 7), LabelDefense(2), update=False)
    truth = views.true_labels
    # Norm scoring: positives (rare, less confidently fit) get larger gradients.
    assert binary_auc(NormScoring().scores(views.plaintext), truth) > 0.8
    positive_fraction = 0.1
    norm_labels = NormScoring(positive_fraction).infer(views.plaintext)
    assert int(norm_labels.sum()) == round(positive_fraction * 256)
    # Direction scoring from one known positive row: gradients of a class point the same way.
    known = int(torch.nonzero(truth == 1)[0])
    direction = DirectionScoring().infer(views.plaintext, known_position=known, known_label=1)
    assert label_recovery_accuracy(direction, truth) == 1.0


def test_passive_model_completion_with_few_auxiliary_labels(data: tuple[Split, Split]) -> None:
    train, test = data
    vfl = TwoPartyVFL(seed=0)
    vfl.train(train, NONE, epochs=2, batch_size=64)
    aux = torch.cat([torch.nonzero(train.labels == c)[:4, 0] for c in range(10)])  # 4 labels per class
    view = ModelCompletionView(vfl.passive, train.passive[aux], train.labels[aux], test.passive, 10)
    before = copy.deepcopy(vfl.passive.state_dict())
    inferred = PassiveModelCompletion(epochs=100).infer(view)
    assert label_recovery_accuracy(inferred, test.labels) > 0.5  # chance is 0.1
    for name, tensor in vfl.passive.state_dict().items():
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
