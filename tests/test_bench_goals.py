"""`vflnet bench goals --smoke`: one run writes every goal's row, each with a measured value or the
reason it has none, and prints them as one table."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vflnet.tools.bench import BENCHMARKS, goals

SMOKE_TIMEOUT_S = 1100  # a hang guard on a loaded machine, not a speed target
# the ms a tap adds per step: under load a tapped run can come out faster than the untapped one
SIGNED = {goals.TAP_ROW, goals.BARE_TAP_ROW}
# rows that are goals (a limit once measured), not figures shown beside them
GOAL_ROWS = [
    "coordinator: start to serving, warm",
    "passive party: start to serving, warm",
    "make demo's run: overhead (wall - training), warm",
    "make demo's run: overhead (wall - training), resident",
    "dp-label-leak sweep: overhead per run, warm",
    "dp-label-leak sweep: overhead per run, resident",
    "netem 10 ms: median step",
    "netem 50 ms: median step",
    goals.VFLNET_ROW,
    goals.TAP_ROW,
]


@pytest.mark.e2e
@pytest.mark.slow
def test_bench_goals_smoke_writes_every_row_measured_or_why(tmp_path: Path) -> None:
    assert BENCHMARKS["goals"][0] == "vflnet.tools.bench.goals"
    out = tmp_path / "goals.json"
    result = subprocess.run(
        # a prefix of its own: `vflnet bench --smoke` may bring up its own labs beside this test
        [
            sys.executable,
            "-m",
            "vflnet",
            "bench",
            "goals",
            "--smoke",
            "--json",
            str(out),
            "--prefix",
            "goals-test",
        ],
        cwd=tmp_path,
        env={**os.environ, "VFLNET_QUIET": "1"},
        capture_output=True,
        text=True,
        timeout=SMOKE_TIMEOUT_S,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["smoke"] is True and record["cores"] == os.cpu_count()
    rows = record["rows"]
    expected = [figure for _, figures in goals.SECTIONS.values() for figure, _ in figures]
    assert [r["figure"] for r in rows] == expected + [r["figure"] for r in goals.NOT_HERE]
    for row in rows:
        measured = row["measured"]
        if measured is None:  # not measured: the row says why, and claims nothing
            assert row["note"].startswith(("not measured: ", "not run by ")) and row["met"] is None, row
            continue
        assert math.isfinite(measured) and (measured >= 0 or row["figure"] in SIGNED), row
        assert row["load"] != "-", row
        if row["figure"] in GOAL_ROWS:
            assert math.isfinite(row["limit"]) and row["met"] == (measured <= row["limit"]), row
        else:
            assert row["limit"] is None and row["met"] is None, row
    # this machine can measure everything but the netem rows (root and network namespaces)
    assert all(
        r["measured"] is not None for r in rows if r["figure"] in expected and "netem" not in r["figure"]
    )
    assert "| figure | measured | goal | met | load | note |" in result.stdout


def test_no_digits_epochs_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as exit_:
        goals.main(["--transport-epochs", "0"])
    assert exit_.value.code == 2
    err = capsys.readouterr()
    assert "--transport-epochs: at least 1, got 0" in err.err and "load average" not in err.out
