"""`vflnet run --resume` checks every process's checkpoint file before any process starts: a missing
or bad one makes it fall back to the next older complete checkpoint, saying so; with none, it names
what is missing. (tests/test_resume.py: resumed runs end as the run left alone.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import base_config, write_config

from vflnet.roles import checkpoints
from vflnet.runner.local import resume_local, run_local

NAMES = ("coordinator", "active", "passive-1", "passive-2")


def _checkpoints(run_dir: Path, run_id: str, steps: tuple[int, ...] = (3, 6)) -> None:
    for step in steps:
        files = {
            name: checkpoints.save_state(checkpoints.step_dir(run_dir, step) / f"{name}.pt", {"step": step})
            for name in NAMES
        }
        checkpoints.write_manifest(run_dir, checkpoints.Manifest(run_id, step, 0, files))


def _gone(run_dir: Path, step: int, name: str = "passive-2") -> Path:
    path = checkpoints.step_dir(run_dir, step) / f"{name}.pt"
    path.unlink()
    return path


def test_a_missing_file_of_another_process_skips_the_step_when_every_file_must_be_here(tmp_path):
    _checkpoints(tmp_path, "run")
    gone = _gone(tmp_path, 6)
    # one run directory for every process (`vflnet run`): the step is incomplete
    manifest, skipped = checkpoints.newest_valid(tmp_path, "run", "coordinator", every_file=True)
    assert manifest is not None and manifest.step == 3
    assert skipped == [f"step-00000006: checkpoint {gone} of 'passive-2' is missing"]
    # a directory of its own per process (compose): the file is another machine's
    assert checkpoints.newest_valid(tmp_path, "run", "coordinator")[0].step == 6


def test_a_manifest_of_another_step_is_skipped(tmp_path):
    _checkpoints(tmp_path, "run")
    newest = checkpoints.step_dir(tmp_path, 6) / checkpoints.MANIFEST
    raw = json.loads(newest.read_text())
    newest.write_text(json.dumps(dict(raw, step=3)))
    manifest, skipped = checkpoints.newest_valid(tmp_path, "run", "coordinator")
    assert manifest is not None and manifest.step == 3
    assert skipped == [f"step-00000006: {newest} names step 3, not its directory's"]


def _config(tmp_path: Path) -> Path:
    data = base_config(n_passive=2)
    data["run"]["id"] = "checked"
    # 1438 training samples in batches of 128: 12 steps, a checkpoint every 3 (9 and 12 are kept)
    data["train"].update(batch_size=128, checkpoint_every_steps=3)
    return write_config(tmp_path, data)


def test_resume_with_no_complete_checkpoint_names_each_missing_file_and_starts_nothing(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(_config(tmp_path).read_text())
    _checkpoints(run_dir, "checked")
    gone = [_gone(run_dir, 6), _gone(run_dir, 3, "active")]
    assert resume_local(run_dir, progress=False) == 1
    err = capsys.readouterr().err
    summary = json.loads((run_dir / "summary.json").read_text())
    for text in (err, summary["error"]):
        assert f"step-00000006: checkpoint {gone[0]} of 'passive-2' is missing" in text, text
        assert f"step-00000003: checkpoint {gone[1]} of 'active' is missing" in text, text
    assert not (run_dir / "processes.json").exists()  # decided before any process started


@pytest.mark.e2e
@pytest.mark.slow
def test_a_deleted_party_checkpoint_falls_back_to_the_older_step_and_the_run_completes(tmp_path, capfd):
    path = _config(tmp_path)
    run_dir = tmp_path / "run"
    assert run_local(path, run_dir=run_dir, progress=False) == 0
    alone = json.loads((run_dir / "summary.json").read_text())
    steps = sorted(int(d.name.removeprefix("step-")) for d in (run_dir / "checkpoints").glob("step-*"))
    assert steps == [9, 12], steps
    gone = _gone(run_dir, 12)
    capfd.readouterr()
    assert resume_local(run_dir, progress=False) == 0
    err = capfd.readouterr().err
    assert f"skipping checkpoint step-00000012: checkpoint {gone} of 'passive-2' is missing" in err, err
    assert "run checked: resuming from step 9, the newest valid checkpoint" in err, err
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["resumed_from_step"] == 9, resumed
    assert resumed["steps"] == alone["steps"] == 12
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
        assert resumed["final"][key] == alone["final"][key], key
    # and resumed again, from the newest checkpoint, which it says
    assert resume_local(run_dir, progress=False) == 0
    assert "run checked: resuming from step 12\n" in capfd.readouterr().err
