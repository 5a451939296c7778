"""Faults a local run meets (issue 61, points 2 and 4): a full disk during traces and during a
checkpoint, and a frozen party (SIGSTOP) short and long. Each ends cleanly, naming its cause, and
`vflnet run --resume` (after freeing space, or after the freeze) ends bit-identical to the run left
alone, compared as tests/test_resume.py compares."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from conftest import base_config, write_config
from test_resume import WAIT_S, _final_params, _launch, _steps, _trace_differences, _wait_for_step

from vflnet.roles import checkpoints
from vflnet.runner.local import run_local

# two launches of four processes each (and a reference run): longer than the default timeout when loaded
pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _config(tmp_path: Path, bridge: str, trace: bool, **transport: float) -> Path:
    data = base_config(n_passive=2)
    data["run"]["id"] = "faults"
    data["train"].update(epochs=2, batch_size=128, checkpoint_every_steps=3)
    data["transport"] = {"bridge": bridge, **transport}
    if trace:
        data["trace"] = {"parties": ["all"]}
    return write_config(tmp_path, data, f"{bridge}.yaml")


def _alone(tmp_path: Path, trace: bool) -> Path:
    """The run left alone, on the loopback bridge (bit-identical to one over gRPC)."""
    run_dir = tmp_path / "alone"
    assert run_local(_config(tmp_path, "loopback", trace), run_dir=run_dir, progress=False) == 0
    return run_dir


def _assert_identical(run_dir: Path, alone: Path, traced: bool) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    expected = json.loads((alone / "summary.json").read_text())
    assert summary["status"] == "completed", summary
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
        assert summary["final"][key] == expected["final"][key], key
    assert [(r["step"], r["loss"]) for r in _steps(run_dir)] == [
        (r["step"], r["loss"]) for r in _steps(alone)
    ]
    if traced:
        assert not _trace_differences(run_dir, alone)
    want, got = _final_params(alone), _final_params(run_dir)
    assert want.keys() == got.keys()
    for party, modules in want.items():
        for module, state in modules.items():
            for name, value in state.items():
                assert torch.equal(got[party][module][name], value), (party, module, name)


@contextmanager
def _small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path``, unmounted whatever happens."""
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _grow(path: Path) -> None:
    """Free space: the same file system, made larger."""
    subprocess.run(["mount", "-o", "remount,size=64m", str(path)], check=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a small file system needs root")
@pytest.mark.parametrize(
    ("trace", "size", "writing"),
    # with traces on, the trace or the checkpoint being written when the disk fills is named
    [
        (True, "1m", ("the trace to ", "the checkpoint of step ")),
        (False, "450k", ("the checkpoint of step ",)),
    ],
    ids=["traces", "checkpoint"],
)
def test_a_full_disk_ends_the_run_naming_the_file_and_resume_completes_it(tmp_path, trace, size, writing):
    alone = _alone(tmp_path, trace)
    path, log = _config(tmp_path, "grpc", trace), tmp_path / "launcher.log"
    with _small_disk(tmp_path / "disk", size) as disk:
        run_dir = disk / "run"
        proc = _launch([str(path), "--run-dir", str(run_dir)], log)
        try:
            assert proc.wait(timeout=WAIT_S) == 1
        finally:
            if proc.poll() is None:
                proc.kill()
        console = log.read_text()
        failed = [line for line in console.splitlines() if "FAILED" in line]
        assert len(failed) == 1 and "No space left on device" in failed[0], console[-3000:]
        # the file and what was being written, named in that one line
        assert any(f"cannot write {w}" in failed[0] for w in writing) and str(run_dir) in failed[0], failed[0]
        assert "Traceback" not in console
        # no temporary file takes space, and the newest checkpoint with a manifest is whole
        assert not [p for p in run_dir.rglob("*") if ".tmp" in p.name]
        newest, skipped = checkpoints.newest_valid(run_dir, "faults", "coordinator", every_file=True)
        assert newest is not None and not skipped, skipped
        summary = run_dir / "summary.json"
        if summary.exists():
            assert json.loads(summary.read_text())["status"] == "failed"
        else:  # not even the launcher could write it: the console says why and where the state is
            assert "no summary.json: cannot write the summary to" in console and "--resume" in console
        _grow(disk)
        resumed = _launch(["--resume", str(run_dir)], log)
        assert resumed.wait(timeout=WAIT_S) == 0, log.read_text()[-3000:]
        assert "resuming from step" in log.read_text()
        _assert_identical(run_dir, alone, trace)


HEARTBEAT_S, DEAD_AFTER_S = 0.2, 5.0


@pytest.mark.parametrize("frozen_for", ["short", "long"])
def test_a_frozen_party_is_ridden_out_or_fails_naming_it_and_resume_completes(tmp_path, frozen_for):
    """SIGSTOP on passive-1: shorter than transport.dead_after_s the run rides it out; longer, it
    fails naming the party and the key, and `vflnet run --resume` completes the run."""
    alone = _alone(tmp_path, trace=False)
    path = _config(tmp_path, "grpc", False, heartbeat_s=HEARTBEAT_S, dead_after_s=DEAD_AFTER_S)
    run_dir, log = tmp_path / "run", tmp_path / "launcher.log"
    proc = _launch([str(path), "--run-dir", str(run_dir)], log)
    pid = None
    try:
        _wait_for_step(proc, run_dir, 4, log)
        pid = json.loads((run_dir / "processes.json").read_text())["passive-1"]["pid"]
        os.kill(pid, signal.SIGSTOP)
        if frozen_for == "short":
            time.sleep(DEAD_AFTER_S / 5)  # a freeze, not a wait for the run: load only makes it shorter
            os.kill(pid, signal.SIGCONT)
            assert proc.wait(timeout=WAIT_S) == 0, log.read_text()[-3000:]
        else:
            coordinator_log = run_dir / "logs" / "coordinator.log"
            deadline = time.monotonic() + WAIT_S
            while "run failed" not in coordinator_log.read_text():
                assert time.monotonic() < deadline, "the run did not fail"
                time.sleep(0.1)
            os.kill(pid, signal.SIGCONT)
            assert proc.wait(timeout=WAIT_S) == 1
            summary = json.loads((run_dir / "summary.json").read_text())
            # the coordinator's error (the launcher may put the party's own exit first)
            error = summary.get("coordinator_error") or summary["error"]
            assert "passive-1" in error and "transport.dead_after_s" in error, summary
            resumed = _launch(["--resume", str(run_dir)], log)
            assert resumed.wait(timeout=WAIT_S) == 0, log.read_text()[-3000:]
            assert "resuming from step" in log.read_text()
    finally:
        if pid is not None:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _assert_identical(run_dir, alone, traced=False)
