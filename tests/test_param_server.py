"""param-server (paper 002's setting): the coordinator holds the parameters and the optimizer."""

from __future__ import annotations

import json

import pytest
import torch

from tests.conftest import base_config, write_config
from vflnet.data.partition import party_view
from vflnet.models.zoo import build_party_modules
from vflnet.runner.local import run_local
from vflnet.runner.reference import train_reference
from vflnet.validation import config_from_dict

pytestmark = pytest.mark.e2e


def _server_params(run_dir):
    return torch.load(run_dir / "checkpoints/param-server.pt")


@pytest.mark.parametrize("static", [pytest.param(False, marks=pytest.mark.slow), True])
def test_param_server_matches_split_training_or_stays_static(tmp_path, static):
    data = base_config(n_passive=2, active_features=True)
    data["protocol"] = {"kind": "param-server", "aggregation": "concat", "params": {"static": static}}
    data["train"].update(
        max_steps=6,
        optimizer={"kind": "adam", "lr": 0.01},
        lr_schedule={"kind": "step", "step_size": 1, "gamma": 0.5},
    )
    path = write_config(tmp_path, data)
    assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0
    held = _server_params(tmp_path / "run")
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["param_server"] == {"updates": 0 if static else 6, "static": static}

    plain = dict(data, protocol={"kind": "split", "aggregation": "concat"})
    if static:  # the parameters the coordinator holds at the end are the initial ones
        cfg = config_from_dict(plain)
        expected_states = {}
        for party in ("active", "passive-1", "passive-2"):
            view = party_view(cfg, party)
            bottom, top = build_party_modules(cfg, cfg.party(party), tuple(view.x.shape[1:]), view.n_classes)
            expected_states[party] = {
                k: m.state_dict() for k, m in (("bottom", bottom), ("top", top)) if m is not None
            }
    else:
        expected_states = train_reference(config_from_dict(plain), evaluate=False).states
    worst = 0.0
    for party, modules in expected_states.items():
        for module, state in modules.items():
            for name, expected in state.items():
                got = held[party][f"{module}.{name}"]
                worst = max(worst, (got - expected).abs().max().item())
    assert worst <= (0.0 if static else 1e-5), worst
