"""CAFE as the coordinator's tap in real param-server runs, and the fake-gradients defense."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.conftest import write_config
from vflnet.runner.local import run_local

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _run(tmp_path, repo, name, **changes):
    data = yaml.safe_load((repo / "configs/cafe-digits.yaml").read_text())
    data["train"].update(changes.pop("train", {}))
    data.update(changes)
    path = write_config(tmp_path, data, f"{name}.yaml")
    assert run_local(path, run_dir=tmp_path / name, progress=False) == 0
    score = json.loads((tmp_path / name / "attacks/scores.json").read_text())["cafe@coordinator"]
    steps = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    losses = [s["loss"] for s in steps if s["kind"] == "step"]
    return score, losses


def test_cafe_recovers_every_training_image_from_a_static_param_server(tmp_path, repo):
    score, _ = _run(tmp_path, repo, "static", train={"epochs": 200})
    assert score["psnr"] >= 30 and score["label_accuracy"] == 1.0, score
    assert (tmp_path / "static/attacks/cafe-real-vs-recovered.png").exists()


def test_fake_gradients_defeat_cafe_while_training_still_learns(tmp_path, repo):
    defenses = [
        {"name": "fake-gradients", "party": p, "params": {"sigma2": 1e-4, "nu": 100}}
        for p in ("passive-1", "passive-2")
    ]
    # the attack's strongest setting, where the undefended run above recovers >= 30 dB
    score, _ = _run(tmp_path, repo, "static-defended", defenses=defenses, train={"epochs": 200})
    assert score["psnr"] < 12, score
    # and the model still learns from the fake uploads when the server does update
    protocol = {"kind": "param-server", "aggregation": "concat", "params": {"static": False}}
    train = {"epochs": 30, "optimizer": {"kind": "sgd", "lr": 0.1}}
    _, losses = _run(tmp_path, repo, "training-defended", defenses=defenses, protocol=protocol, train=train)
    windows = [sum(losses[i : i + 50]) / 50 for i in range(0, len(losses) - 49, 50)]
    # 2.30 -> ~1.2 over the first 250 steps here; with SGD lr 0.1 it turns unstable later
    # (docs/attacks.md shows both loss curves)
    assert min(windows) < 0.7 * windows[0], windows
