"""Paper 004's comparison label attacks (B.3.5) at a passive party in real runs: Li et al.'s norm and
direction scoring from the per-sample gradients of plaintext split (and nothing under split-he), and
Fu et al.'s passive model completion from the party's own model and a few labels it is given."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import base_config, write_config
from vflnet.data.datasets import load_dataset
from vflnet.interceptors.trace import read_trace
from vflnet.metrics.labels import mean_batch_auc
from vflnet.registry import ATTACKS
from vflnet.runner.local import run_local
from vflnet.threat.attack import AttackContext
from vflnet.threat.knowledge import run_split, threat_model_knowledge
from vflnet.validation import config_from_dict, load_config


def _scoring_run(tmp_path: Path, name: str, protocol: dict, defenses: list, **train) -> dict:
    bottom = {"kind": "mlp", "hidden": [16], "out": 2}
    data = {
        "run": {"seed": 0},
        "protocol": {"aggregation": "sum", **protocol},
        # breast_cancer with malignant = 1 kept rare (40 of 397): Li et al.'s setting. (With the natural
        # 37% the norm premise fails; docs/attacks.md gives that number.)
        "data": {"dataset": "breast_cancer_rare"},
        "parties": [
            {"name": "coordinator", "role": "coordinator"},
            {"name": "active", "role": "active", "features": {"columns": "0:15"}, "bottom": bottom},
            {"name": "passive-1", "role": "passive", "features": {"columns": "15:30"}, "bottom": bottom},
        ],
        "model": {"top": {"kind": "none"}},
        "train": {"epochs": 3, "batch_size": 64, "optimizer": {"kind": "adam", "lr": 0.01}, **train},
        "attacks": [
            {"name": "norm-scoring", "party": "passive-1"},
            {"name": "direction-scoring", "party": "passive-1"},
        ],
        "defenses": defenses,
        "trace": {"parties": ["passive-1"]},
    }
    path = write_config(tmp_path, data, f"{name}.yaml")
    assert run_local(path, run_dir=tmp_path / name, progress=False) == 0
    return json.loads((tmp_path / name / "attacks/scores.json").read_text())


def _offline_equals_online(run_dir: Path) -> None:
    """The same attack over the recorded trace, with the knowledge its threat model grants, gives the same
    output (what `vflnet attack NAME --trace ... --config ...` does)."""
    cfg = load_config(run_dir / "config.yaml")
    events = list(read_trace(run_dir / "traces/passive-1.trace"))
    for name in ("norm-scoring", "direction-scoring"):
        attack = ATTACKS.get(name)(AttackContext("passive-1", "passive", cfg.run.id))
        attack.context.knowledge.update(threat_model_knowledge(cfg, "passive-1", attack))
        offline = attack.run(events)
        online = dict(np.load(run_dir / f"attacks/{name}@passive-1.npz"))
        assert online.keys() == offline.keys()
        for key in online:
            np.testing.assert_array_equal(online[key], offline[key])


@pytest.mark.e2e
@pytest.mark.slow
def test_norm_and_direction_scoring_leak_binary_labels_and_marvell_hides_them(tmp_path):
    plain = _scoring_run(tmp_path, "plain", {"kind": "split"}, [])
    norm, direction = plain["norm-scoring@passive-1"], plain["direction-scoring@passive-1"]
    assert norm["informed_fraction"] == direction["informed_fraction"] == 1.0
    # Sum of logits, two classes: dL/dH_i = (1 - p_{y_i}) (+-1, -+1), the sign set by the label, so the cosine
    # to a known positive's gradient is exactly +1 or -1: direction scoring is perfect.
    assert direction["auc"] >= 0.99 and direction["label_accuracy"] >= 0.99, direction
    # ||dL/dH_i|| = sqrt(2) (1 - p_{y_i}): while the model predicts near the 10% base rate the rare positives
    # carry ~9x larger gradients (batch AUC 1); once it separates the classes the AUC falls towards the
    # ranking of per-sample difficulty, where rare positives still stay less confident. So well above 0.5
    # (measured: 0.87 with seed 0, 0.77 with seed 1).
    assert norm["auc"] >= 0.7, norm
    _offline_equals_online(tmp_path / "plain")

    marvell = _scoring_run(tmp_path, "marvell", {"kind": "split"}, [{"name": "marvell", "party": "active"}])
    # MARVELL's noise (power budget = the squared gap of the class means) makes the two classes' gradient
    # distributions nearly indistinguishable: both scores fall to near chance (Li et al.: 0.5-0.7).
    for attack, undefended in (("norm-scoring@passive-1", norm), ("direction-scoring@passive-1", direction)):
        assert marvell[attack]["auc"] <= min(0.7, undefended["auc"] - 0.15), (marvell, plain)


@pytest.mark.e2e
@pytest.mark.slow
def test_scoring_attacks_see_only_ciphertexts_under_split_he(tmp_path):
    he = {"kind": "split-he", "params": {"key_bits": 512, "allow_insecure_keys": True}}
    scores = _scoring_run(tmp_path, "he", he, [], max_steps=2, batch_size=32)
    for attack in ("norm-scoring@passive-1", "direction-scoring@passive-1"):
        # every per-sample gradient was a ciphertext: nothing but guesses
        assert scores[attack]["informed_fraction"] == 0.0, scores
        assert scores[attack]["observations"] >= 63, scores  # two batches of 32 (less the known positive)


def test_leak_auc_is_per_batch_and_skips_one_class_batches():
    # batch 1 ranks perfectly, batch 2 inversely; batch 3 holds one class and has no AUC
    scores = [0.9, 0.1, 0.8, 0.2, 0.1, 0.9, 0.5, 0.6]
    truth = [1, 0, 1, 0, 1, 0, 1, 1]
    assert mean_batch_auc(scores, truth, [1, 1, 1, 1, 2, 2, 3, 3]) == 0.5
    one_batch = [1] * 8  # then it is the pooled AUC
    assert mean_batch_auc(scores, truth, one_batch) == pytest.approx(0.6)
    assert np.isnan(mean_batch_auc(scores[6:], truth[6:], [3, 3]))


def test_aux_labels_are_nested_training_samples_per_class():
    cfg = config_from_dict(base_config())
    digits = load_dataset("digits")
    train, _ = run_split(cfg, digits)
    label_of = dict(zip(digits.ids.tolist(), digits.labels.tolist(), strict=True))
    granted = {}
    for per_class in (1, 3):
        attack = ATTACKS.get("passive-model-completion")(
            AttackContext("passive-1", "passive", "t"), aux_labels_per_class=per_class
        )
        granted[per_class] = threat_model_knowledge(cfg, "passive-1", attack)["aux_labels"]
    assert set(granted[1].items()) < set(granted[3].items())  # more labels add to the fewer ones
    for known in granted.values():
        assert set(known) <= set(train.tolist()) and all(label_of[i] == y for i, y in known.items())
    assert sorted(granted[3].values()) == sorted(list(range(10)) * 3)
    direction = ATTACKS.get("direction-scoring")(AttackContext("passive-1", "passive", "t"))
    with pytest.raises(ValueError, match="binary"):  # digits has 10 classes: refused before the run starts
        threat_model_knowledge(cfg, "passive-1", direction)


@pytest.mark.e2e
@pytest.mark.slow
def test_passive_model_completion_beats_chance_and_improves_with_more_labels(tmp_path):
    # The active party holds the left half of each digit; passive-1 and passive-2 both hold the right half
    # and differ only in how many labelled samples per class their model completion is given.
    data = base_config(n_passive=2, aggregation="sum", active_features=True)
    data["parties"][1]["features"] = {"region": [0, 8, 0, 4]}
    data["parties"][3]["features"] = data["parties"][2]["features"] = {"region": [0, 8, 4, 8]}
    data["data"]["allow_overlap"] = True  # on purpose (config check refuses an overlap otherwise)
    data["train"].update(epochs=1, batch_size=32)
    data["attacks"] = [
        {"name": "passive-model-completion", "party": "passive-1", "params": {"aux_labels_per_class": 1}},
        {"name": "passive-model-completion", "party": "passive-2", "params": {"aux_labels_per_class": 8}},
    ]
    path = write_config(tmp_path, data)
    assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0
    scores = json.loads((tmp_path / "run/attacks/scores.json").read_text())
    one, eight = scores["passive-model-completion@passive-1"], scores["passive-model-completion@passive-2"]
    assert one["aux_samples"] == 10 and eight["aux_samples"] == 80
    assert one["samples"] + 10 == eight["samples"] + 80  # every other training sample is labelled
    # chance is 0.1. Measured with one label per class: 0.53 here, 0.53 / 0.43 in the docs' setting (seeds 0 / 1);
    # paper 004 Table 2 (CIFAR-10): 0.62.
    assert one["label_accuracy"] >= 0.35, one
    assert eight["label_accuracy"] >= one["label_accuracy"] + 0.1, (one, eight)  # measured +0.15
