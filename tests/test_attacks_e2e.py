"""Attacks as interceptors in real runs: online vs offline, split vs split-he, a rewrite that
changes training, and an attack that cannot reach what its role does not see."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import yaml

from tests.conftest import base_config, write_config
from vflnet.data.partition import party_view
from vflnet.interceptors.trace import read_trace
from vflnet.models.zoo import build_party_modules
from vflnet.registry import ATTACKS
from vflnet.runner.local import run_local
from vflnet.threat.attack import AttackContext
from vflnet.validation import config_from_dict

# A CLI command on a loaded machine: most of it is importing torch. Only a hang runs into it.
CLI_TIMEOUT_S = 300


def _label_leak(repo, **train):
    data = yaml.safe_load((repo / "configs/label-leak.yaml").read_text())
    data["train"].update(epochs=1, **train)
    return data


def _scores(run_dir):
    return json.loads((run_dir / "attacks/scores.json").read_text())


@pytest.mark.e2e
@pytest.mark.slow
def test_direct_label_inference_online_offline_and_trace_cli(tmp_path, repo):
    data = _label_leak(repo, max_steps=12)
    path = write_config(tmp_path, data)
    run_dir = tmp_path / "run"
    assert run_local(path, run_dir=run_dir, progress=False) == 0
    score = _scores(run_dir)["direct-label-inference@passive-1"]
    assert (
        score["label_accuracy"] == 1.0 and score["samples"] == 12 * 32 and score["informed_fraction"] == 1.0
    )
    assert (run_dir / "attacks/direct-label-inference-confusion.png").exists()

    # offline over the recorded trace gives the same output as online
    online = dict(np.load(run_dir / "attacks/direct-label-inference@passive-1.npz"))
    events = list(read_trace(run_dir / "traces/passive-1.trace"))
    offline = ATTACKS.get("direct-label-inference")(AttackContext("passive-1", "passive", "x")).run(events)
    assert online.keys() == offline.keys()
    for key in online:
        np.testing.assert_array_equal(online[key], offline[key])
    # the recorder at the active party saw every passive party's embeddings, with their sample ids
    rec = np.load(run_dir / "attacks/embedding-recorder@active.npz")
    assert rec["passive-2/embeddings"].shape == (12 * 32, 10) and len(rec["passive-1/sample_ids"]) == 12 * 32

    cli = [sys.executable, "-m", "vflnet"]
    out = subprocess.run(
        [*cli, "trace", "ls", str(run_dir)], capture_output=True, text=True, cwd=repo, timeout=CLI_TIMEOUT_S
    )
    assert out.returncode == 0 and "passive-1" in out.stdout
    out = subprocess.run(
        [
            *cli,
            "trace",
            "show",
            str(run_dir / "traces/passive-1.trace"),
            "--method",
            "ExchangeEmbeddings",
            "--direction",
            "response",
            "--limit",
            "3",
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=CLI_TIMEOUT_S,
    )
    assert out.returncode == 0 and out.stdout.count("ExchangeEmbeddings") >= 3
    npz = tmp_path / "trace.npz"
    out = subprocess.run(
        [*cli, "trace", "export", str(run_dir / "traces/passive-1.trace"), "--out", str(npz)],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=CLI_TIMEOUT_S,
    )
    assert out.returncode == 0 and npz.exists(), out.stderr
    out = subprocess.run(
        [
            *cli,
            "attack",
            "direct-label-inference",
            "--trace",
            str(run_dir / "traces/passive-1.trace"),
            "--config",
            str(path),
        ],
        capture_output=True,
        text=True,
        cwd=repo,
        timeout=CLI_TIMEOUT_S,
    )
    assert out.returncode == 0 and "score label_accuracy: 1.0" in out.stdout, out.stdout + out.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_direct_label_inference_is_chance_under_split_he(tmp_path, repo):
    data = _label_leak(repo, max_steps=3, batch_size=16)
    data["protocol"] = {
        "kind": "split-he",
        "aggregation": "sum",
        "params": {"key_bits": 512, "allow_insecure_keys": True},
    }
    for p in data["parties"][2:]:
        p["bottom"]["hidden"] = [8]
    path = write_config(tmp_path, data)
    assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0
    score = _scores(tmp_path / "run")["direct-label-inference@passive-1"]
    assert score["informed_fraction"] == 0.0  # every per-sample gradient it saw was a ciphertext
    assert score["label_accuracy"] < 0.3  # chance is 0.1; 48 guesses


@pytest.mark.e2e
@pytest.mark.slow
def test_rewrite_changes_training_as_expected(tmp_path, repo):
    data = _label_leak(repo, max_steps=5)
    data["attacks"] = [{"name": "gradient-scaling", "party": "passive-1", "params": {"gamma": 0.0}}]
    data["trace"] = {"parties": []}
    path = write_config(tmp_path, data)
    assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0
    cfg = config_from_dict(data)
    for name, frozen in (("passive-1", True), ("passive-2", False)):
        view = party_view(cfg, name)
        initial, _ = build_party_modules(cfg, cfg.party(name), tuple(view.x.shape[1:]), view.n_classes)
        trained = torch.load(tmp_path / "run/checkpoints" / f"{name}.pt")["modules"]["bottom"]
        same = all(torch.equal(trained[k], v) for k, v in initial.state_dict().items())
        assert same == frozen, name  # gamma = 0: the attacker's own model never moves; the other party's does
    assert int(np.load(tmp_path / "run/attacks/gradient-scaling@passive-1.npz")["rewritten_messages"]) == 5


@pytest.mark.e2e
@pytest.mark.slow
def test_planted_attack_cannot_reach_ground_truth_or_other_parties(tmp_path, repo):
    data = _label_leak(repo, max_steps=3)
    data["plugins"] = ["tests.plugins.snoop"]
    data["attacks"] = [{"name": "snoop", "party": "passive-1"}]
    data["trace"] = {"parties": []}
    path = write_config(tmp_path, data)
    assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0
    found = dict(np.load(tmp_path / "run/attacks/snoop@passive-1.npz"))
    assert found["senders"].tolist() == ["active"]  # it sees only its own wire
    for key in ("context_has_labels", "active_party_object", "dataset_object", "label_like_array"):
        assert not bool(found[key]), key


def test_config_check_rejects_unknown_attacks_and_bad_params(tmp_path, repo):
    from vflnet.config import ConfigError

    for attack, key, text in [
        ({"name": "mind-reader", "party": "passive-1"}, "attacks[0].name", "unknown attack"),
        ({"name": "direct-label-inference", "party": "active"}, "attacks[0].party", "sits at ['passive']"),
        (
            {"name": "gradient-scaling", "party": "passive-1", "params": {"gama": 2}},
            "attacks[0].params",
            "no parameter",
        ),
        (
            {"name": "gradient-scaling", "party": "passive-1", "params": {"gamma": "big"}},
            "attacks[0].params.gamma",
            "expected a number",
        ),
    ]:
        data = _label_leak(repo)
        data["attacks"] = [attack]
        with pytest.raises(ConfigError) as info:
            config_from_dict(data, "x.yaml")
        assert info.value.key == key and text in info.value.message
    # Lemma 1 needs summed logits: with a top model over concatenated embeddings the attack used to
    # run and crash when its "labels" (embedding indices) were drawn as a confusion matrix
    data = base_config(aggregation="concat")
    data["attacks"] = [{"name": "direct-label-inference", "party": "passive-1"}]
    with pytest.raises(ConfigError) as info:
        config_from_dict(data, "x.yaml")
    assert info.value.key == "protocol.aggregation" and "Lemma 1" in info.value.message


@pytest.mark.e2e
@pytest.mark.slow
def test_proxy_in_the_path_gives_identical_training(tmp_path, repo):
    data = _label_leak(repo, max_steps=8)
    data["attacks"], data["trace"] = [], {"parties": []}
    direct = write_config(tmp_path, data, "direct.yaml")
    data["parties"][1]["via"] = "proxy"  # every call to the active party goes through a proxy process
    proxied = write_config(tmp_path, data, "proxied.yaml")
    assert run_local(direct, run_dir=tmp_path / "direct", progress=False) == 0
    assert run_local(proxied, run_dir=tmp_path / "proxied", progress=False) == 0
    for party in ("active", "passive-1", "passive-2"):
        a = torch.load(tmp_path / "direct/checkpoints" / f"{party}.pt")["modules"]
        b = torch.load(tmp_path / "proxied/checkpoints" / f"{party}.pt")["modules"]
        for module in a:
            for key in a[module]:
                assert torch.equal(a[module][key], b[module][key]), (party, module, key)
    events = list(read_trace(tmp_path / "proxied/traces/proxy-active.trace"))
    seen = {(e.short_method, e.direction) for e in events}
    assert ("ExchangeEmbeddings", "request") in seen and ("RunStep", "request") in seen
    embeddings = [e for e in events if e.short_method == "ExchangeEmbeddings" and e.direction == "request"]
    assert embeddings[0].tensors()["values"].shape == (32, 10)  # plaintext: the proxy reads everything
