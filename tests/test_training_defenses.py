"""MID, dCor and GradPerturb (VFLAIR's definitions) against the passive party's label attacks.

Each test trains paper 004's two-party digits MLP under the real `split` protocol (tests/paper004.py, every
role in this process over the loopback bridge) with and without the defense at the active party; the
attacks run on the passive attacker's recorded views only. Main-task accuracy is the active party's on
the held-out quarter."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from tests.paper004 import config, run, steps_per_epoch
from vflnet.attacks.label_inference import DirectionScoring, DirectLabelInference, SampleGradientView
from vflnet.config import ConfigError
from vflnet.defenses.label_defenses import laplace
from vflnet.defenses.training_defenses import (
    MID,
    DistanceCorrelation,
    GradPerturb,
    VariationalBottleneck,
    distance_correlation,
)
from vflnet.metrics.labels import label_recovery_accuracy
from vflnet.runner.loopback import run_loopback
from vflnet.validation import config_from_dict

DEFENSES = {
    "mid": {"lambda": 0.01},
    "dcor": {"alpha": 5.0},
    "grad-perturb": {"perturb_epsilon": 1.0},
}


def recovered(root: Path, name: str, defense: tuple[str, dict[str, Any]] | None, **kwargs: Any):
    """Train 2 epochs of batch 64; the per-sample gradients of the 8 batches after the first epoch
    (512 samples), their true labels, and the run."""
    first = steps_per_epoch(64) + 1
    trained = run(root, name, batch=64, epochs=2, record=(first, first + 7), defense=defense, **kwargs)
    view, truth = trained.plaintext()
    return view, truth, trained


@pytest.mark.parametrize("name", sorted(DEFENSES))
def test_defense_changes_the_sent_gradients_and_blunts_direct_label_inference(tmp_path, name: str) -> None:
    """Lemma 1 (argmin of dL/dH_i) recovers every label without a defense; with each defense the gradients
    the passive party receives differ and the attack falls to chance level, at a main-task cost."""
    plain, truth, plain_run = recovered(tmp_path, "plain", None)
    defended, defended_truth, defended_run = recovered(tmp_path, name, (name, DEFENSES[name]))
    assert torch.equal(truth, defended_truth)  # the same batches: only the defense differs
    assert not torch.allclose(plain.grad_logits, defended.grad_logits)
    attack = {
        "plain": label_recovery_accuracy(DirectLabelInference().infer(plain), truth),
        name: label_recovery_accuracy(DirectLabelInference().infer(defended), truth),
    }
    mta = {"plain": plain_run.test_accuracy, name: defended_run.test_accuracy}
    print("direct label inference", attack, "main-task accuracy", mta)
    assert attack["plain"] == 1.0
    assert attack[name] <= 0.3  # chance is 0.1
    assert mta["plain"] > 0.9
    assert mta[name] > 0.75


@pytest.mark.parametrize("name", sorted(DEFENSES))
def test_defense_blunts_direction_scoring_on_a_binary_task(tmp_path, name: str) -> None:
    """Li et al.'s direction scoring with one known positive (digit 3 against the rest)."""
    accuracy = {}
    for label, defense in (("plain", None), (name, (name, DEFENSES[name]))):
        view, truth, _ = recovered(tmp_path, label, defense, positive_class=3)
        known = int(torch.nonzero(truth == 1)[0])
        scored = DirectionScoring().infer(
            SampleGradientView(torch.arange(len(truth)), view.grad_logits), known, 1
        )
        accuracy[label] = label_recovery_accuracy(scored, truth)
    print("direction scoring", accuracy)
    assert accuracy["plain"] == 1.0
    assert accuracy[name] < 0.9


@pytest.mark.parametrize("protocol", ["split-he", "param-server"])
@pytest.mark.parametrize("name", sorted(DEFENSES))
def test_refused_by_name_where_it_would_not_act(name: str, protocol: str) -> None:
    data = config(batch=64, defense=(name, {}))
    data["protocol"]["kind"] = protocol
    with pytest.raises(
        ConfigError,
        match=f"defense '{name}' needs the hook point 'plaintext-embeddings'.*that apply 'plaintext-embeddings': \\['split'\\]",
    ):
        config_from_dict(data)


