"""The resident fork server (vflnet/runner/resident.py, `vflnet warm`): later `vflnet` commands run as
its forks, exactly as they would run on their own; it ends by itself, on `warm stop`, and never serves
code older than its files or a folder others can open."""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import base_config, write_config
from tests.test_e2e_runtime import _start_long_run, _wait_exited
from tests.test_warm_start import _metrics
from vflnet.runner import resident

pytestmark = pytest.mark.e2e

LIMIT_S = 600  # bounds every wait: imports on a loaded machine take minutes


def _env(runtime_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != resident.OFF_ENV}  # conftest turns it off
    return {**env, resident.DIR_ENV: str(runtime_dir), **extra}


def _vflnet(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vflnet", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=LIMIT_S,
    )


def _ppid(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("PPid:"):
            return int(line.split()[1])
    raise AssertionError(f"no PPid for {pid}")


def _start(env: dict[str, str], cwd: Path, idle_minutes: str) -> int:
    """`vflnet warm start`: the pid it reports."""
    started = _vflnet(["warm", "start", "--idle-minutes", idle_minutes], env, cwd)
    assert started.returncode == 0, started.stderr
    found = re.match(r"resident fork server (\d+) ready", started.stdout)
    assert found, started.stdout
    return int(found[1])


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[dict[str, str], int]]:
    """A resident server in a private folder: (the environment that uses it, its pid); stopped by pid."""
    env = _env(tmp_path / "rt")
    pid = _start(env, tmp_path, "10")
    try:
        yield env, pid
    finally:
        resident.stop_pid(pid, 60)


def test_a_run_sent_to_the_resident_server_ends_bit_identical_to_one_run_alone(tmp_path, server):
    env, _ = server
    path = write_config(tmp_path, base_config(n_passive=2))
    sent = _vflnet(["run", str(path), "--run-dir", str(tmp_path / "sent"), "--no-progress"], env, tmp_path)
    assert sent.returncode == 0, sent.stderr
    assert "completed" in sent.stdout  # its summary reached this process's stdout
    alone = _vflnet(
        ["run", str(path), "--run-dir", str(tmp_path / "alone"), "--no-progress"],
        {**env, resident.OFF_ENV: "off"},
        tmp_path,
    )
    assert alone.returncode == 0, alone.stderr
    assert _metrics(tmp_path / "sent") == _metrics(tmp_path / "alone")


def test_a_sent_command_keeps_its_exit_code_stderr_and_working_directory(tmp_path, server):
    env, _ = server
    (tmp_path / "here").mkdir()
    failed = _vflnet(["config", "check", "missing.yaml"], env, tmp_path / "here")
    assert failed.returncode == 2
    assert "missing.yaml" in failed.stderr
    listed = _vflnet(["models"], env, tmp_path)
    assert listed.returncode == 0 and "cafe-conv" in listed.stdout


def test_ctrl_c_reaches_a_sent_run_which_stops_its_processes_and_the_server_keeps_serving(
    tmp_path, repo, server
):
    env, server_pid = server
    client, run_dir = _start_long_run(tmp_path, repo, env)
    pids = [p["pid"] for p in json.loads((run_dir / "processes.json").read_text()).values()]
    assert {_ppid(pid) for pid in pids} == {server_pid}  # forked by the resident server
    client.send_signal(signal.SIGINT)  # what a terminal's Ctrl-C sends the command
    _, stderr = client.communicate(timeout=LIMIT_S)
    assert client.returncode == 130, stderr
    _wait_exited(pids, LIMIT_S)
    assert _vflnet(["warm", "status"], env, tmp_path).returncode == 0


def test_another_import_time_environment_or_source_file_names_another_server(tmp_path, monkeypatch):
    key = resident.installation_key()
    monkeypatch.setenv("OMP_NUM_THREADS", "8" if os.environ.get("OMP_NUM_THREADS") == "7" else "7")
    assert resident.installation_key() != key
    monkeypatch.undo()
    assert resident.installation_key() == key
    package = tmp_path / "vflnet"
    package.mkdir()
    source = package / "module.py"
    source.write_text("X = 1\n")
    before = resident.installation_key(package)
    assert before != key  # other source files
    os.utime(source, ns=(source.stat().st_atime_ns, source.stat().st_mtime_ns + 1_000_000_000))  # an edit
    assert resident.installation_key(package) != before


