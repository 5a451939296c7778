"""Paper 004's batch-level label inference at a passive party under split-he, in a real run:
the attacker has only its own rows, its own model and its decrypted batch-level gradient."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import write_config
from vflnet.runner.local import run_local

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_theorem1_is_exact_and_gradient_inversion_recovers_labels_under_split_he(tmp_path, repo):
    data = yaml.safe_load((repo / "configs/label-leak.yaml").read_text())
    data["protocol"] = {
        "kind": "split-he",
        "aggregation": "sum",
        "params": {"key_bits": 512, "allow_insecure_keys": True},
    }
    data["train"].update(
        epochs=1, max_steps=3, batch_size=32
    )  # B = 32 <= hidden width 32: Theorem 1 is exact
    data["attacks"] = [
        {"name": "analytic-label-recovery", "party": "passive-1"},
        {"name": "gradient-inversion-label-inference", "party": "passive-1", "params": {"iterations": 1500}},
        {"name": "direct-label-inference", "party": "passive-1"},
    ]
    data["trace"] = {"parties": []}
    path = write_config(tmp_path, data)
    assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0
    scores = json.loads((tmp_path / "run/attacks/scores.json").read_text())
    analytic = scores["analytic-label-recovery@passive-1"]
    inversion = scores["gradient-inversion-label-inference@passive-1"]
    assert analytic["samples"] == 96 and analytic["label_accuracy"] == 1.0
    assert inversion["samples"] == 96 and inversion["label_accuracy"] >= 0.9
    assert (
        scores["direct-label-inference@passive-1"]["informed_fraction"] == 0.0
    )  # no per-sample gradient seen
