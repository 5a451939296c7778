"""Warm start (vflnet/runner/warm.py): role processes forked from a fork server, against cold start."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import base_config, write_config
from tests.test_e2e_runtime import TRANSPORT, _start_long_run, _wait_exited
from vflnet.config import Config
from vflnet.runner.local import START_MODES, run_local
from vflnet.runner.warm import SOCKET_ENV, fork_server

pytestmark = pytest.mark.e2e

TIMING = ("step_time_s", "time_s")  # wall-clock fields of metrics.jsonl: the only ones allowed to differ


def _metrics(run_dir: Path) -> list[dict]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def test_warm_and_cold_starts_end_bit_identical(tmp_path):
    path = write_config(tmp_path, base_config(n_passive=2))
    for start in START_MODES:
        assert run_local(path, run_dir=tmp_path / start, progress=False, start=start) == 0
    warm, cold = tmp_path / "warm", tmp_path / "cold"
    assert _metrics(warm) == _metrics(cold)
    for party in ("active", "passive-1", "passive-2"):
        got, want = (torch.load(d / "checkpoints" / f"{party}.pt")["modules"] for d in (warm, cold))
        assert got.keys() == want.keys()
        for module, state in want.items():
            for name, value in state.items():
                assert torch.equal(got[module][name], value), (party, module, name)


def test_a_warm_child_reports_its_exit_code_and_writes_its_log(tmp_path):
    log_path = tmp_path / "child.log"
    with fork_server(1) as server, log_path.open("ab") as log:
        child = server.spawn(["config", "check", str(tmp_path / "missing.yaml")], dict(os.environ), log, 300)
        assert child.wait(timeout=300) == 2
    assert "missing.yaml" in log_path.read_text()


def test_a_requester_that_hangs_up_before_asking_leaves_the_server_serving(tmp_path):
    with fork_server(1) as server, (tmp_path / "child.log").open("ab") as log:
        with socket.socket(
            socket.AF_UNIX, socket.SOCK_SEQPACKET
        ) as gone:  # a launcher killed right after connecting
            gone.connect(str(server.path))
        assert server.spawn(["--version"], dict(os.environ), log, 300).wait(timeout=300) == 0
        assert server.proc.poll() is None


def test_a_killed_warm_party_fails_its_run_and_the_server_starts_the_next(tmp_path, repo, monkeypatch):
    """A role process SIGKILLed mid-run fails that run as a cold one would; the fork server, which a
    sweep keeps across runs, goes on and starts the next run's processes."""
    with fork_server(Config().runtime.torch_threads) as server:
        monkeypatch.setenv(SOCKET_ENV, server.offer()[SOCKET_ENV])  # as `vflnet sweep` offers it to its runs
        (tmp_path / "killed").mkdir()
        proc, run_dir = _start_long_run(tmp_path / "killed", repo)
        pids = json.loads((run_dir / "processes.json").read_text())
        for role in pids.values():  # forked by the offered server
            stat = Path(f"/proc/{role['pid']}/stat").read_text()
            assert int(stat.rsplit(")", 1)[1].split()[1]) == server.proc.pid  # its parent's pid
        os.kill(pids["passive-1"]["pid"], signal.SIGKILL)
        try:  # the launcher's stderr (a pipe) holds a few lines
            assert proc.wait(timeout=4 * TRANSPORT["rpc_timeout_s"]) == 1
        finally:
            proc.kill()
        summary = json.loads((run_dir / "summary.json").read_text())
        assert (
            summary["status"] == "failed"
            and "passive-1" in summary["error"]
            and "SIGKILL" in summary["error"]
        )
        _wait_exited([p["pid"] for p in pids.values()], 15)
        assert server.proc.poll() is None, "the fork server died with its child"

        path = write_config(tmp_path, base_config(n_passive=2), "next.yaml")
        assert run_local(path, run_dir=tmp_path / "next", progress=False) == 0
        assert json.loads((tmp_path / "next" / "summary.json").read_text())["status"] == "completed"


def test_a_warm_runs_processes_and_fork_server_die_with_its_launcher(tmp_path, repo):
    proc, run_dir = _start_long_run(tmp_path, repo)
    pids = [p["pid"] for p in json.loads((run_dir / "processes.json").read_text()).values()]
    # the launcher's one child is its fork server (the role processes are the server's)
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    assert len(children) == 1 and int(children[0]) not in pids
    proc.kill()  # SIGKILL: nothing of the launcher's runs
    proc.wait(60)
    _wait_exited([*map(int, children), *pids], 60)


def test_vflnet_run_starts_its_fork_server_before_importing_torch(tmp_path):
    """`vflnet run` starts the fork server from the schema alone, so its imports overlap the launcher's;
    it offers it to the run (SOCKET_ENV) while the run lasts, and starts none where it would not be used
    (a cold start, the loopback bridge) or where the config does not parse (the launcher reports it)."""
    from vflnet.commands.run import build_parser, early_fork_server

    good = write_config(tmp_path, base_config(n_passive=1))
    loopback = base_config(n_passive=1)
    loopback["transport"] = {"bridge": "loopback"}
    (tmp_path / "lb").mkdir()
    cases = {
        "cold": [str(good), "--start", "cold"],
        "loopback": [str(write_config(tmp_path / "lb", loopback))],
        "bad key": [str(good), "train.epochz=1"],
        "missing": [str(tmp_path / "missing.yaml")],
    }
    for why, argv in cases.items():
        with early_fork_server(build_parser().parse_args(argv)) as server:
            assert server is None and SOCKET_ENV not in os.environ, why
    with early_fork_server(build_parser().parse_args([str(good), "runtime.torch_threads=2"])) as server:
        assert server.proc.poll() is None
        assert os.environ[SOCKET_ENV] == f"2:{server.path}"
    assert server.proc.poll() is not None and SOCKET_ENV not in os.environ


@pytest.mark.timeout(300)
def test_a_warm_childs_exit_skips_torchs_op_teardown_and_still_removes_its_temporary_folder(tmp_path):
    # what a child runs before os._exit: every exit function except the op libraries' deregistration
    script = """
import atexit, os, tempfile, weakref
import torch.library
from vflnet.runner.warm import _skip_op_library_teardown
folder = tempfile.TemporaryDirectory()
ops = [f for f in weakref.finalize._registry if f.peek()[1] is torch.library._del_library]
assert ops and all(f.atexit for f in ops)
_skip_op_library_teardown()
assert not any(f.atexit for f in ops)
atexit._run_exitfuncs()
assert all(f.alive for f in ops), "an op library was torn down"
print("removed" if not os.path.exists(folder.name) else "kept")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "removed"
