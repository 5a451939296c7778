"""vflnet/durable.py: a write that fails on a full or read-only disk names what and where in one
line, leaves the old file as it was and no temporary file (issue 61, point 2)."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest

from vflnet.durable import WriteFailed, write_durable

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system needs root")


@pytest.fixture
def disk(tmp_path: Path):
    """A 256 KiB tmpfs, unmounted whatever happens."""
    path = tmp_path / "disk"
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def test_a_write_to_a_full_disk_names_the_file_and_leaves_the_old_one_and_no_tmp(disk: Path) -> None:
    path = disk / "checkpoints" / "active.pt"
    write_durable(path, b"old", "the final model")
    with pytest.raises(WriteFailed) as raised:
        write_durable(path, b"x" * (1 << 20), "the final model")
    assert raised.value.errno == errno.ENOSPC and raised.value.filename == str(path)
    assert str(raised.value) == f"cannot write the final model to {path}: No space left on device"
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in path.parent.iterdir()) == ["active.pt"]


def test_a_write_to_a_read_only_disk_names_the_file(disk: Path) -> None:
    path = disk / "summary.json"
    subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
    with pytest.raises(WriteFailed, match=f"^cannot write the summary to {path}: Read-only file system$"):
        write_durable(path, b"{}", "the summary")
    assert not list(disk.iterdir())


def test_metrics_written_after_the_run_directory_vanished_fail_naming_the_file(tmp_path: Path) -> None:
    """A removed run directory must stop the run, not let it write its metrics into a deleted file."""
    import shutil

    from vflnet.roles.coordinator import MetricsLog

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = MetricsLog(run_dir / "metrics.jsonl")
    log.write({"kind": "step", "step": 1})
    shutil.rmtree(run_dir)
    with pytest.raises(WriteFailed) as err:
        log.write({"kind": "step", "step": 2})
    assert str(err.value) == (
        f"cannot write the metrics to {run_dir / 'metrics.jsonl'}: the file was removed (the run directory "
        "vanished?)"
    )
    log.close()
