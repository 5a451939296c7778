"""Shared helpers: small configs written to a temp folder, and a launcher for real clusters."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def base_config(
    n_passive: int = 2, aggregation: str = "concat", active_features: bool = False
) -> dict[str, Any]:
    """Digits, each passive party holding a vertical strip of the 8x8 image."""
    width = 8 // (n_passive + (1 if active_features else 0))
    strips = [[0, 8, i * width, (i + 1) * width] for i in range(n_passive + (1 if active_features else 0))]
    out = 10 if aggregation == "sum" else 16
    active: dict[str, Any] = {"name": "active", "role": "active"}
    if active_features:
        active.update(features={"region": strips.pop(0)}, bottom={"kind": "mlp", "hidden": [32], "out": out})
    parties = [{"name": "coordinator", "role": "coordinator"}, active]
    for i, strip in enumerate(strips):
        parties.append(
            {
                "name": f"passive-{i + 1}",
                "role": "passive",
                "features": {"region": strip},
                "bottom": {"kind": "mlp", "hidden": [32], "out": out},
            }
        )
    return {
        "run": {"seed": 3},
        "protocol": {"kind": "split", "aggregation": aggregation},
        "data": {"dataset": "digits", "test_fraction": 0.2},
        "parties": parties,
        "model": {"top": {"kind": "none"} if aggregation == "sum" else {"kind": "mlp", "hidden": [32]}},
        "train": {"epochs": 1, "batch_size": 64, "optimizer": {"kind": "adam", "lr": 0.01}},
        "transport": {"rpc_timeout_s": 30, "join_timeout_s": 90},
    }


def write_config(tmp_path: Path, data: dict[str, Any], name: str = "run.yaml") -> Path:
    data = copy.deepcopy(data)
    data.setdefault("run", {}).setdefault("dir", str(tmp_path / "runs"))
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture
def repo() -> Path:
    return REPO
