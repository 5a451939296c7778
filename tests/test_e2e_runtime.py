"""End-to-end: real processes, real gRPC on loopback."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import base_config, write_config
from vflnet.runner.local import run_local
from vflnet.runner.reference import train_reference
from vflnet.validation import config_from_dict

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _wait_exited(pids: list[int], timeout_s: float) -> None:
    """Wait until every process in ``pids`` has ended, at most ``timeout_s`` in all. A pidfd turns
    readable when its process ends (a zombie has ended); one already reaped cannot be opened."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            ended, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(fd)
        assert ended, f"process {pid} still runs {timeout_s:.0f} s after the launcher exited"


def test_default_config_trains_digits_to_090_with_two_passive_parties(tmp_path, repo):
    data = yaml.safe_load((repo / "configs/digits-2p.yaml").read_text())
    path = write_config(tmp_path, data)
    proc = subprocess.run(
        [sys.executable, "-m", "vflnet", "run", str(path), "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=900,  # ten epochs on a loaded machine; below the slow tests' 1200 s hang guard
        cwd=repo,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "run/summary.json").read_text())
    assert summary["status"] == "completed"
    epochs = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    final = [e for e in epochs if e["kind"] == "epoch"][-1]
    assert final["test_accuracy"] >= 0.90
    # the run directory holds what the issue lists
    for name in (
        "config.yaml",
        "metrics.jsonl",
        "summary.json",
        "logs/coordinator.log",
        "logs/active.log",
        "logs/passive-1.log",
        "logs/passive-2.log",
        "checkpoints/active.pt",
        "checkpoints/passive-1.pt",
    ):
        assert (tmp_path / "run" / name).exists(), name
    step = next(e for e in epochs if e["kind"] == "step")
    assert (
        step["bytes_sent"]["passive-1/ExchangeEmbeddings"]
        > step["payload_bytes"]["passive-1/ExchangeEmbeddings"]
        > 0
    )
    assert "test accuracy" in proc.stdout and "bytes/step" in proc.stdout


@pytest.mark.parametrize(
    "aggregation, n_passive, active_features, optimizer",
    [
        ("concat", 1, False, {"kind": "adam", "lr": 0.01, "weight_decay": 1e-4}),
        ("concat", 3, True, {"kind": "momentum", "lr": 0.05}),
        ("sum", 1, True, {"kind": "sgd", "lr": 0.1}),
        ("sum", 3, False, {"kind": "adam", "lr": 0.01}),
    ],
)
def test_distributed_run_ends_with_the_reference_parameters(
    tmp_path, aggregation, n_passive, active_features, optimizer
):
    data = base_config(n_passive=n_passive, aggregation=aggregation, active_features=active_features)
    data["train"].update(
        epochs=2,
        batch_size=128,
        max_steps=14,
        optimizer=optimizer,
        lr_schedule={"kind": "step", "step_size": 1, "gamma": 0.5},
    )
    data["parties"][-1]["sample_fraction"] = 0.9  # alignment must drop the IDs one party lacks
    path = write_config(tmp_path, data)
    assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0
    plan = json.loads((tmp_path / "run/plan.json").read_text())
    assert plan["n_train"] + plan["n_test"] == round(1797 * 0.9)

    reference = train_reference(config_from_dict(data), evaluate=False)
    assert reference.steps == 14
    worst = 0.0
    for party, modules in reference.states.items():
        ckpt = torch.load(tmp_path / "run/checkpoints" / f"{party}.pt")
        assert ckpt["version"] == 14
        for module, state in modules.items():
            for name, expected in state.items():
                worst = max(worst, (ckpt["modules"][module][name] - expected).abs().max().item())
    assert worst <= 1e-5, f"max parameter difference {worst}"


@pytest.mark.parametrize("cut", ["cnn", "input-layer"])
def test_cnn_bottoms_and_input_layer_cut_match_the_reference(tmp_path, cut):
    data = base_config(n_passive=2, aggregation="concat" if cut == "cnn" else "sum")
    for p in data["parties"][2:]:
        if cut == "cnn":  # a small CNN per image region
            p["bottom"] = {"kind": "cnn", "channels": [4, 8], "out": 16}
        else:  # paper 000: the first linear layer split by columns; bias and activation at the active party
            p["bottom"] = {"kind": "linear", "bias": False, "out": 16}
    if cut == "input-layer":
        data["model"] = {"top": {"kind": "mlp", "hidden": [16], "input_activation": "relu"}}
    data["train"].update(max_steps=6, batch_size=128)
    path = write_config(tmp_path, data)
    assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0
    reference = train_reference(config_from_dict(data), evaluate=False)
    for party, modules in reference.states.items():
        ckpt = torch.load(tmp_path / "run/checkpoints" / f"{party}.pt")
        for module, state in modules.items():
            for name, expected in state.items():
                assert torch.equal(ckpt["modules"][module][name], expected), (party, module, name)


