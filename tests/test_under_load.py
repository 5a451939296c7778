"""A run on a loaded machine: beside two busy processes (as many as this machine's cores) a digits
run completes and ends with exactly the metrics of the same run on a quiet machine. Slow is not dead,
and load changes timing only, never results."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import write_config

HOGS = 2
BUSY = "while True: pass"


def _run(config: Path, run_dir: Path, repo: Path) -> tuple[dict, float]:
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "vflnet", "run", str(config), "--run-dir", str(run_dir), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=repo,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text()), time.monotonic() - start


@pytest.mark.e2e
@pytest.mark.slow  # two cluster start-ups: ~35 s beside another job on 2 cores, ~50 s under the hog
def test_a_run_beside_a_cpu_hog_ends_with_the_same_metrics(tmp_path, repo):
    data = yaml.safe_load((repo / "configs/digits-2p.yaml").read_text())
    data["train"]["max_steps"] = 20  # one evaluated epoch's worth: seconds of training
    config = write_config(tmp_path, data)
    quiet, quiet_s = _run(config, tmp_path / "quiet", repo)
    hogs = [subprocess.Popen([sys.executable, "-c", BUSY]) for _ in range(HOGS)]
    try:
        loaded, loaded_s = _run(config, tmp_path / "loaded", repo)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert quiet["status"] == loaded["status"] == "completed"
    for key in ("test_accuracy", "test_loss", "train_loss"):
        assert loaded["final"][key] == quiet["final"][key], (key, quiet_s, loaded_s)
    assert loaded["steps"] == quiet["steps"] == 20
