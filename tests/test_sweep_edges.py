"""`vflnet sweep` and `vflnet audit` as a user meets them: Ctrl-C ends them with one line and exit code
130, stopping every process they started, and their runs record SIGINT; the sweep's progress bar stays
out of redirected output; a finished run's files name the folder the run ends in, not the
``.partial`` one it ran in."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import DEADLINES, base_config, write_config
from vflnet.tools.experiments.plan import load_sweep
from vflnet.tools.experiments.results import PARTIAL
from vflnet.tools.experiments.sweep import run_one, write_run_files

pytestmark = pytest.mark.e2e


def _sweep_file(tmp_path: Path, epochs: int) -> Path:
    """Two runs of a gRPC cluster (a coordinator, an active and two passive parties each)."""
    base = base_config(n_passive=2)
    base["train"]["epochs"] = epochs
    write_config(tmp_path, base, "base.yaml")
    path = tmp_path / "sweep.yaml"
    path.write_text(
        yaml.safe_dump(
            {"name": "edges", "base": "base.yaml", "seeds": [0], "grid": {"train.optimizer.lr": [0.01, 0.02]}}
        )
    )
    return path


def _group(pgid: int) -> list[int]:
    """The live processes of process group ``pgid`` (zombies excluded)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
        if proc.name.isdigit() and fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(proc.name))
    return pids


def _interrupted(args: list[str], out: Path, to: str) -> tuple[int, str, str, Path]:
    """``vflnet ARGS`` (writing its runs under ``out/runs``), sent SIGINT once a run is training: to
    the command alone (as a resident server's client forwards Ctrl-C) or to its whole process group
    (a terminal's Ctrl-C). Its exit code, stdout, stderr and the run's directory, once every process
    it started (a fork server, a run's launcher, the run's roles) has ended."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "vflnet", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group, as a shell gives a command
        env=dict(os.environ, VFLNET_RESIDENT="off"),
    )
    try:
        # the run's own per-step record: its coordinator is training
        limit = time.monotonic() + DEADLINES["join_timeout_s"] + 2 * DEADLINES["rpc_timeout_s"]
        while not any(p.stat().st_size for p in out.glob(f"runs/*{PARTIAL}/metrics.jsonl")):
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < limit, "no run started training"
            time.sleep(0.2)
        (run_dir,) = out.glob(f"runs/*{PARTIAL}")
        started = [p["pid"] for p in json.loads((run_dir / "processes.json").read_text()).values()]
        if to == "command":
            proc.send_signal(signal.SIGINT)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=DEADLINES["rpc_timeout_s"])
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    limit = time.monotonic() + DEADLINES["rpc_timeout_s"]
    while _group(proc.pid) or any(Path(f"/proc/{pid}").exists() for pid in started):
        assert time.monotonic() < limit, f"left running: {_group(proc.pid)}"
        time.sleep(0.2)
    return proc.returncode, stdout, stderr, run_dir


TO = pytest.mark.parametrize("to", ["command", "group"], ids=["to-the-command", "to-its-process-group"])


@TO
def test_ctrl_c_ends_a_sweep_with_one_line_and_130_and_its_runs_record_sigint(
    tmp_path: Path, to: str
) -> None:
    sweep, out = _sweep_file(tmp_path, epochs=500), tmp_path / "out"
    rc, stdout, stderr, run_dir = _interrupted(
        ["sweep", str(sweep), "--out", str(out), "--jobs", "1"], out, to
    )
    assert rc == 130, stderr
    assert "Traceback" not in stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "sweep edges interrupted (SIGINT)" in lines[0], stderr
    assert "%|" not in stderr + stdout  # no progress bar when stderr is not a terminal
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "SIGINT" in summary["error"], summary


@TO
def test_ctrl_c_ends_an_audit_with_130_and_its_run_records_sigint(tmp_path: Path, to: str) -> None:
    data = base_config(n_passive=2)
    data["train"]["epochs"] = 500
    config, out = write_config(tmp_path, data), tmp_path / "out"
    rc, _, stderr, run_dir = _interrupted(["audit", str(config), "--out", str(out)], out, to)
    assert rc == 130, stderr
    assert "Traceback" not in stderr
    assert stderr.strip().splitlines()[-1] == "vflnet audit interrupted; the same command resumes it"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted" and "SIGINT" in summary["error"], summary


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, list | dict):
        for v in value.values() if isinstance(value, dict) else value:
            yield from _strings(v)


def test_a_finished_sweep_run_names_its_final_folder_not_the_partial_one(tmp_path: Path) -> None:
    sweep = load_sweep(_sweep_file(tmp_path, epochs=1))
    run, runs = sweep.runs[0], tmp_path / "out" / "runs"
    (tmp_path / "out" / "configs").mkdir(parents=True)
    config, meta = write_run_files(sweep, run, tmp_path / "out" / "configs")
    assert run_one(config, meta, runs / run.name, start="cold") == 0
    named = [
        (path.name, s)
        for path in (runs / run.name).rglob("*.json")
        for s in _strings(json.loads(path.read_text()))
        if str(runs) in s
    ]
    assert {"summary.json", "processes.json"} <= {name for name, _ in named}  # checkpoints, logs
    for name, path in named:
        assert PARTIAL not in path and Path(path).exists(), (name, path)


def test_complete_renames_a_run_and_every_path_its_json_files_name_inside_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a sweep and an audit do with a finished run: relative and absolute paths, alone or inside
    a string, in any JSON file of the run, at any depth; other paths and the logs are left alone."""
    from vflnet.tools.experiments.results import complete

    monkeypatch.chdir(tmp_path)
    partial, dest = Path("runs") / f"r0{PARTIAL}", Path("runs") / "r0"
    (partial / "attacks").mkdir(parents=True)
    other = "runs/r0.partial-not-this-one/x"
    (partial / "summary.json").write_text(
        json.dumps(
            {
                "checkpoints": {"active": f"{partial}/checkpoints/active.pt"},
                "resume": f"vflnet run --resume {partial}",
                "absolute": [str(partial.resolve() / "logs")],
                "other": other,
                "steps": 3,
            }
        )
    )
    (partial / "attacks" / "out.json").write_text(json.dumps({"dir": str(partial)}))
    (partial / "run.log").write_text(f"ran in {partial}\n")
    complete(partial, dest)
    assert not partial.exists()
    summary = json.loads((dest / "summary.json").read_text())
    assert summary == {
        "checkpoints": {"active": f"{dest}/checkpoints/active.pt"},
        "resume": f"vflnet run --resume {dest}",
        "absolute": [str(dest.resolve() / "logs")],
        "other": other,
        "steps": 3,
    }
    assert json.loads((dest / "attacks" / "out.json").read_text()) == {"dir": str(dest)}
    assert (dest / "run.log").read_text() == f"ran in {partial}\n"
