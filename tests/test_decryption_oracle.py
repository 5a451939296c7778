"""The residual trust assumption of split-he's decryption service, as an attack in a real run: a
malicious passive party reads every label of its batches through its own masked-gradient request,
and its training (and so the whole run) is unchanged by it."""

from __future__ import annotations

import json

import torch
import yaml

from tests.conftest import write_config
from tests.test_chunking import _parameters
from vflnet.runner.local import run_local


def test_a_malicious_passive_party_reads_every_label_and_changes_nothing_else(tmp_path, repo):
    data = yaml.safe_load((repo / "configs/label-leak.yaml").read_text())
    data["protocol"] = {
        "kind": "split-he",
        "aggregation": "sum",
        "params": {"key_bits": 512, "allow_insecure_keys": True},
    }
    data["train"].update(epochs=1, max_steps=3, batch_size=32)
    data["transport"] = {"bridge": "loopback"}
    data["trace"] = {"parties": []}
    runs = {}
    for attacked in (False, True):
        data["attacks"] = [{"name": "decryption-oracle", "party": "passive-1"}] if attacked else []
        runs[attacked] = tmp_path / f"run-{attacked}"
        path = write_config(tmp_path, data, f"{attacked}.yaml")
        assert run_local(path, run_dir=runs[attacked], progress=False) == 0
    scores = json.loads((runs[True] / "attacks/scores.json").read_text())["decryption-oracle@passive-1"]
    assert scores["samples"] == 96 and scores["label_accuracy"] == 1.0
    plain, attacked = _parameters(runs[False]), _parameters(runs[True])
    assert plain.keys() == attacked.keys() and all(torch.equal(plain[k], attacked[k]) for k in plain)
    # the coordinator decrypted more than the protocol's values for passive-1, and could not tell
    decrypted = [
        json.loads((runs[a] / "summary.json").read_text())["decryptions"]["values"] for a in (False, True)
    ]
    assert decrypted[True]["passive-1/masked_gradient"] > decrypted[False]["passive-1/masked_gradient"]
    assert decrypted[True]["passive-2/masked_gradient"] == decrypted[False]["passive-2/masked_gradient"]
