"""`vflnet run --timeout` counts from the command's start: its start-up (an interpreter, torch's
imports, the config's checks) is part of the limit, as a user timing the command sees it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import base_config, write_config

pytestmark = pytest.mark.e2e

# under any start-up: importing torch alone takes longer
LIMIT_S = 0.2


def test_a_timeout_shorter_than_the_start_up_stops_the_run_before_any_process_starts(
    tmp_path: Path, repo: Path
) -> None:
    path, run_dir = write_config(tmp_path, base_config()), tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "vflnet", "run", str(path), "--run-dir", str(run_dir), "--no-progress"]
        + ["--timeout", str(LIMIT_S), "--start", "cold"],
        capture_output=True,
        text=True,
        cwd=repo,
        env=dict(os.environ, VFLNET_RESIDENT="off"),  # a resident server's child has its imports done
    )
    assert done.returncode == 124, done.stderr
    assert f"exceeded --timeout {LIMIT_S:g} s" in done.stderr
    assert not list((run_dir / "logs").iterdir())  # no role process was started


def test_the_help_says_where_the_timeout_counts_from(capsys: pytest.CaptureFixture[str]) -> None:
    from vflnet.commands.run import build_parser

    help_text = " ".join(build_parser().format_help().split())
    assert "counted from its start (start-up included)" in help_text
