"""Degenerate runs are refused before training, with their cause and the keys that decide it: at
config check where the dataset shows what the parties hold (vflnet/data/plan.py), otherwise at
admission, where every party of the run is told; the launcher names the failed party and the cause
from its log; a user error is one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, write_config

from vflnet.cli import main as vflnet_main
from vflnet.config import ConfigError
from vflnet.runner.local import cause_in_log, free_port, run_local
from vflnet.validation import load_config


def _wine(tmp_path: Path) -> Path:
    return write_config(
        tmp_path,
        {
            "run": {"id": "wine", "seed": 0},
            "protocol": {"kind": "split", "aggregation": "concat"},
            "data": {"dataset": "wine", "test_fraction": 0.2},
            "parties": [
                {"name": "coordinator", "role": "coordinator"},
                {"name": "active", "role": "active"},
                {
                    "name": "passive-1",
                    "role": "passive",
                    "features": {"columns": "0:6"},
                    "bottom": {"kind": "mlp", "hidden": [8], "out": 4},
                },
                {
                    "name": "passive-2",
                    "role": "passive",
                    "features": {"columns": "6:13"},
                    "bottom": {"kind": "mlp", "hidden": [8], "out": 4},
                },
            ],
            "model": {"top": {"kind": "mlp", "hidden": [8]}},
            "train": {"epochs": 1, "batch_size": 32, "optimizer": {"kind": "adam", "lr": 0.01}},
        },
        "wine.yaml",
    )


# each degenerate fact of wine's plan (178 samples), the key named first, the others that decide it
CASES = {
    "zero training steps": (
        ["train.batch_size=500", "train.drop_last=true"],
        "train.batch_size",
        "0 training steps: train.batch_size 500 is larger than the 142 training samples and "
        "train.drop_last is true",
        ("train.drop_last",),
    ),
    "no training samples": (
        ["data.test_fraction=0.999"],
        "data.test_fraction",
        "0 training steps: 178 common samples split by data.test_fraction 0.999 into 0 for training",
        ("data.dataset",),
    ),
    "empty test split": (
        ["data.test_fraction=0.001"],
        "data.test_fraction",
        "an empty test split: 178 common samples split by data.test_fraction 0.001 into 178 for "
        "training and 0 for testing",
        ("data.dataset",),
    ),
    # 3 of 178 rows at the active party, seed 7: 2 for training, both of class 2
    "one class in the training labels": (
        ["parties[1].sample_fraction=0.017", "run.seed=7"],
        "parties[1].sample_fraction",
        "the 2 training labels hold one class only (class 2)",
        ("data.dataset",),
    ),
    "no common sample ids": (
        ["parties[2].sample_fraction=0.01", "parties[3].sample_fraction=0.01"],
        "parties[2].sample_fraction",
        "no sample id is common to all parties (active holds 178, passive-1 holds 2, passive-2 holds 2)",
        ("parties[3].sample_fraction", "data.dataset"),
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_config_check_refuses_each_degenerate_plan_naming_its_keys(tmp_path, case, capsys):
    overrides, key, message, others = CASES[case]
    path = _wine(tmp_path)
    load_config(path)  # the same config without the overrides trains
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides=overrides)
    assert caught.value.key == key
    assert "the run cannot train: " + message in caught.value.message
    assert all(other in caught.value.message.split("(set by ")[1] for other in others), caught.value.message
    # `vflnet config check`: exit 2, one line naming the key
    assert vflnet_main(["config", "check", str(path), *overrides]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"key '{key}'" in err and message in err, err


def _own_ids(tmp_path: Path, keep_class: int, missing_at: str = "") -> Path:
    """Digits-free and small: the `own-ids` dataset (tests/plugins/own_ids.py), whose IDs differ in
    passive-2's process only; the config check here sees one consistent dataset and passes."""
    data = {
        "run": {"id": f"own-ids-{keep_class}", "seed": 0},
        "plugins": ["tests.plugins.own_ids"],
        "protocol": {"kind": "split", "aggregation": "concat"},
        "data": {
            "dataset": "own-ids",
            "params": {"own_ids_at": "passive-2", "keep_class": keep_class, "missing_at": missing_at},
        },
        "parties": [
            {"name": "coordinator", "role": "coordinator"},
            {"name": "active", "role": "active"},
            *(
                {
                    "name": f"passive-{i + 1}",
                    "role": "passive",
                    "features": {"columns": cols},
                    "bottom": {"kind": "mlp", "hidden": [8], "out": 4},
                }
                for i, cols in enumerate(("0:3", "3:6"))
            ),
        ],
        "model": {"top": {"kind": "mlp", "hidden": [8]}},
        "train": {"epochs": 1, "batch_size": 16, "optimizer": {"kind": "adam", "lr": 0.01}},
    }
    return write_config(tmp_path, data)


def _failed_line(err: str) -> str:
    return next(line for line in err.splitlines() if " FAILED: " in line)


@pytest.mark.e2e
def test_no_common_ids_at_admission_fail_the_run_with_the_cause(tmp_path, capfd):
    """passive-2 holds other IDs than the config check could see: the coordinator, once the roster
    has joined, fails the run, and `vflnet run` ends at once with the cause (not after
    transport.join_timeout_s, 300 s here)."""
    path = _own_ids(tmp_path, keep_class=-1)
    load_config(path)  # passes: this process holds the same IDs as the others
    run_dir = tmp_path / "run"
    assert run_local(path, run_dir=run_dir, progress=False, start="cold") == 1
    failed = _failed_line(capfd.readouterr().err)
    cause = "cannot train: no sample id is common to all parties (active holds 120, passive-1 holds 120"
    assert cause in failed and "(set by data.dataset)" in failed, failed
    assert "join_timeout_s" not in failed, failed
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and cause in summary["error"], summary


