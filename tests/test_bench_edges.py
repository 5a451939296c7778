"""A benchmark prints only paths that exist after it, or says they are removed: its runs' scratch
folder is removed when it ends, unless an error ends it (the error names its logs). Ctrl-C ends any
benchmark with one line and exit code 130."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import DEADLINES


@pytest.mark.e2e
def test_bench_transport_prints_no_folder_it_removed(tmp_path: Path) -> None:
    temp = tmp_path / "temp"
    temp.mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "vflnet", "bench", "transport", "--smoke"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=dict(os.environ, TMPDIR=str(temp), VFLNET_QUIET="1"),
    )
    assert done.returncode == 0, done.stderr
    path = re.escape(str(temp)) + r"[^\s'\":)]*"
    printed = re.findall(path, done.stdout + done.stderr)
    said_removed = {
        p
        for line in (done.stdout + done.stderr).splitlines()
        if "removed" in line
        for p in re.findall(path, line)
    }
    assert printed  # the launcher's lines name its runs' directories
    assert {p for p in printed if not Path(p).exists()} <= said_removed
    assert [p for p in temp.iterdir() if p.name.startswith("vflnet")] == []  # nothing of its own left behind


def test_scratch_is_removed_unless_an_error_ends_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from vflnet.tools.bench.common import scratch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    with scratch("ok-") as ok:
        (ok / "file").write_text("x")
    assert not ok.exists()
    with pytest.raises(KeyboardInterrupt), scratch("interrupted-") as interrupted:
        raise KeyboardInterrupt
    assert not interrupted.exists()
    with pytest.raises(RuntimeError), scratch("failed-") as failed:
        raise RuntimeError(f"see {failed}")
    assert failed.is_dir()
    assert f"kept {failed}" in capsys.readouterr().err


@pytest.mark.e2e
def test_ctrl_c_on_a_benchmark_ends_it_with_one_line_and_130_and_removes_its_scratch(tmp_path: Path) -> None:
    """A terminal's Ctrl-C (SIGINT to the process group) while `vflnet bench scaling` runs a cluster."""
    temp = tmp_path / "temp"
    temp.mkdir()
    proc = subprocess.Popen(
        [sys.executable, "-m", "vflnet", "bench", "scaling", "--smoke", "--steps", "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env=dict(os.environ, TMPDIR=str(temp), VFLNET_QUIET="1", VFLNET_RESIDENT="off"),
    )
    try:
        limit = time.monotonic() + DEADLINES["join_timeout_s"] + 2 * DEADLINES["rpc_timeout_s"]
        while not any(p.stat().st_size for p in temp.glob("vflnet-bench-*/run/metrics.jsonl")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < limit, "no run started training"
            time.sleep(0.2)
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=DEADLINES["rpc_timeout_s"])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines() == ["bench scaling interrupted: no figures"]
    assert not list(temp.glob("vflnet-bench-*"))
