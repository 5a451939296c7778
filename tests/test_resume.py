"""Crash and resume (issue 16): coordinated checkpoints, `vflnet run --resume`, checkpoint integrity.

A seeded run is SIGKILLed three times, at a seeded random step each time and in a different role
(coordinator, active, passive), and resumed after each kill (secureboost: once); it must end with exactly the final
parameters, metrics and step records of the same run left alone. Readiness is the run's public
metrics.jsonl; every wait is bounded.

A kill lands a poll after the step it waits for, and a quiet machine runs a step of the small
protocols in ~7 ms: every kill point lies in the first half of a run, so the run is still going when
the kill comes.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from pathlib import Path

import pytest
import torch
from conftest import REPO, base_config, write_config

from vflnet.interceptors import read_trace
from vflnet.roles import checkpoints
from vflnet.runner.local import resume_local, run_local

PROTOCOLS = {
    "split": {"kind": "split", "aggregation": "concat"},
    # 512-bit keys keep the test short; they are insecure, and the run warns about them
    "split-he": {
        "kind": "split-he",
        "aggregation": "sum",
        "params": {"key_bits": 512, "allow_insecure_keys": True},
    },
    "param-server": {"kind": "param-server", "aggregation": "concat"},
    # a forest, one tree per batch (a step): Paillier gh and histograms
    "secureboost": {
        "kind": "secureboost",
        "aggregation": "sum",
        "params": {
            "mode": "he",
            "ensemble": "forest",
            "max_depth": 3,
            "n_bins": 8,
            "key_bits": 512,
            "allow_insecure_keys": True,
        },
    },
}
KILLS = ("coordinator", "active", "passive-1")
# every resume restarts every process from the checkpoint, whichever was killed: one kill checks
# secureboost's state (the three roles' failure paths are the same as the other protocols')
KILLS_OF = {"secureboost": ("passive-1",)}
# the small protocols run more epochs: their steps are fast enough that a kill point near the end
# of two epochs could come after the run had ended
EPOCHS = {"split": 4, "param-server": 4}
WAIT_S = 240  # generous bound for a loaded machine; a passing test waits seconds
POLL_S = 0.01


def _config(
    tmp_path: Path, protocol: str, bridge: str = "grpc", epochs: int = 2, auto_resume: int = 0
) -> Path:
    sum_ = PROTOCOLS[protocol]["aggregation"] == "sum"
    data = base_config(n_passive=2, aggregation="sum" if sum_ else "concat", active_features=sum_)
    if sum_:
        for p in data["parties"][1:]:
            p["bottom"] = {"kind": "mlp", "hidden": [6], "out": 10}
    if protocol == "secureboost":
        for p in data["parties"][1:]:
            p["bottom"] = {"kind": "splits", "out": 10}
    data["protocol"] = PROTOCOLS[protocol]
    data["run"]["id"] = f"resume-{protocol}"
    if auto_resume:  # only then: a loopback run never resumes, and does not read the key
        data["run"]["auto_resume"] = auto_resume
    data["train"].update(
        epochs=epochs,
        batch_size=128,
        checkpoint_every_steps=3,
        optimizer={"kind": "adam", "lr": 0.01},
        lr_schedule={"kind": "step", "step_size": 1, "gamma": 0.5},
    )
    if (
        protocol == "secureboost"
    ):  # it grows trees: no optimizer or LR schedule to set (config check refuses them)
        del data["train"]["optimizer"], data["train"]["lr_schedule"]
    data["transport"] = {"bridge": bridge}
    data["trace"] = {"parties": ["all"]}
    return write_config(tmp_path, data, f"{bridge}.yaml")


def _steps(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    # the run is still writing: a last line without its newline is a record half written, not yet one
    lines = path.read_text().split("\n")[:-1]
    return [r for r in map(json.loads, lines) if r["kind"] == "step"]


def _launch(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, VFLNET_QUIET="1", PYTHONPATH=str(REPO))
    with log.open("ab") as fh:
        return subprocess.Popen(
            [sys.executable, "-m", "vflnet", "run", *args, "--no-progress"], stdout=fh, stderr=fh, env=env
        )


def _wait_for_step(proc: subprocess.Popen[bytes], run_dir: Path, at_step: int, log: Path) -> None:
    """Return once this launch of the run has reported ``at_step`` training steps."""
    deadline = time.monotonic() + WAIT_S
    # plan.json: this launch's coordinator has admitted everyone (and cut metrics.jsonl back to its checkpoint)
    while not (run_dir / "plan.json").exists() or len(_steps(run_dir)) < at_step:
        assert proc.poll() is None, f"the run ended before step {at_step}: {log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no step {at_step} within {WAIT_S} s"
        time.sleep(POLL_S)


def _sigkill(run_dir: Path, role: str, at_step: int) -> None:
    pid = json.loads((run_dir / "processes.json").read_text())[role]["pid"]
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pytest.fail(
            f"{role} had exited before its kill at step {at_step} ({len(_steps(run_dir))} steps "
            "reported): the kill point is too near the run's end for this machine's speed"
        )


def _kill_at(proc: subprocess.Popen[bytes], run_dir: Path, role: str, at_step: int, log: Path) -> int:
    """SIGKILL ``role``'s process once the run has reported ``at_step`` training steps; returns the
    steps reported when it was killed."""
    _wait_for_step(proc, run_dir, at_step, log)
    _sigkill(run_dir, role, at_step)
    seen = len(_steps(run_dir))
    try:
        rc = proc.wait(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc != 0, "the launcher reported success after a process was killed"
    return seen


def _manifested_steps(run_dir: Path) -> list[int]:
    """The steps with a checkpoint manifest, oldest first (they are not evenly spaced: an epoch's end
    is a checkpoint too)."""
    found = (run_dir / "checkpoints").glob(f"step-*/{checkpoints.MANIFEST}")
    return sorted(int(path.parent.name.removeprefix("step-")) for path in found)


def _traced_steps(run_dir: Path) -> dict[str, Counter[tuple]]:
    """Per party, how many times its trace holds each step's message (step, phase, method, side,
    direction, sender): a resumed run's trace holds each once, as the run left alone does."""
    out = {}
    for path in sorted((run_dir / "traces").glob("*.trace")):
        out[path.stem] = Counter(
            (e.step, e.phase, e.short_method, e.side, e.direction, e.sender)
            for e in read_trace(path)
            if e.step is not None
        )
    return out


