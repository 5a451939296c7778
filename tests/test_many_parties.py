"""Many passive parties: a roster the servers cannot hold is refused, a roster past 32 parties trains
(a server once had 32 threads, and the coordinator's joins or the active party's embeddings, each
held until the others arrive, took them all), `vflnet bench scaling` reports every role's CPU and
memory at a K that does not divide 8, and `vflnet bench secureboost-anchors` puts each anchor's
published figure beside ours."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import DEADLINES, REPO
from vflnet.config import ConfigError, calls_at_once
from vflnet.runner.loopback import run_loopback
from vflnet.tools.bench.scaling import scaling_config
from vflnet.tools.bench.secureboost_anchors import ANCHORS
from vflnet.validation import config_from_dict


def test_max_concurrent_rpcs_must_cover_the_roster() -> None:
    data = scaling_config(31, steps=2, batch=16)  # 33 parties: 74 calls at once
    data["transport"]["max_concurrent_rpcs"] = calls_at_once(33) - 1
    with pytest.raises(ConfigError, match=r"transport\.max_concurrent_rpcs.*33 parties.*at least 74"):
        config_from_dict(data)
    data["transport"]["max_concurrent_rpcs"] = calls_at_once(33)
    config_from_dict(data)
    data["transport"]["bridge"] = "loopback"  # no gRPC server: the key is not read, nothing to cover
    data["transport"].pop("max_concurrent_rpcs")
    config_from_dict(data)
    assert config_from_dict(scaling_config(200, steps=2, batch=16)).transport.max_concurrent_rpcs == 412


def test_forty_passive_parties_train_over_the_loopback_bridge(tmp_path: Path) -> None:
    """In one process (the loopback bridge's servers are sized from the roster as gRPC's are)."""
    data = scaling_config(40, steps=3, batch=16)
    data["transport"].update(DEADLINES, bridge="loopback")
    data["run"]["dir"] = str(tmp_path)
    run_loopback(config_from_dict(data), tmp_path / "run")
    steps = [
        json.loads(line)
        for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
        if '"kind": "step"' in line
    ]
    assert len(steps) == 3
    senders = {key.split("/")[0] for key in steps[-1]["bytes_sent"]}  # "party/method"
    assert senders == {"active"} | {f"passive-{i}" for i in range(1, 41)}  # the parties that sent


def _bench_smoke(tmp_path: Path, bench: str) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    """`vflnet bench BENCH --smoke`, which must succeed: its run and the rows of its --json."""
    out = tmp_path / f"{bench}.json"
    env = {**os.environ, "PYTHONPATH": str(REPO), "VFLNET_QUIET": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "vflnet", "bench", bench, "--smoke", "--json", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result, json.loads(out.read_text())["rows"]


@pytest.mark.e2e
@pytest.mark.slow
def test_bench_scaling_smoke_reports_every_role_at_nine_parties(tmp_path: Path) -> None:
    result, rows = _bench_smoke(tmp_path, "scaling")
    assert sorted({r["K"] for r in rows}) == [1, 2, 9]
    nine = {r["role"].split()[0]: r for r in rows if r["K"] == 9}
    assert nine.keys() == {"coordinator", "active", "passive"}
    for role, row in nine.items():
        assert row["cpu_s"] > 0 and row["cpu_ms_per_step"] is not None and row["cpu_ms_per_step"] > 0, role
        assert 0 < row["peak_pss_mib"] <= row["peak_rss_mib"], role
    # warm processes share the fork server's pages: the sum of PSS is well under the sum of RSS
    assert 0 < nine["active"]["cluster_pss_mib"] < nine["active"]["cluster_rss_mib"]
    assert nine["active"]["fork_server_pss_mib"] > 0
    assert "CPU ms per step per added passive party" in result.stdout


@pytest.mark.e2e
@pytest.mark.slow
def test_bench_secureboost_anchors_smoke_puts_each_anchor_beside_ours(tmp_path: Path) -> None:
    _, rows = _bench_smoke(tmp_path, "secureboost-anchors")
    for name, anchor in ANCHORS.items():
        mine = [r for r in rows if r["anchor"] == name]
        he, plain, xgb, published = mine  # in this order, one each
        assert "Paillier" in he["run"] and "plain" in plain["run"] and "xgboost" in xgb["run"]
        assert he["bytes_per_tree"] > plain["bytes_per_tree"] > 0  # ciphertexts are wider than floats
        assert he["rows"] == plain["rows"] == xgb["rows"] == 400  # --smoke's sizes
        assert "as published" in published["run"] and published["rows"] == anchor.rows
        assert published["seconds_per_tree"] == anchor.published_s_per_tree
        assert (
            published["core_s_per_tree_at_anchor_rows"]
            == anchor.published_s_per_tree * anchor.published_cores
        )
        assert all(r["seconds_per_tree"] > 0 for r in mine)
