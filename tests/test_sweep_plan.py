"""Sweep files: expansion into runs (grid x zip x seeds), and one clear error per mistake."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import REPO, base_config, write_config
from vflnet.config import ConfigError
from vflnet.tools.experiments.plan import load_sweep


def sweep_file(tmp_path: Path, body: dict[str, Any]) -> Path:
    write_config(tmp_path, base_config(), "base.yaml")
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": "base.yaml", **body}, sort_keys=False))
    return path


def test_grid_zip_and_seeds_multiply(tmp_path: Path) -> None:
    path = sweep_file(
        tmp_path,
        {
            "name": "lr-bs",
            "seeds": [0, 1],
            "set": {"transport.bridge": "loopback"},
            "grid": {"train.batch_size": [32, 64], "train.optimizer.lr": [0.1, 0.01]},
            "zip": {
                "parties[2].bottom.hidden": [[8], [16], [24]],
                "parties[3].bottom.hidden": [[4], [5], [6]],
            },
        },
    )
    sweep = load_sweep(path)
    assert sweep.name == "lr-bs"
    assert sweep.keys == [
        "train.batch_size",
        "train.optimizer.lr",
        "parties[2].bottom.hidden",
        "parties[3].bottom.hidden",
    ]
    assert len(sweep.runs) == 2 * 2 * 3 * 2
    names = [r.name for r in sweep.runs]
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", n) for n in names)  # DNS labels
    for run in sweep.runs:
        cfg = run.config
        assert cfg["run"]["seed"] == run.seed and cfg["run"]["id"] == run.name
        assert cfg["transport"]["bridge"] == "loopback"
        assert cfg["train"]["batch_size"] == run.params["train.batch_size"]
        assert cfg["train"]["optimizer"]["lr"] == run.params["train.optimizer.lr"]
        # zipped: walked together
        hidden2, hidden3 = cfg["parties"][2]["bottom"]["hidden"], cfg["parties"][3]["bottom"]["hidden"]
        assert hidden3[0] == {8: 4, 16: 5, 24: 6}[hidden2[0]]
    combos = {(r.params["train.batch_size"], r.params["train.optimizer.lr"], r.seed) for r in sweep.runs}
    assert len(combos) == 8


def test_names_are_stable_and_follow_the_config(tmp_path: Path) -> None:
    body = {"grid": {"train.batch_size": [32, 64]}}
    first = [r.name for r in load_sweep(sweep_file(tmp_path, body)).runs]
    assert first == [r.name for r in load_sweep(sweep_file(tmp_path, body)).runs]
    body = {"grid": {"train.batch_size": [32, 65]}}
    second = [r.name for r in load_sweep(sweep_file(tmp_path, body)).runs]
    assert second[0] == first[0] and second[1] != first[1]


def test_seeds_default_to_the_base_seed(tmp_path: Path) -> None:
    sweep = load_sweep(sweep_file(tmp_path, {"grid": {"train.epochs": [1, 2]}}))
    assert [r.seed for r in sweep.runs] == [3, 3]


@pytest.mark.parametrize(
    ("body", "key", "message"),
    [
        ({"grids": {"train.epochs": [1]}}, "grids", "unknown key"),
        ({"grid": {"train.epochs": 2}}, "grid.train.epochs", "non-empty list"),
        ({"grid": {"train.epochs": []}}, "grid.train.epochs", "non-empty list"),
        ({"zip": {"train.epochs": [1, 2], "train.batch_size": [8]}}, "zip", "same length"),
        ({"grid": {"parties[9].bottom.out": [4]}}, "grid.parties[9].bottom.out", "index [9] does not exist"),
        ({"grid": {"train..epochs": [1]}}, "grid.train..epochs", "not a key path"),
        ({"grid": {"train.epochs.x": [1]}}, "grid.train.epochs.x", "not a mapping"),
        ({"seeds": [0, "one"]}, "seeds", "integers"),
        ({"set": {"train.epochs": 1}, "grid": {"train.epochs": [1]}}, "train.epochs", "only one of"),
    ],
)
def test_a_wrong_sweep_key_names_file_and_key(
    tmp_path: Path, body: dict[str, Any], key: str, message: str
) -> None:
    path = sweep_file(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert err.value.source == str(path) and err.value.key == key
    assert message in err.value.message


def test_a_wrong_config_key_names_the_sweep_file_and_the_key(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, {"grid": {"train.batchsize": [32, 64]}})
    with pytest.raises(ConfigError, match="unknown key") as err:
        load_sweep(path)
    assert err.value.key == "train.batchsize"
    assert str(path) in str(err.value) and "train.batchsize=32" in str(err.value)


def test_a_bad_value_is_reported_by_the_run_config_check(tmp_path: Path) -> None:
    path = sweep_file(tmp_path, {"grid": {"protocol.aggregation": ["concat", "mean"]}})
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert err.value.key == "protocol.aggregation" and "protocol.aggregation=mean" in str(err.value)


def test_a_missing_base_is_reported(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": "nope.yaml", "grid": {"train.epochs": [1]}}))
    with pytest.raises(ConfigError, match="no such run config") as err:
        load_sweep(path)
    assert err.value.key == "base"


def test_an_inline_base(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({"base": base_config(), "seeds": [5, 6]}))
    assert [r.seed for r in load_sweep(path).runs] == [5, 6]


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "sweeps").glob("*.yaml")), ids=lambda p: p.name)
def test_the_example_sweeps_load(path: Path) -> None:
    sweep = load_sweep(path)
    assert sweep.runs and sweep.keys
