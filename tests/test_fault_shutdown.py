"""Shutdown that cannot hang (issue 61, point 1): after a party dies, the coordinator tells every
live party at once; a party whose step waits on the dead one abandons that step, saves its final
model and exits, whatever order the parties joined in."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import DEADLINES, base_config, write_config

HEARTBEAT_S, DEAD_AFTER_S = 0.2, 3.0
RPC_TIMEOUT_S = (
    300  # far above every wait here: a party that waited out a step's deadline would fail the test
)
WAIT_S = DEADLINES["join_timeout_s"] + 60  # generous bound for a loaded machine; a passing test waits seconds


def _wait_until(what: str, done, procs: dict[str, subprocess.Popen]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        exited = {n: p.returncode for n, p in procs.items() if p.poll() is not None}
        assert not exited, f"exited before {what}: {exited}"
        assert time.monotonic() < deadline, f"no {what} within {WAIT_S} s"
        time.sleep(0.1)


def _start_in_join_order(tmp_path: Path, repo: Path, order: list[str]) -> dict[str, subprocess.Popen]:
    """The roles started as compose and lab machines start them (`vflnet party`), each party only
    once the one before it has been admitted: the coordinator's roster is in ``order``. Returned once
    the run has taken a step."""
    from vflnet.runner.local import free_port

    data = base_config(n_passive=2)
    data["run"]["id"] = "shutdown"
    data["train"].update(epochs=500, batch_size=16)
    data["transport"].update(heartbeat_s=HEARTBEAT_S, dead_after_s=DEAD_AFTER_S, rpc_timeout_s=RPC_TIMEOUT_S)
    coordinator = f"127.0.0.1:{free_port()}"
    path = write_config(tmp_path, data)
    roles = {p["name"]: p["role"] for p in data["parties"]}
    procs: dict[str, subprocess.Popen] = {}
    env = dict(os.environ, PYTHONPATH=str(repo))
    for name in ["coordinator", *order]:
        where = (
            ["--listen", coordinator]
            if name == "coordinator"
            else ["--listen", "127.0.0.1:0", "--advertise", "127.0.0.1:0", "--coordinator", coordinator]
        )
        with (tmp_path / f"{name}.log").open("w") as log:
            procs[name] = subprocess.Popen(
                [sys.executable, "-m", "vflnet", "party", "--role", roles[name], "--config", str(path)]
                + ["--name", name, "--run-dir", str(tmp_path / "run"), *where],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=repo,
                env=env,
            )
        if name != "coordinator":
            admitted = f"admitted {name} "
            log_path = tmp_path / "coordinator.log"
            _wait_until(f"{name}'s admission", lambda a=admitted, p=log_path: a in p.read_text(), procs)
    metrics = tmp_path / "run" / "metrics.jsonl"
    _wait_until("a step", lambda: metrics.exists() and '"kind": "step"' in metrics.read_text(), procs)
    return procs


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("order", "frozen"),
    [
        # the active party's step waits for passive-1's embeddings, passive-2's on the active party
        (["passive-2", "active", "passive-1"], "passive-1"),
        (["active", "passive-2", "passive-1"], "passive-1"),
        # both passive parties' steps wait on the frozen active party: only their own Shutdown frees them
        (["passive-1", "passive-2", "active"], "active"),
    ],
    ids=["passive-2-first", "active-first", "active-frozen"],
)
def test_every_live_party_is_shut_down_at_once_after_a_party_dies(tmp_path, repo, order, frozen):
    procs = _start_in_join_order(tmp_path, repo, order)
    try:
        os.kill(procs[frozen].pid, signal.SIGSTOP)  # alive, answers nothing
        live = [n for n in order if n != frozen]
        for name in ["coordinator", *live]:
            rc = procs[name].wait(timeout=WAIT_S)  # a step's deadline (300 s) is never waited out
            assert rc == (1 if name == "coordinator" else 0), (name, rc)
        coordinator = (tmp_path / "coordinator.log").read_text()
        failed = next(line for line in coordinator.splitlines() if "run failed" in line)
        assert f"{frozen!r} has not answered heartbeats" in failed and "transport.dead_after_s" in failed
        # every live party told at once, in join order, and none of them failed to answer
        assert f"sending Shutdown to {', '.join(live)} at once" in coordinator
        assert "shutdown of" not in coordinator, coordinator[-3000:]
        for name in live:
            log = (tmp_path / f"{name}.log").read_text()
            assert log.index("shutdown requested (run failed") < log.index(f"{name}: shut down; final model")
        summary = json.loads((tmp_path / "run" / "summary.json").read_text())
        assert summary["status"] == "failed" and frozen in summary["error"]
        # the final models of the live parties, saved once their state was consistent
        assert sorted(summary["checkpoints"]) == sorted(live)
        for name in live:
            assert Path(summary["checkpoints"][name]).is_file()
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
            proc.wait()
