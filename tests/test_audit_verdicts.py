"""Issue 56: what each attack needs of the model (one declaration, used by the audit's selection and by
the config check), honest baselines (the majority class), blind rows, failed scoring, the permuted-label
null and `--vary`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import base_config
from vflnet.config import ConfigError
from vflnet.threat.attack import LabelAttack, label_scores
from vflnet.tools.audit import cli
from vflnet.tools.audit.execute import BLIND, judge
from vflnet.validation import config_from_dict

ROOT = Path(__file__).resolve().parent.parent
DIGITS = ROOT / "configs" / "digits-2p.yaml"
BATCH_LABEL = ("analytic-label-recovery", "gradient-inversion-label-inference", "direct-label-inference")


def test_label_attacks_behind_a_top_model_are_not_selected_and_refused_by_config_check() -> None:
    _, _, cands = cli.prepare(DIGITS, [], "quick")  # as written: concatenated embeddings, a top model
    picked = {c.key: c for c in cands}
    for name in BATCH_LABEL:
        cand = picked[f"{name}@passive-1"]
        assert not cand.applies and "summed at the active party" in cand.reason, (name, cand.reason)
    data = base_config(n_passive=2)  # concat under an mlp top
    for name in BATCH_LABEL:
        data["attacks"] = [{"name": name, "party": "passive-1"}]
        with pytest.raises(ConfigError) as info:
            config_from_dict(data)
        assert info.value.key == "protocol.aggregation" and "'concat'" in info.value.message
        assert f"attack {name!r}: needs passive parties that send logits summed" in info.value.message
    # summed logits under a top model: the key that is wrong is the top model's
    data = base_config(n_passive=2, aggregation="sum")
    data["model"] = {"top": {"kind": "mlp", "hidden": [8]}}
    data["attacks"] = [{"name": "analytic-label-recovery", "party": "passive-1"}]
    with pytest.raises(ConfigError) as info:
        config_from_dict(data)
    assert info.value.key == "model.top.kind"
    # paper 004's setting: selected
    data = base_config(n_passive=2, aggregation="sum")
    data["attacks"] = [{"name": n, "party": "passive-1"} for n in BATCH_LABEL]
    assert [a.name for a in config_from_dict(data).attacks] == list(BATCH_LABEL)


def test_a_model_need_that_does_not_exist_is_refused_when_the_attack_is_defined() -> None:
    with pytest.raises(TypeError, match="no-such-need"):

        class _Wrong(LabelAttack):  # noqa: F841 - defining it is the test
            model_needs = ("no-such-need",)


def test_the_majority_class_baseline_on_an_imbalanced_set() -> None:
    from vflnet.data.datasets import load_dataset

    data = load_dataset("breast_cancer", {})
    truth = dict(zip(data.ids.tolist(), data.labels.tolist(), strict=True))
    majority = int(np.bincount(data.labels).argmax())
    ids = data.ids
    always = label_scores(ids, np.full(len(ids), majority), truth)  # the trivial attacker
    assert always["majority_baseline"] == pytest.approx(0.627, abs=0.001) and always["chance"] == 0.5
    assert always["label_accuracy"] == always["majority_baseline"]
    row: dict[str, Any] = {"scores": [always, always], "errors": []}
    judge(row, 2)
    assert row["baseline"] == pytest.approx(0.627, abs=0.001) and row["verdict"] == "at baseline"
    assert "majority class (1)" in row["baseline_what"]


def test_labels_outside_the_task_are_a_failure_never_a_score() -> None:
    truth = {i: i % 10 for i in range(100)}
    with pytest.raises(ValueError, match="outside the task's classes 0..9"):
        label_scores(np.arange(5), np.array([0, 3, 31, 2, 1]), truth)  # embedding units, not classes
    row: dict[str, Any] = {
        "scores": [label_scores(np.arange(5), np.arange(5), truth)],
        "errors": ["scoring failed: ValueError: inferred labels span 0..31"],
    }
    judge(row, 10)
    assert row["verdict"].startswith("failed: scoring failed") and "mean" not in row


def test_a_blind_attack_is_never_inconclusive() -> None:
    truth = {i: i % 10 for i in range(100)}
    rng = np.random.default_rng(0)
    scores = []
    for _ in range(2):  # two seeds of guesses: few samples, a wide interval
        s = label_scores(np.arange(20), rng.integers(0, 10, 20), truth)
        scores.append(s | {"informed_fraction": 0.0})
    row: dict[str, Any] = {"scores": scores, "errors": []}
    judge(row, 10)
    assert row["verdict"].startswith(BLIND) and "inconclusive" not in row["verdict"]
    informed = {"scores": [s | {"informed_fraction": 1.0} for s in scores], "errors": []}
    judge(informed, 10)
    assert not informed["verdict"].startswith(BLIND)


def test_no_leakage_metric_row_says_so() -> None:
    row: dict[str, Any] = {"scores": [{"codes": 3.0}], "errors": []}
    judge(row, 10)
    assert row["verdict"] == "no leakage metric in its scores: codes=3"