# The long runs' transport settings (tests/conftest.py): deadlines for the waits below.
TRANSPORT = base_config()["transport"]


def _start_long_run(
    tmp_path: Path, repo: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, Path]:
    """A run that trains far longer than any test waits (``env``: its command's environment, None:
    this one's), returned once it has taken 5 steps."""
    data = base_config(n_passive=2)
    data["train"].update(epochs=500, batch_size=16)
    path = write_config(tmp_path, data)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "vflnet", "run", str(path), "--run-dir", str(run_dir), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=repo,
        env=env,
    )
    # metrics.jsonl is the run's documented per-step record: 5 lines, 5 steps done. Starting and
    # joining is bounded by join_timeout_s, each step by rpc_timeout_s.
    timeout_s = TRANSPORT["join_timeout_s"] + 5 * TRANSPORT["rpc_timeout_s"]
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + timeout_s
    while not (metrics.exists() and len(metrics.read_text().splitlines()) >= 5):
        if proc.poll() is not None:
            raise AssertionError(f"the run exited ({proc.returncode}) before 5 steps: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"the run did not take 5 steps within {timeout_s} s")
        time.sleep(0.2)
    return proc, run_dir


def test_killed_party_fails_the_run_quickly_and_names_it(tmp_path, repo):
    proc, run_dir = _start_long_run(tmp_path, repo)
    pids = json.loads((run_dir / "processes.json").read_text())
    os.kill(pids["passive-1"]["pid"], signal.SIGKILL)
    start = time.monotonic()
    try:
        _, err = proc.communicate(timeout=4 * TRANSPORT["rpc_timeout_s"])
    finally:
        proc.kill()
    elapsed = time.monotonic() - start
    assert proc.returncode != 0
    # the dead process is noticed, not waited out: the run fails before an RPC deadline could expire
    assert elapsed < TRANSPORT["rpc_timeout_s"], f"the run took {elapsed:.1f} s to fail"
    assert "passive-1" in err and "FAILED" in err
    _wait_exited([p["pid"] for p in pids.values()], 15)


def test_a_killed_active_party_is_the_cause_in_summary_json_not_what_followed(tmp_path, repo):
    """Killing the active party also fails the passive parties' next exchange with it; the first cause
    (the active party's death) is what the launcher and summary.json name."""
    proc, run_dir = _start_long_run(tmp_path, repo)
    pids = json.loads((run_dir / "processes.json").read_text())
    os.kill(pids["active"]["pid"], signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=4 * TRANSPORT["rpc_timeout_s"])
    finally:
        proc.kill()
    assert proc.returncode == 1
    failed = next(line for line in err.splitlines() if "FAILED:" in line)
    assert "party 'active'" in failed and "SIGKILL" in failed, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["error"].startswith("active party 'active'") and "SIGKILL" in summary["error"], summary
    assert "coordinator_error" in summary  # what the coordinator saw after it, kept
    _wait_exited([p["pid"] for p in pids.values()], 15)


def test_a_roster_that_never_joins_names_transport_join_timeout_s(tmp_path, repo):
    """A coordinator whose parties never come fails after join_timeout_s, naming the setting."""
    data = base_config(n_passive=2)
    data["run"]["id"] = "lonely"
    data["transport"]["join_timeout_s"] = 2
    path = write_config(tmp_path, data)
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vflnet",
            "party",
            "--role",
            "coordinator",
            "--config",
            str(path),
            "--name",
            "coordinator",
            "--run-dir",
            str(run_dir),
            "--listen",
            "127.0.0.1:0",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=repo,
    )
    assert done.returncode == 1, done.stderr
    error = json.loads((run_dir / "summary.json").read_text())["error"]
    assert "transport.join_timeout_s (2 s)" in error and "active, passive-1, passive-2" in error, error


def test_interrupt_tears_down_every_process(tmp_path, repo):
    proc, run_dir = _start_long_run(tmp_path, repo)
    pids = json.loads((run_dir / "processes.json").read_text())
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=TRANSPORT["rpc_timeout_s"])
    finally:
        proc.kill()
    assert proc.returncode == 130 and "interrupted" in err
    _wait_exited([p["pid"] for p in pids.values()], 15)
    # the coordinator, stopped with the SIGINT the launcher got and passed on, said so itself
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "SIGINT" in summary["error"]


def test_a_second_run_in_the_same_run_directory_does_not_dial_the_first_runs_coordinator(tmp_path):
    """The first run leaves coordinator.addr behind; the second's parties must read their own."""
    path = write_config(tmp_path, base_config(n_passive=1))
    for attempt in range(2):
        assert run_local(path, run_dir=tmp_path / "run", progress=False) == 0, attempt
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "completed"
