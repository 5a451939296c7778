"""Issue 36: a party started with another config than the coordinator's (another seed, other columns)
is refused at Join, naming the first differing key; per-process keys may differ. Real `vflnet party`
processes started one by one, as docker-compose and lab machines start them."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, base_config, write_config
from vflnet.shared_config import config_mismatch, shared_json
from vflnet.validation import config_from_dict

RUN = "shared-config"


def _config() -> dict:
    data = base_config(n_passive=2)
    data["run"]["id"] = RUN
    data["train"]["max_steps"] = 2
    data["transport"]["join_timeout_s"] = 240
    return data


def test_the_first_differing_key_is_named_and_per_process_keys_are_not_compared():
    data = _config()
    cfg = config_from_dict(data)
    same = copy.deepcopy(data)
    same["run"]["dir"] = "/elsewhere"
    same["runtime"] = {"log_level": "DEBUG", "torch_threads": 2}
    same["parties"][2]["address"] = "10.0.0.7:50053"
    assert config_mismatch(cfg, "passive-1", shared_json(config_from_dict(same))) is None
    other = copy.deepcopy(data)
    other["parties"][3]["features"]["region"] = [0, 8, 5, 8]
    why = config_mismatch(cfg, "passive-2", shared_json(config_from_dict(other)))
    assert why is not None and "parties[3].features.region[2] is 5 there and 4 at the coordinator" in why
    assert "sent no readable config" in str(config_mismatch(cfg, "passive-2", ""))


def _party(path: Path, run_dir: Path, role: str, name: str, port: int | str, coordinator: str | None):
    cmd = [sys.executable, "-m", "vflnet", "party", "--config", str(path), "--run-dir", str(run_dir)]
    cmd += ["--role", role, "--name", name, "--listen", f"127.0.0.1:{port}"]
    if coordinator is not None:
        cmd += ["--coordinator", coordinator]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)


@pytest.mark.e2e
@pytest.mark.timeout(600)
def test_a_party_with_another_seed_is_refused_at_join_and_the_right_one_admitted(tmp_path):
    from vflnet.runner.local import free_port

    good = write_config(tmp_path, _config())
    bad_data = _config()
    bad_data["run"]["seed"] = 4
    bad = write_config(tmp_path, bad_data, "passive-2-bad.yaml")
    own = _config()  # the same run, with this process's own run.dir and log level
    own["run"]["dir"] = str(tmp_path / "elsewhere")
    own["runtime"] = {"log_level": "DEBUG"}
    fixed = write_config(tmp_path, own, "passive-2.yaml")
    run_dir = tmp_path / "run"
    port = free_port()
    address = f"127.0.0.1:{port}"
    procs = [_party(good, run_dir, "coordinator", "coordinator", port, None)]
    procs.append(_party(good, run_dir, "active", "active", free_port(), address))
    procs.append(_party(good, run_dir, "passive", "passive-1", free_port(), address))
    try:
        refused = _party(bad, run_dir, "passive", "passive-2", free_port(), address)
        out, _ = refused.communicate(timeout=300)
        assert refused.returncode == 2, out
        assert "join refused" in out and "FAILED_PRECONDITION" in out, out
        assert "run.seed is 4 there and 3 at the coordinator" in out, out
        admitted = _party(fixed, run_dir, "passive", "passive-2", free_port(), address)
        procs.append(admitted)
        for p in procs:
            p.communicate(timeout=300)
        assert [p.returncode for p in procs] == [0, 0, 0, 0], [p.returncode for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed", summary