def _trace_differences(run_dir: Path, alone: Path) -> list[tuple[str, tuple, int, int]]:
    """(party, message, times in the resumed run's trace, times in the trace of the run left alone)
    for every message whose count differs."""
    got, expected = _traced_steps(run_dir), _traced_steps(alone)
    assert got.keys() == expected.keys()
    return sorted(
        (party, key, got[party][key], expected[party][key])
        for party in got
        for key in set(got[party]) | set(expected[party])
        if got[party][key] != expected[party][key]
    )


def _final_params(run_dir: Path) -> dict[str, dict[str, torch.Tensor]]:
    out = {}
    for path in sorted((run_dir / "checkpoints").glob("*.pt")):
        state = torch.load(path, weights_only=True)
        out[path.stem] = state.get("modules", state)
    return out


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("protocol", list(PROTOCOLS))
def test_killed_in_each_role_and_resumed_ends_as_the_uninterrupted_run(tmp_path, protocol):
    # the run left alone, on the loopback bridge: it ends bit-identical to a run over gRPC
    # (tests/test_protocol_layer.py) and saves four process starts
    epochs = EPOCHS.get(protocol, 2)
    path = _config(tmp_path, protocol, epochs=epochs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone_cfg = _config(tmp_path, protocol, "loopback", epochs=epochs)
        assert run_local(alone_cfg, run_dir=tmp_path / "alone", progress=False) == 0
    alone = json.loads((tmp_path / "alone/summary.json").read_text())
    total = alone["steps"]

    run_dir, log = tmp_path / "killed", tmp_path / "killed.log"
    rng = random.Random(f"{protocol}-16")  # the kill points, seeded: a failure names them
    kills = KILLS_OF.get(protocol, KILLS)
    first = 2 if len(kills) > 1 else 4  # a single kill comes after the first checkpoint (step 3)
    points = sorted(rng.sample(range(first, total // 2), len(kills)))
    proc = _launch([str(path), "--run-dir", str(run_dir)], log)
    history = []
    for role, at in zip(kills, points, strict=True):
        history.append((role, at, _kill_at(proc, run_dir, role, at, log)))
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "failed", (
            summary
        )  # written by the coordinator or, if it died, the launcher
        proc = _launch(["--resume", str(run_dir)], log)
    assert proc.wait(timeout=WAIT_S) == 0, f"kills {history}: {log.read_text()[-3000:]}"

    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["status"] == "completed"
    assert resumed["resumed_from_step"] > 0, history
    assert resumed["steps"] == total
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
        assert resumed["final"][key] == alone["final"][key], (key, history)
    # the step records: each step once, with the same losses as the run left alone
    losses = [(r["step"], r["loss"]) for r in _steps(run_dir)]
    assert losses == [(r["step"], r["loss"]) for r in _steps(tmp_path / "alone")], history
    # the traces: each step's messages once, after the checkpoint's cut and the resumed sessions
    differences = _trace_differences(run_dir, tmp_path / "alone")
    assert not differences, (history, differences)
    expected, got = _final_params(tmp_path / "alone"), _final_params(run_dir)
    assert expected.keys() == got.keys()
    for party, modules in expected.items():
        for module, state in modules.items():
            for name, value in state.items():
                assert torch.equal(got[party][module][name], value), (party, module, name, history)


def test_a_checkpoint_cut_at_any_byte_never_loads(tmp_path):
    state = {"step": 7, "weights": torch.arange(40, dtype=torch.float32)}
    path = tmp_path / "checkpoints/step-00000007/p.pt"
    digest = checkpoints.save_state(path, state)
    manifest = checkpoints.Manifest("run", 7, 0, {"p": digest})
    mpath = checkpoints.write_manifest(tmp_path, manifest)
    assert checkpoints.latest_manifest(tmp_path, "run", "p") == manifest

    whole = path.read_bytes()
    for cut in range(len(whole)):
        path.write_bytes(whole[:cut])
        with pytest.raises(checkpoints.CheckpointInvalid):
            checkpoints.load_state(path, digest)
        assert checkpoints.latest_manifest(tmp_path, "run", "p") is None
    path.write_bytes(whole)

    text = mpath.read_bytes()
    for cut in range(len(text)):
        mpath.write_bytes(text[:cut])
        assert checkpoints.latest_manifest(tmp_path, "run", "p") is None, cut
    mpath.write_bytes(text)
    assert checkpoints.latest_manifest(tmp_path, "run", "p") == manifest
    # another run's manifest, or a step without a manifest, is never used
    assert checkpoints.latest_manifest(tmp_path, "other-run", "p") is None
    mpath.unlink()
    assert checkpoints.latest_manifest(tmp_path, "run", "p") is None


def test_an_older_checkpoint_is_used_when_the_newest_is_incomplete(tmp_path):
    for step in (3, 6):
        digest = checkpoints.save_state(checkpoints.step_dir(tmp_path, step) / "p.pt", {"step": step})
        checkpoints.write_manifest(tmp_path, checkpoints.Manifest("run", step, 0, {"p": digest}))
    newest = checkpoints.step_dir(tmp_path, 6) / "p.pt"
    newest.write_bytes(newest.read_bytes()[:-1])
    assert checkpoints.latest_manifest(tmp_path, "run", "p").step == 3


def _two_checkpoints(run_dir: Path, run_id: str) -> None:
    """Steps 3 and 6, each with a file of the coordinator and of passive-1, and their manifests."""
    for step in (3, 6):
        files = {
            name: checkpoints.save_state(checkpoints.step_dir(run_dir, step) / f"{name}.pt", {"step": step})
            for name in ("coordinator", "passive-1")
        }
        checkpoints.write_manifest(run_dir, checkpoints.Manifest(run_id, step, 0, files))


def _cut_in_half(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def test_a_step_with_any_file_cut_is_skipped_naming_the_step_and_the_file(tmp_path):
    _two_checkpoints(tmp_path, "run")
    _cut_in_half(checkpoints.step_dir(tmp_path, 6) / "passive-1.pt")
    manifest, skipped = checkpoints.newest_valid(tmp_path, "run", "coordinator")
    assert manifest is not None and manifest.step == 3
    assert len(skipped) == 1 and "step-00000006" in skipped[0] and "passive-1.pt" in skipped[0]
    # a file the directory does not hold is another process's (compose: one run directory each)
    (checkpoints.step_dir(tmp_path, 3) / "passive-1.pt").unlink()
    assert checkpoints.newest_valid(tmp_path, "run", "coordinator")[0] == manifest
    # but the process's own file must be there
    manifest, skipped = checkpoints.newest_valid(tmp_path, "run", "passive-1")
    assert manifest is None and "step-00000003" in skipped[1] and "passive-1.pt" in skipped[1]


def test_a_party_saving_a_step_keeps_the_two_manifested_checkpoints_before_it(tmp_path):
    """A party saves step 9 before the coordinator writes its manifest; a run that dies in between
    must still have two manifested checkpoints, so the newest of them may be cut and the run resumes
    from the other (a party pruning like the coordinator removed step 3 here)."""
    _two_checkpoints(tmp_path, "run")
    checkpoints.save_state(checkpoints.step_dir(tmp_path, 9) / "passive-1.pt", {"step": 9})  # no manifest
    checkpoints.prune_after_party_save(tmp_path, [3, 6, 9])
    _cut_in_half(checkpoints.step_dir(tmp_path, 6) / "passive-1.pt")
    manifest, skipped = checkpoints.newest_valid(tmp_path, "run", "coordinator")
    assert manifest is not None and manifest.step == 3 and "step-00000006" in skipped[0]
    checkpoints.prune_after_party_save(tmp_path, [0, 3, 6, 9])  # a fourth save: step 0 would go, not 3
    assert checkpoints.newest_valid(tmp_path, "run", "coordinator")[0] == manifest


def test_resume_without_a_valid_checkpoint_fails_at_once_naming_step_and_file(tmp_path, capsys):
    run_dir = tmp_path / "run"
    path = _config(tmp_path, "split")
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(path.read_text())
    _two_checkpoints(run_dir, "resume-split")
    for step in (3, 6):
        _cut_in_half(checkpoints.step_dir(run_dir, step) / "passive-1.pt")
    assert resume_local(run_dir, progress=False) == 1
    err = capsys.readouterr().err
    summary = json.loads((run_dir / "summary.json").read_text())
    for text in (err, summary["error"]):
        for step in ("step-00000006", "step-00000003"):
            assert (
                f"{step}: checkpoint {run_dir / 'checkpoints' / step / 'passive-1.pt'} does not match" in text
            )
    assert summary["status"] == "failed"
    assert not (run_dir / "processes.json").exists()  # decided before any process started


@pytest.mark.e2e
@pytest.mark.slow
def test_a_cut_checkpoint_is_skipped_and_the_run_resumes_from_the_one_before(tmp_path):
    """passive-1's file of the newest checkpoint cut in half after a kill: `vflnet run --resume` says
    so, resumes from the checkpoint before it and ends bit-identical to the run left alone."""
    path = _config(tmp_path, "split")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert (
            run_local(_config(tmp_path, "split", "loopback"), run_dir=tmp_path / "alone", progress=False) == 0
        )
    run_dir, log = tmp_path / "cut", tmp_path / "cut.log"
    # step 8 of 24: a checkpoint at step 6 and one before it, and the run still going when the kill lands
    _kill_at(_launch([str(path), "--run-dir", str(run_dir)], log), run_dir, "passive-1", 8, log)
    newest = checkpoints.latest_manifest(run_dir, "resume-split", "coordinator")
    kept = _manifested_steps(run_dir)
    # two checkpoints kept: the newest and the one before
    assert newest is not None and newest.step >= 6 and kept[-1] == newest.step and len(kept) >= 2, kept
    before = kept[-2]
    cut = checkpoints.step_dir(run_dir, newest.step) / "passive-1.pt"
    _cut_in_half(cut)
    proc = _launch(["--resume", str(run_dir)], log)
    assert proc.wait(timeout=WAIT_S) == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert f"skipping checkpoint step-{newest.step:08d}: checkpoint {cut} does not match" in text
    assert f"resuming from step {before}, the newest valid checkpoint" in text
    resumed = json.loads((run_dir / "summary.json").read_text())
    alone = json.loads((tmp_path / "alone/summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["resumed_from_step"] == before
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
        assert resumed["final"][key] == alone["final"][key], key
    assert [(r["step"], r["loss"]) for r in _steps(run_dir)] == [
        (r["step"], r["loss"]) for r in _steps(tmp_path / "alone")
    ]
    # the traces: each step's messages once, after the checkpoint's cut and the resumed sessions
    assert _trace_differences(run_dir, tmp_path / "alone") == []
    expected, got = _final_params(tmp_path / "alone"), _final_params(run_dir)
    assert expected.keys() == got.keys()
    for party, modules in expected.items():
        for module, state in modules.items():
            for name, value in state.items():
                assert torch.equal(got[party][module][name], value), (party, module, name)


def test_resume_refuses_a_directory_that_is_not_a_run(tmp_path, capsys):
    assert resume_local(tmp_path, progress=False) == 2
    assert "has no config.yaml" in capsys.readouterr().err


@pytest.mark.e2e
@pytest.mark.slow
def test_run_auto_resume_resumes_by_itself_after_a_kill(tmp_path):
    """`run.auto_resume`: the launcher itself restarts every process with --resume after a party is
    SIGKILLed; the user sees one command that ends as the run left alone."""
    # the kill at step 5 of 24: well before the end
    path = _config(tmp_path, "split", epochs=2, auto_resume=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        alone_cfg = _config(tmp_path, "split", "loopback", epochs=2)
        assert run_local(alone_cfg, run_dir=tmp_path / "alone", progress=False) == 0
    alone = json.loads((tmp_path / "alone/summary.json").read_text())

    run_dir, log = tmp_path / "auto", tmp_path / "auto.log"
    proc = _launch([str(path), "--run-dir", str(run_dir)], log)
    try:
        _wait_for_step(proc, run_dir, 5, log)
        _sigkill(run_dir, "passive-1", 5)
        assert proc.wait(timeout=WAIT_S) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["status"] == "completed" and resumed["resumed_from_step"] > 0
    step = resumed["resumed_from_step"]
    assert f"resuming by itself from step {step} (run.auto_resume: attempt 1 of 1)" in log.read_text()
    for key in ("train_loss", "train_accuracy", "test_loss", "test_accuracy"):
        assert resumed["final"][key] == alone["final"][key], key
    assert [(r["step"], r["loss"]) for r in _steps(run_dir)] == [
        (r["step"], r["loss"]) for r in _steps(tmp_path / "alone")
    ]
