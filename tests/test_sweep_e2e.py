"""Acceptance: a 2x2 sweep with 2 seeds through `vflnet sweep`, killed (SIGKILL) after some runs
completed and started again: it finishes without redoing them, and its report renders in headless
Chromium with its plots and tables."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.headless import assert_not_blank, render
from tests.test_report import SCALE, tiny_sweep_file
from vflnet.tools.experiments.results import read_json

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

VFLNET = [sys.executable, "-m", "vflnet"]


def finished(runs: Path) -> dict[str, int]:
    """{run name: its summary.json's mtime} of the runs the sweep has finished (renamed into place)."""
    if not runs.exists():
        return {}
    return {
        d.name: (d / "summary.json").stat().st_mtime_ns
        for d in runs.iterdir()
        if not d.name.endswith(".partial") and (d / "summary.json").exists()
    }


def processes_mentioning(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def wait_for(what: str, check: Callable[[], bool], deadline_s: float) -> None:
    deadline = time.monotonic() + deadline_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def test_a_killed_sweep_resumes_and_reports(tmp_path: Path) -> None:
    sweep = tiny_sweep_file(tmp_path, {SCALE: [0.001, 2.0], "train.batch_size": [32, 64]}, [0, 1])
    out, kill_after = tmp_path / "out", 3
    cmd = [*VFLNET, "sweep", str(sweep), "--out", str(out), "--jobs", "2", "--quiet"]
    with (tmp_path / "first.log").open("wb") as log:
        first = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for(f"{kill_after} finished runs", lambda: len(finished(out / "runs")) >= kill_after, 900)
            first.send_signal(signal.SIGKILL)
        finally:
            first.kill()
            first.wait(timeout=60)
    done_before = finished(out / "runs")
    assert kill_after <= len(done_before) < 8
    # the killed sweep's runs die with it (PR_SET_PDEATHSIG): nothing goes on writing into out/
    wait_for("the killed sweep's runs to stop", lambda: not processes_mentioning(str(out)), 120)
    logs_before = {name: (out / "logs" / f"{name}.log").stat().st_mtime_ns for name in done_before}

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=1100)
    assert again.returncode == 0, again.stdout + again.stderr
    done = finished(out / "runs")
    assert len(done) == 8 and not list((out / "runs").glob("*.partial"))
    for name, mtime in done_before.items():  # not redone: neither rerun nor relaunched
        assert done[name] == mtime
        assert (out / "logs" / f"{name}.log").stat().st_mtime_ns == logs_before[name]

    rows = read_json(out / "results.json")
    assert len(rows) == 8 and sorted(r["run"] for r in rows) == sorted(done)
    combos = {(r[SCALE], r["train.batch_size"], r["seed"]) for r in rows}
    assert len(combos) == 8
    assert all(
        r["test_accuracy"] > 0 and "attack.direct-label-inference@passive-1.label_accuracy" in r for r in rows
    )
    header = (out / "results.csv").read_text().splitlines()[0].split(",")
    assert header[:4] == ["run", SCALE, "train.batch_size", "seed"]

    result = subprocess.run([*VFLNET, "report", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    page = out / "report" / "report.html"
    shown = render(page, tmp_path)
    assert len(shown.sizes("img")) >= 3 and all(w > 100 and h > 100 for w, h in shown.sizes("img"))
    assert all(w > 100 and h > 100 for w, h in shown.sizes("img", "data-natural"))
    # results: header + 8 runs; defense capability score: header + 4 settings (mean over the 2 seeds)
    assert len(shown.sizes("table")) == 2 and shown.dom.count("<tr>") == 9 + 5
    assert "Trade-off: utility vs leakage" in shown.dom
    assert_not_blank(shown.screenshot)
