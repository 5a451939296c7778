"""`vflnet run --timeout SECONDS`: past the limit the launcher stops every process and exits 124."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import base_config, write_config

TIMEOUT_S = 5


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose command line holds ``text`` (every process of a run holds its config path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile
            continue
        if text in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.e2e
def test_a_run_over_its_timeout_is_stopped_with_exit_code_124(tmp_path, repo):
    data = base_config(n_passive=2)
    data["train"].update(epochs=500, batch_size=16)  # far longer than the limit
    path = write_config(tmp_path, data)
    start = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "vflnet",
            "run",
            str(path),
            "--run-dir",
            str(tmp_path / "run"),
            "--no-progress",
        ]
        + ["--timeout", str(TIMEOUT_S)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=repo,
    )
    try:
        _, err = proc.communicate(timeout=TIMEOUT_S + 60)
    finally:
        proc.kill()
    took = time.monotonic() - start
    assert proc.returncode == 124, err[-2000:]
    assert f"exceeded --timeout {TIMEOUT_S} s" in err
    # the limit plus the teardown's grace (SIGTERM, then SIGKILL 5 s later), not the run's length
    assert TIMEOUT_S <= took < TIMEOUT_S + 20, f"took {took:.1f} s"
    assert _processes_mentioning(str(path)) == [], "processes of the run outlived the launcher"