@pytest.mark.e2e
def test_every_party_waiting_in_its_join_is_told_the_cause_at_once(tmp_path):
    """The same run, its processes started one by one (as compose and lab machines do): each party's
    Join, waiting for the rest of the roster or the last one, is refused with the cause, and every
    process exits at once (the Join window is 300 s here)."""
    path = _own_ids(tmp_path, keep_class=-1)
    run_dir, port = tmp_path / "run", free_port()
    env = dict(os.environ, VFLNET_QUIET="1", PYTHONPATH=str(REPO))

    def start(role: str, name: str, *where: str) -> subprocess.Popen[str]:
        cmd = [sys.executable, "-m", "vflnet", "party", "--config", str(path), "--run-dir", str(run_dir)]
        cmd += ["--role", role, "--name", name, *where]
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)

    procs = {"coordinator": start("coordinator", "coordinator", "--listen", f"127.0.0.1:{port}")}
    for role, name in (("active", "active"), ("passive", "passive-1"), ("passive", "passive-2")):
        where = ("--listen", "127.0.0.1:0", "--coordinator", f"127.0.0.1:{port}")
        procs[name] = start(role, name, *where)
    try:
        out = {name: p.communicate(timeout=600)[0] for name, p in procs.items()}
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    cause = (
        "the run failed at admission: run 'own-ids--1' cannot train: no sample id is common to all parties"
    )
    for name in ("active", "passive-1", "passive-2"):
        assert procs[name].returncode == 2, out[name]
        assert f"{name}: join refused by coordinator" in out[name] and cause in out[name], out[name]
    assert procs["coordinator"].returncode == 1, out["coordinator"]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "no sample id is common" in summary["error"], summary


@pytest.mark.e2e
def test_one_class_in_the_training_labels_is_refused_by_the_label_holder_naming_it(tmp_path, capfd):
    """passive-2 shares only class 0's IDs: the aligned training labels hold one class, which only the
    active party can see (the coordinator never sees labels); it refuses, and the launcher names it
    and the cause from its log."""
    path = _own_ids(tmp_path, keep_class=0)
    run_dir = tmp_path / "run"
    assert run_local(path, run_dir=run_dir, progress=False, start="cold") == 1
    failed = _failed_line(capfd.readouterr().err)
    assert "active party 'active'" in failed and "exited with code 2" in failed, failed
    assert "cannot train: the 32 training labels hold one class only (class 0)" in failed, failed
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["error"].startswith("active party 'active'") and "one class only" in summary["error"]


@pytest.mark.e2e
def test_a_party_that_fails_before_joining_is_named_with_the_cause_from_its_log(tmp_path, capfd):
    """passive-2 cannot read its data: it exits before joining, with a one-line error; the launcher
    names it and that line at once (the coordinator, still waiting for the roster, is not waited for)."""
    path = _own_ids(tmp_path, keep_class=-1, missing_at="passive-2")
    run_dir = tmp_path / "run"
    assert run_local(path, run_dir=run_dir, progress=False, start="cold") == 1
    failed = _failed_line(capfd.readouterr().err)
    assert "passive party 'passive-2'" in failed and "exited with code 2: config error: " in failed, failed
    assert "key 'data': the data file of passive-2 is not there" in failed, failed
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["error"].startswith("passive party 'passive-2'")


def test_the_cause_in_a_log_is_its_last_error_or_the_exception_that_ended_it(tmp_path):
    log = tmp_path / "p.log"
    log.write_text(
        "2026-11-28 20:14:04,123 passive-1 INFO vflnet.party: serving\n"
        "2026-11-28 20:14:05,001 passive-1 ERROR vflnet.party: passive-1: join refused: the cause\n"
        "2026-11-28 20:14:05,002 passive-1 INFO vflnet.party: stopping\n"
    )
    assert cause_in_log(log) == "passive-1: join refused: the cause"
    start = log.stat().st_size
    assert cause_in_log(log, start) is None  # only this process's part of the log (a resume appends)
    with log.open("a") as fh:
        fh.write(
            "Traceback (most recent call last):\n"
            '  File "x.py", line 1, in <module>\n'
            "    boom()\n"
            "ValueError: the data file is not there\n"
        )
    assert cause_in_log(log, start) == "ValueError: the data file is not there"


@pytest.mark.parametrize("command", ["config", "run", "party"])
@pytest.mark.parametrize("content", [b"\x88\xff\x00binary", b"a: [\n", b"- 1\n- 2\n", None])
def test_a_bad_config_file_is_one_line_and_exit_2(tmp_path, capsys, command, content):
    path = tmp_path / "bad.yaml"
    if content is not None:  # None: no such file
        path.write_bytes(content)
    argv = {
        "config": ["config", "check", str(path)],
        "run": ["run", str(path), "--no-progress"],
        "party": ["party", "--role", "active", "--config", str(path), "--name", "active"],
    }[command]
    assert vflnet_main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"config error: {path}: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