@pytest.mark.parametrize("name", sorted(DEFENSES))
def test_a_resumed_run_ends_as_the_run_left_alone(tmp_path, name: str) -> None:
    """Resumed from the checkpoint before the last (the newest removed, as if the run died after it):
    MID's layers are modules of the active party's model and MID's and GradPerturb's generators are
    in the checkpoint, so the resumed run ends with the same parameters and metrics."""
    data = config(batch=64, epochs=2, defense=(name, DEFENSES[name]))
    data["train"]["checkpoint_every_steps"] = 10
    data["run"].update(dir=str(tmp_path), id=name)
    cfg = config_from_dict(data)
    run_dir = tmp_path / name
    run_dir.mkdir()
    run_loopback(cfg, run_dir)
    alone = final_state(run_dir)
    *_, before, newest = sorted((run_dir / "checkpoints").glob("step-*"))
    shutil.rmtree(newest)
    run_loopback(cfg, run_dir, resume=True)
    assert json.loads((run_dir / "summary.json").read_text())["resumed_from_step"] == int(before.name[5:])
    resumed = final_state(run_dir)
    assert resumed[0] == alone[0]
    assert ("defense" in alone[1]["active"]) == (name == "mid")
    for party, modules in alone[1].items():
        for module, state in modules.items():
            for key, value in state.items():
                assert torch.equal(resumed[1][party][module][key], value), (party, module, key)


def final_state(run_dir: Path) -> tuple[dict[str, Any], dict[str, dict[str, dict[str, torch.Tensor]]]]:
    """The final metrics (without the time) and every party's modules at the end of a run."""
    final = json.loads((run_dir / "summary.json").read_text())["final"]
    modules = {
        p.stem: torch.load(p, weights_only=True)["modules"] for p in (run_dir / "checkpoints").glob("*.pt")
    }
    return {k: v for k, v in final.items() if k != "time_s"}, modules


def test_distance_correlation_is_one_for_a_linear_map_and_zero_for_a_constant() -> None:
    x = torch.randn(50, 3, generator=torch.Generator().manual_seed(0))
    assert float(distance_correlation(x, 2.0 * x + 1.0)) == pytest.approx(1.0, abs=1e-5)
    assert float(distance_correlation(x, torch.ones(50, 4))) == 0.0
    independent = torch.randn(50, 3, generator=torch.Generator().manual_seed(1))
    assert float(distance_correlation(x, independent)) < 0.5
    x.requires_grad_(True)
    labels = torch.randint(0, 4, (50,), generator=torch.Generator().manual_seed(2))
    _, penalty = DistanceCorrelation(4, alpha=2.0).embeddings([x], labels)
    assert penalty is not None
    (grad,) = torch.autograd.grad(penalty, x)
    assert bool(torch.isfinite(grad).all()) and float(grad.abs().sum()) > 0


def test_grad_perturb_adds_laplace_weighted_per_class_gradients() -> None:
    """VFLAIR's perturbation sum_c u_ic g_c,i, g_c the gradient with every label set to c, u ~ Laplace(0,
    2 / perturb_epsilon) drawn from the defense's seeded generator."""
    logits = torch.randn(6, 4, requires_grad=True)
    (got,) = torch.autograd.grad(GradPerturb(4, perturb_epsilon=2.0, seed=0).gradient_noise(logits), logits)
    u = laplace(torch.Size((6, 4)), 1.0, torch.Generator().manual_seed(0), logits.dtype)
    per_class = [
        torch.autograd.grad(F.cross_entropy(logits, torch.full((6,), c)), logits)[0] for c in range(4)
    ]
    torch.testing.assert_close(got, sum(u[:, c : c + 1] * per_class[c] for c in range(4)))


def test_mid_samples_while_training_and_decodes_the_mean_otherwise() -> None:
    mid = MID(10, mid_lambda=0.5, bottleneck_scale=2, seed=0)
    layers = mid.trainable([10, 6])
    assert [layer.size for layer in layers if isinstance(layer, VariationalBottleneck)] == [20, 12]
    h = [torch.randn(8, 10), torch.randn(8, 6)]
    layers.train()
    (a, b), kl = mid.embeddings(h, None)
    (a2, _), _ = mid.embeddings(h, None)
    assert a.shape == (8, 10) and b.shape == (8, 6) and kl is not None and float(kl.detach()) > 0
    assert not torch.equal(a, a2)  # a fresh sample each step
    layers.eval()
    (m1, _), _ = mid.embeddings(h, None)
    (m2, _), _ = mid.embeddings(h, None)
    assert torch.equal(m1, m2)


@pytest.mark.parametrize(
    ("factory", "parameter"),
    [
        (lambda: MID(10, mid_lambda=-1.0, bottleneck_scale=1, seed=0), "lambda"),
        (lambda: MID(10, mid_lambda=0.0, bottleneck_scale=0, seed=0), "bottleneck_scale"),
        (lambda: DistanceCorrelation(10, alpha=-0.1), "alpha"),
        (lambda: GradPerturb(10, perturb_epsilon=0.0, seed=0), "perturb_epsilon"),
    ],
)
def test_bad_parameters_are_named(factory, parameter: str) -> None:
    with pytest.raises(ValueError, match=parameter):
        factory()