def test_a_server_for_other_files_is_not_used(tmp_path, server):
    env, server_pid = server
    # another import-time environment: this command finds no server and runs in its own process
    other = _vflnet(["warm", "status"], {**env, "OMP_NUM_THREADS": "7"}, tmp_path)
    assert other.returncode == 1 and "no resident fork server" in other.stdout
    assert _vflnet(["warm", "status"], env, tmp_path).returncode == 0
    # another network namespace (the lab's hosts, a container): a fork would run outside it
    if shutil.which("unshare") and os.geteuid() == 0:
        elsewhere = subprocess.run(
            ["unshare", "--net", sys.executable, "-m", "vflnet", "warm", "status"],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=LIMIT_S,
        )
        assert elsewhere.returncode == 1 and "no resident fork server" in elsewhere.stdout, elsewhere.stderr


def test_a_folder_others_can_open_is_refused(tmp_path, server):
    env, _ = server
    folder = Path(env[resident.DIR_ENV])
    folder.chmod(0o755)
    try:
        listed = _vflnet(["models"], env, tmp_path)
        assert listed.returncode == 0 and "cafe-conv" in listed.stdout  # run here, not there
        assert "not using a resident fork server" in listed.stderr and "mode 700" in listed.stderr
        start = _vflnet(["warm", "start"], env, tmp_path)
        assert start.returncode == 2 and "mode 700" in start.stderr
    finally:
        folder.chmod(0o700)


def test_warm_stop_ends_it_and_removes_its_files(tmp_path, server):
    env, server_pid = server
    stopped = _vflnet(["warm", "stop"], env, tmp_path)
    assert stopped.returncode == 0 and str(server_pid) in stopped.stdout
    _wait_exited([server_pid], 60)
    assert not list(Path(env[resident.DIR_ENV]).glob("fork-*.sock"))
    assert _vflnet(["warm", "status"], env, tmp_path).returncode == 1


def test_an_idle_server_ends_by_itself(tmp_path):
    env = _env(tmp_path / "rt")
    pid = _start(env, tmp_path, "0.02")  # 1.2 s
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        fd = None  # ended already
    if fd is not None:
        try:
            assert select.select([fd], [], [], LIMIT_S)[0], "the idle server did not end"
        finally:
            os.close(fd)
    assert not [*(tmp_path / "rt").glob("fork-*.sock"), *(tmp_path / "rt").glob("fork-*.json")]


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_a_sent_command_killed_by_a_signal_ends_its_client_by_the_same_signal(tmp_path, server):
    env, server_pid = server
    client = subprocess.Popen(
        [sys.executable, "-m", "vflnet", "proxy", "--listen", "127.0.0.1:0", "--upstream", "127.0.0.1:9"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + LIMIT_S
    while not _children(server_pid):  # the server has forked the proxy
        assert client.poll() is None, client.stderr.read() if client.stderr else b""
        assert time.monotonic() < deadline, "the server forked nothing"
        time.sleep(0.05)
    (child,) = _children(server_pid)
    os.kill(child, signal.SIGKILL)  # as the OOM killer would
    assert client.wait(LIMIT_S) == -signal.SIGKILL, client.stderr.read() if client.stderr else b""


def test_a_misspelt_setting_or_a_bad_argument_is_refused_by_name(tmp_path):
    env = _env(tmp_path / "rt")
    misspelt = _vflnet(["models"], {**env, resident.OFF_ENV: "of"}, tmp_path)
    assert misspelt.returncode == 2 and "VFLNET_RESIDENT" in misspelt.stderr and "'of'" in misspelt.stderr
    assert misspelt.stdout == ""  # the command did not run
    for bad in (["--idle-minutes", "0"], ["--torch-threads", "0"]):
        refused = _vflnet(["warm", "start", *bad], env, tmp_path)
        assert refused.returncode == 2 and bad[0] in refused.stderr, refused.stderr
    assert not (tmp_path / "rt").exists()  # nothing started
