"""A benchmark prints only paths that exist after it, or says they are removed: its runs' scratch
folder is removed when it ends, unless an error ends it (the error names its logs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest


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
