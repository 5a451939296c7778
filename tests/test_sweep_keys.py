"""Sweep keys are compared as paths, in the order they are set (command line, set, grid, zip, seeds):
nothing a sweep sets is replaced in every run, whichever spelling a key has, and no config runs twice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.test_sweep_plan import sweep_file
from vflnet.config import ConfigError
from vflnet.overrides import parse_overrides
from vflnet.tools.experiments.plan import load_sweep

ADAM = {"kind": "adam", "lr": 0.01}


@pytest.mark.parametrize(
    ("body", "key", "message"),
    [
        (  # one key in both spellings, in two sections and in one
            {"grid": {"parties[2].bottom.out": [4, 8]}, "zip": {"parties.2.bottom.out": [4, 8]}},
            "parties[2].bottom.out",
            "zip 'parties.2.bottom.out' replaces grid 'parties[2].bottom.out' in every run",
        ),
        (
            {"set": {"parties.2.bottom.out": 4}, "grid": {"parties[2].bottom.out": [4, 8]}},
            "parties[2].bottom.out",
            "grid 'parties[2].bottom.out' replaces set 'parties.2.bottom.out'",
        ),
        (
            {"grid": {"parties[3].bottom.out": [4, 8], "parties.3.bottom.out": [5, 6]}},
            "parties[3].bottom.out",
            "grid 'parties.3.bottom.out' replaces grid 'parties[3].bottom.out'",
        ),
        (  # a zip of mappings after a grid over one of their fields
            {
                "grid": {"train.optimizer.lr": [0.1, 0.01]},
                "zip": {"train.optimizer": [ADAM, {"kind": "sgd", "lr": 0.1}]},
            },
            "train.optimizer.lr",
            "zip 'train.optimizer' replaces grid 'train.optimizer.lr' in every run",
        ),
        (  # a grid of mappings that hold the field a zip varies
            {"grid": {"train.optimizer": [ADAM, {"kind": "sgd"}]}, "zip": {"train.optimizer.lr": [0.1, 0.2]}},
            "train.optimizer",
            "zip 'train.optimizer.lr' replaces the train.optimizer.lr that grid 'train.optimizer' sets",
        ),
        (  # a set value holding what a grid varies: its value never reaches a run
            {
                "set": {"defenses": [{"name": "dp-gaussian", "party": "active", "params": {"scale": 1.0}}]},
                "grid": {"defenses.0.params.scale": [0.1, 1.0]},
            },
            "defenses",
            "grid 'defenses.0.params.scale' replaces the defenses[0].params.scale that set 'defenses' sets",
        ),
        ({"set": {"run": {"seed": 5}}, "seeds": [0, 1]}, "run", "seeds 'run.seed' replaces"),
    ],
)
def test_a_key_the_sweep_replaces_is_refused_in_either_spelling(
    tmp_path: Path, body: dict[str, Any], key: str, message: str
) -> None:
    path = sweep_file(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert err.value.source == str(path) and err.value.key == key
    assert message in err.value.message


def test_a_key_under_a_value_that_lacks_it_adds_to_it(tmp_path: Path) -> None:
    """`set` builds a list entry whose field a grid varies; a grid over optimizer kinds whose mappings
    leave out the rate a zip varies: every value reaches its runs."""
    path = sweep_file(
        tmp_path,
        {
            "set": {"defenses": [{"name": "dp-gaussian", "party": "active"}]},
            "grid": {
                "defenses[0].params.scale": [0.1, 1.0],
                "train.optimizer": [{"kind": "adam"}, {"kind": "sgd"}],
            },
            "zip": {"train.optimizer.lr": [0.1, 0.2]},
        },
    )
    runs = load_sweep(path).runs
    assert len(runs) == 8
    seen = {
        (
            r.config["defenses"][0]["params"]["scale"],
            r.config["train"]["optimizer"]["kind"],
            r.config["train"]["optimizer"]["lr"],
        )
        for r in runs
    }
    assert len(seen) == 8


def test_an_override_the_sweep_replaces_is_refused_in_either_spelling(tmp_path: Path) -> None:
    path = sweep_file(
        tmp_path,
        {"set": {"parties[2].bottom": {"kind": "mlp", "out": 8}}, "grid": {"train.optimizer.lr": [0.1, 0.2]}},
    )
    for override, section, swept in (
        ("parties.2.bottom.out=4", "set", "parties[2].bottom"),  # under a key the sweep sets
        ("parties[2].bottom={kind: mlp}", "set", "parties[2].bottom"),  # the same key
        ("train.optimizer={kind: sgd, lr: 0.5}", "grid", "train.optimizer.lr"),  # above, holding it
    ):
        with pytest.raises(ConfigError) as err:
            load_sweep(path, [override])
        assert err.value.source == f"command line ({override})", override
        assert f"the sweep file's {section!r} sets {swept!r} in every run" in err.value.message
    # above a swept key, without a value there: the override reaches every run, beside the swept rate
    runs = load_sweep(path, ["train.optimizer={kind: sgd}"]).runs
    assert {(r.config["train"]["optimizer"]["kind"], r.config["train"]["optimizer"]["lr"]) for r in runs} == {
        ("sgd", 0.1),
        ("sgd", 0.2),
    }


@pytest.mark.parametrize(
    ("overrides", "replaced"),
    [
        (["train.epochs=1", "train.epochs=2"], "train.epochs=1"),
        (["parties[2].bottom.out=4", "parties.2.bottom={kind: mlp}"], "parties[2].bottom.out=4"),
    ],
)
def test_an_override_a_later_one_replaces_is_refused(overrides: list[str], replaced: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_overrides(overrides)
    assert (
        err.value.source == f"command line ({replaced})"
        and f"{overrides[1]} replaces it" in err.value.message
    )
    assert (
        len(parse_overrides(["parties.2.bottom={kind: mlp}", "parties[2].bottom.out=4"])) == 2
    )  # refines it


@pytest.mark.parametrize(
    ("body", "key", "message"),
    [
        ({"grid": {"train.batch_size": [32, 64, 32]}}, "grid.train.batch_size", "lists the value 32 twice"),
        ({"zip": {"train.batch_size": [32, 32], "train.epochs": [1, 1]}}, "zip", "lists the row"),
        ({"seeds": [0, 1, 0]}, "seeds", "lists the seed 0 twice"),
    ],
)
def test_a_repeated_value_is_refused(tmp_path: Path, body: dict[str, Any], key: str, message: str) -> None:
    path = sweep_file(tmp_path, body)
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert err.value.source == str(path) and err.value.key == key and message in err.value.message


def test_two_runs_with_one_resolved_config_are_refused_naming_both(tmp_path: Path) -> None:
    """Two values written differently that the run config check makes the same (a default spelled out)."""
    path = sweep_file(tmp_path, {"grid": {"train.optimizer": [ADAM, {**ADAM, "weight_decay": 0.0}]}})
    with pytest.raises(ConfigError) as err:
        load_sweep(path)
    assert err.value.source == str(path) and err.value.key == "train.optimizer"
    assert err.value.message.startswith("runs r000-") and " and r001-" in err.value.message
    assert (
        "'weight_decay': 0.0" in err.value.message and "resolve to the same run config" in err.value.message
    )
