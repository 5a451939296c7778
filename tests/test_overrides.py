"""`KEY=VALUE` overrides on the command line: typed and checked like the file, errors naming the
command line, recorded in the run's resolved config; the same for sweeps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, base_config, write_config
from vflnet.config import ConfigError
from vflnet.tools.experiments.plan import load_sweep
from vflnet.validation import load_config

DIGITS = REPO / "configs" / "digits-2p.yaml"


def test_overrides_set_typed_values_with_either_list_index() -> None:
    cfg = load_config(
        DIGITS,
        overrides=[
            "train.epochs=3",
            "parties.2.bottom.hidden=[32, 16]",
            "parties[3].bottom.out=8",
            "train.optimizer.lr=0.01",
            "transport.bridge=loopback",
        ],
    )
    assert cfg.train.epochs == 3 and isinstance(cfg.train.epochs, int)
    assert cfg.parties[2].bottom is not None and cfg.parties[2].bottom.hidden == [32, 16]
    assert cfg.parties[3].bottom is not None and cfg.parties[3].bottom.out == 8
    assert cfg.train.optimizer.lr == 0.01 and cfg.transport.bridge == "loopback"
    assert load_config(DIGITS).train.epochs == 10  # the file itself is untouched


@pytest.mark.parametrize(
    "override, key, text",
    [
        ("train.epochz=3", "train.epochz", "unknown key; allowed here: batch_size"),
        ("train.epochs=abc", "train.epochs", "expected an integer, got 'abc'"),
        ("train.epochs=-1", "train.epochs", "expected a positive value"),
        ("parties.2.bottom.hidden=32", "parties[2].bottom.hidden", "expected a list of an integer, got 32"),
        ("parties.2.bottom.hidden=[x]", "parties[2].bottom.hidden[0]", "expected an integer, got 'x'"),
        ("parties.9.bottom.out=3", "parties[9].bottom.out", "index [9] does not exist"),
        ("protocol.aggregation=mean", "protocol.aggregation", "expected one of 'concat', 'sum'"),
    ],
)
def test_a_bad_override_is_refused_naming_the_command_line(override: str, key: str, text: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(DIGITS, overrides=["train.batch_size=32", override])
    assert err.value.source == f"command line ({override})"
    assert err.value.key == key and text in err.value.message


def test_malformed_overrides_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"command line: 'train\.epochs' is not KEY=VALUE"):
        load_config(DIGITS, overrides=["train.epochs"])
    with pytest.raises(ConfigError, match=r"command line: key '3x': '3x' is not a key path"):
        load_config(DIGITS, overrides=["3x=1"])


def test_an_error_of_the_file_still_names_the_file(tmp_path: Path) -> None:
    data = base_config()
    data["train"]["batch_size"] = "many"
    path = write_config(tmp_path, data)
    with pytest.raises(ConfigError) as err:
        load_config(path, overrides=["train.epochs=2"])
    assert err.value.source == str(path) and err.value.key == "train.batch_size"


def test_an_error_above_an_override_names_the_file_and_the_override() -> None:
    with pytest.raises(ConfigError) as err:
        load_config(DIGITS, overrides=["data.params.colour=red"])
    assert err.value.source == f"{DIGITS} with command line data.params.colour=red"
    assert err.value.key == "data.params" and "colour" in err.value.message


def _sweep(tmp_path: Path) -> Path:
    write_config(tmp_path, base_config(), "base.yaml")
    path = tmp_path / "sweep.yaml"
    body = {"base": "base.yaml", "seeds": [0, 1], "grid": {"train.batch_size": [32, 64]}}
    path.write_text(yaml.safe_dump(body))
    return path


def test_sweep_overrides_change_every_run_and_refuse_swept_keys(tmp_path: Path) -> None:
    path = _sweep(tmp_path)
    plain = load_sweep(path)
    sweep = load_sweep(path, ["train.epochs=2", "parties.2.bottom.hidden=[8]"])
    assert len(sweep.runs) == 4 and sweep.overrides == ["train.epochs=2", "parties.2.bottom.hidden=[8]"]
    for run in sweep.runs:
        assert run.config["train"]["epochs"] == 2 and run.config["parties"][2]["bottom"]["hidden"] == [8]
    # another config, so other run names: a sweep folder never mixes the two
    assert not {r.name for r in sweep.runs} & {r.name for r in plain.runs}
    for override, section in (("train.batch_size=16", "grid"), ("run.seed=4", "seeds")):
        with pytest.raises(ConfigError) as err:
            load_sweep(path, [override])
        assert err.value.source == f"command line ({override})" and f"'{section}'" in err.value.message
    with pytest.raises(ConfigError) as err:
        load_sweep(path, ["train.epochs=0"])
    assert err.value.source == "command line (train.epochs=0)" and err.value.key == "train.epochs"


@pytest.mark.e2e
def test_cli_overrides_reach_the_resolved_config_and_errors_exit_2(tmp_path: Path) -> None:
    vflnet = [sys.executable, "-m", "vflnet"]
    bad = subprocess.run(
        [*vflnet, "config", "check", str(DIGITS), "train.epochz=1"], capture_output=True, text=True
    )
    assert bad.returncode == 2
    assert "command line (train.epochz=1): key 'train.epochz': unknown key" in bad.stderr
    run_dir = tmp_path / "run"
    ok = subprocess.run(
        [*vflnet, "run", str(DIGITS), "--no-progress", "--run-dir", str(run_dir)]
        + ["train.epochs=1", "transport.bridge=loopback", "parties.2.bottom.hidden=[8]"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    resolved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert resolved["train"]["epochs"] == 1 and resolved["transport"]["bridge"] == "loopback"
    assert resolved["parties"][2]["bottom"]["hidden"] == [8]
    assert resolved["parties"][3]["bottom"]["hidden"] == [64]  # what the file says
